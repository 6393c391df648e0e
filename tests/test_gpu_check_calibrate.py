"""scripts/gpu_check.sh --calibrate, checked on CPU by its dry run: the Multi30k recipe for three models side by side,
one report row each."""
import json

import pytest

from helpers.gpu_check_run import gpu_check, no_machine_paths


@pytest.mark.slow  # three models trained (one epoch of 200 sentences), averaged, decoded and scored by the recipe
def test_calibrate_dry_run_reports_each_model(tmp_path):
    """--calibrate --dry-run: scripts/recipes/multi30k_study.sh on CPU, three runs side by side, one row each with
    its tokenized lowercased BLEU against the literature's 41.0."""
    out = tmp_path / "out"
    proc = gpu_check("--calibrate", "--dry-run", "--out-dir", str(out), timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "gpu_check_calibrate.json").read_text())
    md = (out / "gpu_check_calibrate.md").read_text()
    assert [r["model"] for r in report["rows"]] == ["transformer", "relative", "floater"]
    for r in report["rows"]:
        assert r["status"] == "finished" and 0 <= r["bleu_tok_lc"] <= 100 and r["updates"] >= 1, r
        assert r["delta"] == round(r["bleu_tok_lc"] - 41.0, 2)
        assert f"| {r['model']} | finished | {r['bleu_tok_lc']:.2f} | {r['delta']:+.2f} |" in md
    assert md.startswith("# GPU check, calibration — DRY RUN on CPU")
    no_machine_paths(out, tmp_path)
