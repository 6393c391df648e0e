"""scripts/recipes/multi30k_study.sh across sessions: a fine-tune whose transformer's checkpoints are gone trains that
transformer again (its own file: the study's tests are split so that the two workers of make test share them)."""
import json
import shutil

import pytest

from helpers.study_corpus import corpus, first_run, start_from, study  # noqa: F401  (fixtures)

from tooling import bootstrap


def test_a_later_session_trains_a_lost_transformer_again_for_its_fine_tune(corpus, first_run, tmp_path):
    """Checkpoints stay on the machine that trained them. In a new session (no checkpoints, the results kept) a
    fine-tune still to run needs its seed's transformer: the script trains it again with the same command, keeps
    the recorded result, and the fine-tune records how the retrained transformer compares with it."""
    start_from(first_run, tmp_path)  # study(corpus, tmp_path, MODELS="transformer", SEEDS="1", JOBS="1"), shared
    runs = tmp_path / "results" / "runs"
    # the record as another machine made it: same command, other BLEU (floating point differs between CPUs)
    record = json.loads((runs / "transformer.seed1.json").read_text())
    record["bleu"], record["bleu_tok_lc"] = record["bleu"] + 7.0, record["bleu_tok_lc"] + 7.0
    (runs / "transformer.seed1.json").write_text(json.dumps(record))
    recorded = (runs / "transformer.seed1.json").read_text()
    shutil.rmtree(tmp_path / "ckpt")  # the new machine

    # PROBE=0: the probe is test_multi30k_study.py's; here it would only cost a decoding per run
    out = study(corpus, tmp_path, MODELS="transformer transformer_ft", SEEDS="1", JOBS="1", PROBE="0").stdout
    assert "its checkpoints are not here and its fine-tunes need them" in out
    ckpt = tmp_path / "ckpt" / "transformer.seed1"
    # single-threaded CPU training is deterministic: the same run, hypothesis for hypothesis
    n_test = len((corpus / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines())
    note = (ckpt / "retrain.txt").read_text(encoding="utf-8").strip()
    assert note.startswith(f"trained again: {n_test} of {n_test} test hypotheses identical"), note
    assert (runs / "transformer.seed1.json").read_text() == recorded, "the recorded result stays"
    ft = json.loads((runs / "transformer_ft.seed1.json").read_text())
    assert ft["source"] == note
    # the fine-tune is compared with the run it continued, not with the record
    again = json.loads((runs / "transformer.seed1.retrained.json").read_text())
    assert again["bleu_tok_lc"] == pytest.approx(record["bleu_tok_lc"] - 7.0)
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    vs = summary["models"]["transformer_ft"]["vs_transformer"]
    assert vs["delta"]["bleu_tok_lc"] == pytest.approx(ft["bleu_tok_lc"] - again["bleu_tok_lc"])
    assert vs["retrained_seeds"] == [1]
    one = vs["bootstrap"]["bleu_tok_lc"]  # one seed: no variance over seeds to speak of
    assert one["ci"] is None and one["p"] is None and one["note"] == bootstrap.ONE_SEED
    assert one["effect"] == pytest.approx(vs["delta"]["bleu_tok_lc"], abs=0.01)
    assert summary["models"]["transformer"]["bleu_tok_lc"] == [record["bleu_tok_lc"]], "the record's own row stays"
    assert "| transformer seed 1, trained again (the run its fine-tunes continued) |" in (
        tmp_path / "results" / "table.md").read_text()

    # a rerun trains neither again
    again = study(corpus, tmp_path, MODELS="transformer transformer_ft", SEEDS="1", JOBS="1", PROBE="0").stdout
    assert again.count(": skipped (done") == 2 and ": training " not in again
