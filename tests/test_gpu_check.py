"""scripts/gpu_check.sh, the one command for a machine with a GPU, checked on CPU as far as it goes: its dry run
(CUDA graphs through the CPU emulation, the smallest sizes) writes every section of the report, and the graph
path's gradients there are the loop's; without a GPU and without --dry-run it refuses in one line."""
import json
import subprocess

import pytest
import torch

from conftest import REPO, env
from helpers.small_task import small_data


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


def test_dry_run_writes_every_section(data, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", "--out-dir", str(out), "--data",
                           str(data / "bin")], cwd=REPO, env={**env(), "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "gpu_check.md").read_text()
    report = json.loads((out / "gpu_check.json").read_text())
    assert md.startswith("# GPU check — DRY RUN on CPU")
    for heading in ("## 1. FLOATER's CUDA-graph solve against the loop", "## 2. Every arch × precision",
                    "## 3. Benchmark"):
        assert heading in md
    assert report["solve"] and all(r["values"] < 1e-6 and r["gradients"] < 1e-6 for r in report["solve"])
    assert report["trainer"] and all(r["gradient_error"] < 1e-6 and r["updates"] >= 1 and r["captured_buckets"] > 0
                                     for r in report["trainer"]), report["trainer"]
    assert {(r["arch"], r["mode"]) for r in report["precision"]} == {
        (a, m) for a in ("transformer_tiny", "rope_transformer_tiny") for m in ("fp32", "bf16")}
    assert all(r["ok"] and r["sentences"] > 0 and r["train_loss"] is not None for r in report["precision"]), \
        report["precision"]
    assert report["bench"]["ok"], report["bench"]
    assert (out / "gpu_check_bench.md").exists()
    for text in (md, (out / "gpu_check.json").read_text()):  # no path of this machine in what gets committed
        for path in (str(REPO), str(tmp_path), "/tmp/", "/home/"):
            assert path not in text, path
    assert not list(out.glob(".*"))  # no temporary file left
    assert "## Verdict" in md and report["verdicts"] and all(v["passed"] for v in report["verdicts"])


def test_a_check_out_of_bounds_fails_the_run():
    """The verdict table and the exit status: a graph gradient off by 1% in float32, or a graph path that never
    captured, fails; the same report within bounds passes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    report = {"solve": [{"positions": 21, "values": 0.0, "gradients": 1e-7}],
              "trainer": [{"mode": "fp32", "update_freq": 3, "gradient_error": 1e-8, "captured_buckets": 2}],
              "memory": [{"graph": True, "length": 32, "held_by_graphs_mib": 10.0, "predicted_tape_mib": 9.0}],
              "precision": [{"ok": True, "train_loss": 5.0, "fp32_loss": 5.1}], "bench": {"ok": True}}
    assert all(v["passed"] for v in gpu_check.verdicts(report))
    for broken in ({"gradient_error": 1e-2}, {"captured_buckets": 0}):
        bad = {**report, "trainer": [{**report["trainer"][0], **broken}]}
        assert [v["check"] for v in gpu_check.verdicts(bad) if not v["passed"]] == [
            "Trainer fp32, --update-freq 3: gradient, graph vs loop"]
    bad = {**report, "precision": [{"ok": True, "train_loss": 8.0, "fp32_loss": 5.0}]}
    assert not gpu_check.verdicts(bad)[-2]["passed"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_a_gpu_it_refuses_in_one_line(tmp_path):
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--out-dir", str(tmp_path / "out")], cwd=REPO,
                          env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "scripts/gpu_check.sh: no CUDA device; use --dry-run to check the script on CPU"]
    assert not (tmp_path / "out").exists()
