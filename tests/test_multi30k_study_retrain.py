"""scripts/study/multi30k_study.sh across sessions: a fine-tune whose transformer's checkpoints are gone trains that
transformer again (its own file: the study's tests are split so that the two workers of make test share them)."""
import json
import os
import shutil

import pytest

from helpers.study_corpus import corpus, first_run, start_from, study  # noqa: F401  (fixtures)

from tooling import bootstrap
from tooling.study.plan import decide


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


def test_a_finished_run_without_its_probe_or_checkpoints_is_trained_again_to_probe_it(corpus, first_run, tmp_path):
    """A run that finished before the length probe existed, on a machine whose checkpoints are gone: skipped and
    saying why, until PROBE_RETRAIN=1 trains it again with the recorded command and probes that. The recorded
    result stays, no retrained result is written (that one is what fine-tunes are compared with), and the probe and
    its table say the probe is of a run trained again and how its test hypotheses compare with the record's."""
    start_from(first_run, tmp_path)
    runs = tmp_path / "results" / "runs"
    probed = json.loads((runs / "transformer.seed1.probe.json").read_text())
    (runs / "transformer.seed1.probe.json").unlink()
    (runs / "transformer.seed1.probe.hyp").unlink()
    recorded = (runs / "transformer.seed1.json").read_text()
    shutil.rmtree(tmp_path / "ckpt")

    out = study(corpus, tmp_path, MODELS="transformer", SEEDS="1", JOBS="1").stdout
    assert "== transformer.seed1: skipped (done: " in out and "PROBE_RETRAIN=1 trains it again" in out, out
    assert not (runs / "transformer.seed1.probe.json").exists() and ": training " not in out

    out = study(corpus, tmp_path, MODELS="transformer", SEEDS="1", JOBS="1", PROBE_RETRAIN="1").stdout
    assert "trained again with the same command to probe it" in out and "== transformer.seed1: training " in out
    n_test = len((corpus / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines())
    again = json.loads((runs / "transformer.seed1.probe.json").read_text())
    # single-threaded CPU training is deterministic: the same run, so the same probe as the record's own
    assert again["trained_again"].startswith(f"trained again: {n_test} of {n_test} test hypotheses identical")
    assert again["buckets"] == probed["buckets"]
    assert (runs / "transformer.seed1.json").read_text() == recorded, "the recorded result stays"
    assert not (runs / "transformer.seed1.retrained.json").exists()
    ckpt = tmp_path / "ckpt" / "transformer.seed1"
    assert (ckpt / "reprobe.txt").read_text().strip() == again["trained_again"] and not (ckpt / "retrain.txt").exists()
    table = (tmp_path / "results" / "probe_table.md").read_text(encoding="utf-8")
    assert "Probed after training again with the recorded command" in table and again["trained_again"] in table

    # a rerun neither trains nor probes again
    out = study(corpus, tmp_path, MODELS="transformer", SEEDS="1", JOBS="1", PROBE_RETRAIN="1").stdout
    assert "== transformer.seed1: skipped (done: " in out and ": training " not in out


def finished(out, run_dir, model, recipe="r", test_json_age=None, average=False, note=None, probed=False):
    """A finished run's files as decide() reads them: its result (and probe) in out/runs, in run_dir its test.json
    test_json_age seconds older than the result (negative: newer, a retraining's), average.pt, a retrain note."""
    (out / "runs").mkdir(parents=True, exist_ok=True)
    result = out / "runs" / f"{model}.seed1.json"
    result.write_text(json.dumps({"recipe": recipe}))
    if probed:
        (out / "runs" / f"{model}.seed1.probe.json").write_text("{}")
    run_dir.mkdir(parents=True, exist_ok=True)
    if test_json_age is not None:
        (run_dir / "test.json").write_text("{}")
        t = result.stat().st_mtime - test_json_age
        os.utime(run_dir / "test.json", (t, t))
    if average:
        (run_dir / "average.pt").write_bytes(b"x")
    if note:
        (run_dir / note).write_text("trained again\n")


@pytest.mark.parametrize("state, probe, retrain, expected", [
    ({"test_json_age": 60, "average": True}, True, False, "probe"),  # trained here: its own checkpoint is probed
    ({"test_json_age": 60, "average": True, "probed": True}, True, True, "skip"),
    ({"test_json_age": 60, "average": True}, False, True, "skip"),  # PROBE=0
    ({}, True, False, "unprobed"),  # checkpoints gone
    ({}, True, True, "reprobe"),
    ({"test_json_age": 60}, True, True, "reprobe"),  # test.json without average.pt: nothing to probe
    # a retraining's checkpoint (its test.json is newer than the result) is not the recorded run's
    ({"test_json_age": -60, "average": True}, True, False, "unprobed"),
    ({"test_json_age": -60, "average": True}, True, True, "reprobe"),
    ({"test_json_age": 60, "average": True, "note": "retrain.txt"}, True, True, "reprobe"),
])
def test_decide_probes_only_the_recorded_runs_checkpoint(tmp_path, state, probe, retrain, expected):
    finished(tmp_path / "out", tmp_path / "ckpt" / "relative.seed1", "relative", **state)
    assert decide("relative", 1, ["relative"], str(tmp_path / "out"), str(tmp_path / "ckpt" / "relative.seed1"), "r",
                  probe=probe, probe_retrain=retrain) == expected


@pytest.mark.parametrize("retrain", [False, True])
def test_decide_never_trains_a_fine_tune_again_for_its_probe(tmp_path, retrain):
    """A fine-tune trained again would continue a transformer trained again, not the one it continued."""
    out, models = tmp_path / "out", ["transformer", "floater_warm"]
    finished(out, tmp_path / "ckpt" / "transformer.seed1", "transformer", probed=True)
    finished(out, tmp_path / "ckpt" / "floater_warm.seed1", "floater_warm")
    assert decide("floater_warm", 1, models, str(out), str(tmp_path / "ckpt" / "floater_warm.seed1"), "r",
                  probe=True, probe_retrain=retrain) == "unprobed-fine-tune"
