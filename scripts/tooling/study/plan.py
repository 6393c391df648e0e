"""The Multi30k study's decisions (scripts/study/study.py plan, decide): which runs, in which order (`plan`: from
scratch first, then the fine-tunes of a trained transformer), and what to do with each (`decide`: run, skip, probe
a finished run, or train a finished run again because its checkpoints are not on this machine and a fine-tune of
its seed or its length probe needs them; a result made with another recipe is an error).
"""
import json
import os

from tooling.study.runs import fail

FINE_TUNES = ("floater_warm", "transformer_ft")  # continue the same seed's trained transformer


def plan(models, seeds):
    """[(phase, model, seed)]: every run trained from scratch, then ("warm") those that continue a transformer,
    which must all have finished first."""
    return [(phase, m, s) for phase in ("scratch", "warm") for m in models
            if (m in FINE_TUNES) == (phase == "warm") for s in seeds]


def recorded_recipe(result):
    try:
        with open(result, encoding="utf-8") as f:
            return json.load(f).get("recipe")
    except (OSError, ValueError) as err:
        fail(f"{result}: not a run result ({err})")


def decide(model, seed, models, out, run_dir, recipe, probe=False, probe_retrain=False):
    """What one (model, seed) of the study needs: "run" (train, resuming if it started), "skip" (its result
    exists), or "retrain": a finished transformer whose checkpoints are not on this machine (they stay on the one
    that trained it) while a fine-tune of its seed is still to run; it is trained again with the same command and
    its recorded result kept. Its test.json tells: older than the result, trained here; newer with no
    retrain.txt yet, a retraining that has not finished.

    With probe (the recipe's PROBE=1), a finished run without its length probe: "probe" when the checkpoint here
    is the recorded run's (trained here: its test.json is older than the result), else "reprobe" with
    probe_retrain (train it again with the same command, resuming, and probe that; the recorded result is kept)
    or "unprobed" (skipped, and the recipe says why). A fine-tune is not trained again for its probe: it would
    continue a transformer trained again, not the one it continued ("unprobed-fine-tune")."""
    def done(path):
        return os.path.isfile(path) and os.path.getsize(path) > 0

    result = os.path.join(out, "runs", f"{model}.seed{seed}.json")
    if not done(result):
        return "run"
    if recorded_recipe(result) != recipe:
        fail(f"{result} was made with another recipe; remove it (and its checkpoints) to run it again")
    pending = any(not done(os.path.join(out, "runs", f"{m}.seed{seed}.json")) for m in models if m in FINE_TUNES)
    test_json = os.path.join(run_dir, "test.json")
    retrained = done(os.path.join(run_dir, "retrain.txt"))
    # a test.json newer than the result is a later training's (finished once retrain.txt exists)
    tested_after = done(test_json) and os.path.getmtime(test_json) > os.path.getmtime(result)
    if model == "transformer" and pending and (not done(test_json) or (tested_after and not retrained)):
        return "retrain"
    if not probe or done(os.path.join(out, "runs", f"{model}.seed{seed}.probe.json")):
        return "skip"
    trained_here = done(test_json) and not tested_after and not retrained
    if trained_here and done(os.path.join(run_dir, "average.pt")):
        return "probe"
    if model in FINE_TUNES:
        return "unprobed-fine-tune"
    return "reprobe" if probe_retrain else "unprobed"
