"""scripts/study/multi30k_study.sh takes any model of the table of schemes by name, and tabulates every finished
run (TABLES_ONLY=1; a run of one model into a shared directory)."""
import json
import re

from helpers.study_corpus import corpus, first_run, start_from, study  # noqa: F401  (fixtures)


def test_any_scheme_of_the_table_runs_by_name(corpus, first_run, tmp_path):
    """MODELS takes every model name of the table of schemes (fairseq_plugins/schemes.py): its
    _tiny architecture with the table's flags, and a claim row against the Transformer."""
    start_from(first_run, tmp_path)  # the shared run of the transformer (seed 1): it is skipped here
    study(corpus, tmp_path, MODELS="transformer rope learned", SEEDS="1", PROBE="0")  # the probe: test_multi30k_study
    runs = tmp_path / "results" / "runs"
    assert json.loads((runs / "rope.seed1.json").read_text())["arch"] == "rope_transformer_tiny"
    learned = tmp_path / "ckpt" / "learned.seed1" / "train.log"
    assert "encoder_learned_pos=True" in learned.read_text(encoding="utf-8").replace("'encoder_learned_pos': True",
                                                                                    "encoder_learned_pos=True")
    table = (tmp_path / "results" / "table.md").read_text(encoding="utf-8")
    assert "| rope > sinusoidal (Su et al., RoFormer" in table and "| learned > sinusoidal (Gehring" in table

    # TABLES_ONLY=1: the table of more models from the finished runs, nothing trained (a model asked for
    # without a run is listed as missing, the finished runs' rows are unchanged)
    out = study(corpus, tmp_path, MODELS="transformer rope learned nope", SEEDS="1", TABLES_ONLY="1").stdout
    assert ": training " not in out and not (tmp_path / "ckpt" / "nope.seed1").exists()
    wider = (tmp_path / "results" / "table.md").read_text(encoding="utf-8")
    assert "| nope | 0/1 | – | – |" in wider and "PARTIAL: 3 of 4 runs done" in wider
    for row in table.splitlines():
        if row.startswith(("| transformer", "| rope", "| learned")):
            assert row in wider

    # a run of one model into the shared directory (here: done, so skipped) tabulates every finished run, not
    # its MODELS alone; in one order whoever ran last (the recipe's models, then the table of schemes')
    out = study(corpus, tmp_path, MODELS="rope", SEEDS="1", PROBE="0").stdout
    assert ": skipped (done" in out and ": training " not in out
    alone = (tmp_path / "results" / "table.md").read_text(encoding="utf-8")
    assert "PARTIAL" not in alone
    assert [r.split(" | ")[0] for r in alone.splitlines() if re.match(r"\| \w+ \| \d+/\d+ \|", r)] == [
        "| transformer", "| learned", "| rope"]
    for row in table.splitlines():
        if row.startswith(("| transformer", "| rope", "| learned")):
            assert row in alone
    # PARTIAL counts against every model with a run (and the seeds asked for)
    study(corpus, tmp_path, MODELS="rope", SEEDS="1 2", TABLES_ONLY="1")
    assert "**PARTIAL: 3 of 6 runs done** (seeds done: transformer 1/2, learned 1/2, rope 1/2)" in (
        tmp_path / "results" / "table.md").read_text(encoding="utf-8")

    # a model run at more seeds than the others (FLOATER's own share at 5 seeds): each model is expected at the
    # seeds asked for and at its own, not at every other model's, so the others' rows stay complete
    extra = json.loads((runs / "transformer.seed1.json").read_text())
    (runs / "transformer.seed2.hyp").write_text((runs / "transformer.seed1.hyp").read_text())
    (runs / "transformer.seed2.json").write_text(json.dumps({**extra, "seed": 2, "hypotheses": "transformer.seed2.hyp"}))
    study(corpus, tmp_path, MODELS="rope", SEEDS="1", TABLES_ONLY="1")
    more = (tmp_path / "results" / "table.md").read_text(encoding="utf-8")
    assert "PARTIAL" not in more
    assert {r.split(" | ")[0]: r.split(" | ")[1] for r in more.splitlines() if re.match(r"\| \w+ \| \d+/\d+ \|", r)} == {
        "| transformer": "2/2", "| learned": "1/1", "| rope": "1/1"}


def test_floater_authors_is_floater_with_the_wmt14_authors_flags(corpus, first_run, tmp_path):
    """MODELS=floater_authors: FLOATER from scratch as its authors' code trains it, with the flags of the WMT14
    scheme configs/scheme/floater_all_authors.yaml at a base recipe's update_freq 1 (the re-solve every 400
    updates); its claim row puts this project's default against it."""
    import yaml

    from conftest import REPO

    start_from(first_run, tmp_path)
    study(corpus, tmp_path, MODELS="transformer floater_authors", SEEDS="1", PROBE="0")
    run = json.loads((tmp_path / "results" / "runs" / "floater_authors.seed1.json").read_text())
    assert run["arch"] == "floater_transformer_tiny"
    log = (tmp_path / "ckpt" / "floater_authors.seed1" / "train.log").read_text(encoding="utf-8")
    flags = {}
    for part in ("scheme/floater_all_authors.yaml", "wmt14/model/floater_authors_base.yaml"):
        flags.update(yaml.safe_load((REPO / "configs" / part).read_text(encoding="utf-8"))["model"])
    assert set(flags) == {"floater_dt", "floater_adjoint", "floater_cache_whole_bias", "floater_flow_init",
                          "floater_update_every"}
    for key, value in flags.items():
        assert f"{key}={value!r}" in log or f"'{key}': {value!r}" in log, key
    table = (tmp_path / "results" / "table.md").read_text(encoding="utf-8")
    assert "| floater_authors | 1/1 |" in table
