"""Shared fixtures: the toy task prepared once per session, and tiny models trained once per session."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# This checkout's code first, in the tests and in every process they start: a venv shared with another checkout
# imports that checkout's fairseq_plugins (its .pth), and fairseq then refuses this one's --user-dir as "not
# globally unique".
for _path in (REPO / "scripts", REPO):
    if str(_path) in sys.path:
        sys.path.remove(str(_path))
    sys.path.insert(0, str(_path))
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "scripts")]
                                           + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
SHARED_DATA = REPO.parent / "shared" / "data"
BIN = Path(sys.executable).parent  # the venv's bin: fairseq-train & co.
# Training budget for the "learns the toy task" tests and fixtures: same for every arch.
TOY_EPOCHS = int(os.environ.get("TOY_EPOCHS", "12"))


def env():
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e.setdefault("OMP_NUM_THREADS", "2")
    return e


def run(cmd, check=True, env_extra=None, **kw):
    """Run a command (list or shell string) from the repo root with the venv on PATH (plus env_extra);
    on failure, fail the test with the tail of its output."""
    kw.setdefault("cwd", REPO)
    proc = subprocess.run(cmd, shell=isinstance(cmd, str), env={**env(), **(env_extra or {})}, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)
    if check and proc.returncode != 0:
        pytest.fail(f"command failed ({proc.returncode}): {cmd}\n{proc.stdout[-3000:]}")
    return proc


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory):
    """The embedded toy task (default sizes), sentencepiece-encoded and binarized."""
    out = tmp_path_factory.mktemp("toy")
    run([sys.executable, "scripts/make_toy_data.py", "--out", str(out / "raw")])
    run(["bash", "scripts/prepare_bitext.sh", str(out / "raw"), str(out), "src", "tgt", "400", "test_long"])
    return out


class ToyModels:
    """Trains each arch once per session with the demo recipe (scripts/train_small.sh), and evaluates each
    checkpoint once per split with scripts/generate.sh."""

    def __init__(self, data, root):
        self.data, self.root, self.done, self.evals = data, root, {}, {}

    def checkpoint(self, arch, *extra, epochs=TOY_EPOCHS):
        key = (arch, epochs) + extra
        if key not in self.done:
            save = self.root / "_".join(str(a).strip("-").replace("-", "") for a in key)
            run(["bash", "scripts/train_small.sh", str(self.data / "bin"), str(save), arch, *extra],
                env_extra={"EPOCHS": str(epochs)})
            self.done[key] = save / "checkpoint_best.pt"
        return self.done[key]

    def evaluate(self, checkpoint, subset="test"):
        """(result JSON, detokenized hypotheses) of beam-4 generation on a toy split."""
        key = (checkpoint, subset)
        if key not in self.evals:
            out = checkpoint.parent / f"{subset}.json"
            run(["bash", "scripts/generate.sh", str(self.data), str(checkpoint), subset, str(out)])
            hyps = out.with_suffix(".hyp").read_text(encoding="utf-8").splitlines()
            self.evals[key] = (json.loads(out.read_text()), hyps)
        return self.evals[key]


@pytest.fixture(scope="session")
def toy_models(toy_data, tmp_path_factory):
    return ToyModels(toy_data, tmp_path_factory.mktemp("toy_models"))


# Test tiers: `slow` marks what trains models end to end or runs a pipeline for minutes (the toy task's trained
# models, the study and demo scripts, several processes); `pytest -m "not slow"` is the few-minute loop and
# `make test` runs everything. A module is slow as a whole, a test by its own mark or by the fixtures it asks for,
# and a `matrix` test (every model x every precision mode, ...) is slow off its diagonal: the fast loop still
# sees every model and every mode, once each.
SLOW_MODULES = {"test_pipeline", "test_learning", "test_hub", "test_multi30k_study", "test_multi30k_smoke",
                "test_resume", "test_distributed", "test_slurm", "test_launchers", "test_precision_decode",
                "test_gpu_check", "test_wmt_pipeline", "test_floater_reproducibility", "test_evaluate",
                "test_prep_interrupt"}
SLOW_FIXTURES = {"toy_models", "toy_data"}


PARAM = type(pytest.param(None))


def on_the_diagonal(item):
    """Whether a case of a parametrized product is on its diagonal: with L the longest axis, the case whose index
    on every axis is its index on L modulo that axis's size (len(L) cases: each value of each axis at least once)."""
    index, sizes = {}, {}
    for mark in item.iter_markers("parametrize"):
        names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) else list(mark.args[0])
        # an axis of several names is indexed by its first name's value, found by identity (values may repeat)
        values = [v.values[0] if isinstance(v, PARAM) else v[0] if len(names) > 1 else v for v in mark.args[1]]
        index[names[0]] = next(k for k, v in enumerate(values) if v is item.callspec.params[names[0]])
        sizes[names[0]] = len(values)
    longest = max(sizes, key=sizes.get)
    return all(index[name] == index[longest] % size for name, size in sizes.items())


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else ""
        if (module in SLOW_MODULES or SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
                or (item.get_closest_marker("matrix") and not on_the_diagonal(item))):
            item.add_marker(pytest.mark.slow)
