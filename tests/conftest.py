"""Shared fixtures: the toy task prepared once per run, and tiny models trained once per run (shared by the
pytest-xdist workers of `make test`: the first to ask builds, the others wait for it and reuse what it built)."""
import fcntl
import json
import os
import shutil
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
# Set in each pytest-xdist worker (gw0, gw1, ...): `make test` runs one worker per core.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    # Workers side by side: one intra-op thread each, for the worker's own torch (read when torch is first
    # imported, after this file) and every process it starts (env() below), so that two workers never ask for
    # more threads than there are cores. Tests that need a thread count set their own.
    os.environ["OMP_NUM_THREADS"] = "1"
# OpenMP threads that wait for each other sleep rather than spin (libgomp spins 300,000 rounds per wait by default).
# Beside a busy core, a spinning two-thread test burnt 7 times its CPU seconds (FLOATER's gradient repeat at two
# threads: 2.9 against 0.4), which the fast tier's clock then counted against the test. Read when torch loads.
os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
TORCH_LOADED_FIRST = "torch" in sys.modules  # then the two variables above came too late for this process

pytest_plugins = ["helpers.tier_clock", "helpers.file_order"]


def load_script(path):
    """A command-line script under scripts/ (e.g. "study/length_probe.py") as a module, for tests of its functions:
    the scripts in scripts/'s folders are not on sys.path (only scripts/, where the tooling library is)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, REPO / "scripts" / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def env():
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e.setdefault("OMP_NUM_THREADS", "2")
    return e


def start_preload_server(folder, environ):
    """A fork server (tests/preload/server.py) that preloads what a process with `environ` imports; its socket and
    its CPU file ("cpu", which the tier clock reads: every such file under this worker's preload folder) in
    `folder`. Returns the socket's path, which exists once the server listens, and the server's process."""
    sock, cpu = os.path.join(folder, "socket"), os.path.join(folder, "cpu")
    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "preload" / "server.py"), sock, cpu],
                              env=environ, stdin=subprocess.DEVNULL, cwd=folder)
    return sock, server


def pytest_configure(config):
    """This worker's fork server (tests/preload/server.py): the fairseq commands and this project's scripts that
    its tests start run forked from an interpreter that already imported torch and fairseq. Started at once, in
    the background: a process that asks before it is ready starts fresh. One per process that runs tests (not
    pytest-xdist's controller: its workers start their own, with their thread settings); none where one is
    inherited (a pytest started by a test); PRELOAD=0: every process starts fresh."""
    if (os.environ.get("PRELOAD", "1") == "0" or "PRELOAD_SOCKET" in os.environ
            or (not WORKER and getattr(config.option, "numprocesses", None))):
        return
    import atexit
    import tempfile

    folder = tempfile.mkdtemp(prefix="preload-")  # short: a socket's path has at most 107 bytes
    os.environ["PYTHONPATH"] += os.pathsep + str(REPO / "tests" / "preload")
    sock, server = start_preload_server(folder, env())
    os.environ["PRELOAD_SOCKET"], os.environ["PRELOAD_CPU_FILE"] = sock, os.path.join(folder, "cpu")

    def stop():
        server.kill()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)
    atexit.register(stop)


# Modules whose tests are about the processes themselves (signals, a cluster's process tracking, set-up from
# nothing, a training killed with its group and resumed at once): every process they start is a fresh interpreter;
# a test can ask the same with @pytest.mark.fresh_processes.
FRESH_MODULES = {"test_slurm", "test_supervise", "test_prep_interrupt", "test_setup_env", "test_gpu_bundle",
                 "test_launchers", "test_resume", "test_submit_paper_faults"}


@pytest.fixture(autouse=True)
def _fresh_processes(request, monkeypatch):
    if _module(request.node) in FRESH_MODULES or request.node.get_closest_marker("fresh_processes"):
        monkeypatch.delenv("PRELOAD_SOCKET", raising=False)


def shared_root(tmp_path_factory):
    """The folder that every worker of this run sees: under pytest-xdist the parent of each worker's basetemp
    (one per run), else this session's basetemp."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if WORKER else base


def built_once(tmp_path_factory, name, build):
    """shared_root()/name, filled by build(folder) once per run. A worker that asks while another builds it waits
    on the lock, then reuses it. The .done marker is written last: a build that failed half-way is redone, never
    reused."""
    root = shared_root(tmp_path_factory)
    out, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when build fails
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            build(out)
            done.touch()
    return out


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
    """The embedded toy task (default sizes), sentencepiece-encoded and binarized, once per run."""
    def build(out):
        run([sys.executable, "scripts/make_toy_data.py", "--out", str(out / "raw")])
        run(["bash", "scripts/prepare_bitext.sh", str(out / "raw"), str(out), "src", "tgt", "400", "test_long"])
    return built_once(tmp_path_factory, "toy", build)


class ToyModels:
    """Trains each arch once per run with the demo recipe (scripts/train_small.sh), and evaluates each
    checkpoint once per split with scripts/generate.sh; the workers of a run share both."""

    def __init__(self, data, tmp_path_factory):
        self.data, self.factory = data, tmp_path_factory

    def checkpoint(self, arch, *extra, epochs=TOY_EPOCHS):
        name = "toy_models/" + "_".join(str(a).strip("-").replace("-", "") for a in (arch, epochs) + extra)
        (shared_root(self.factory) / "toy_models").mkdir(exist_ok=True)
        save = built_once(self.factory, name, lambda save: run(
            ["bash", "scripts/train_small.sh", str(self.data / "bin"), str(save), arch, *extra],
            env_extra={"EPOCHS": str(epochs)}))
        return save / "checkpoint_best.pt"

    def evaluate(self, checkpoint, subset="test"):
        """(result JSON, detokenized hypotheses) of beam-4 generation on a toy split."""
        name = f"{checkpoint.parent.relative_to(shared_root(self.factory))}/{subset}"
        out = built_once(self.factory, name, lambda out: run(
            ["bash", "scripts/generate.sh", str(self.data), str(checkpoint), subset, str(out / "result.json")]))
        hyps = (out / "result.hyp").read_text(encoding="utf-8").splitlines()
        return json.loads((out / "result.json").read_text()), hyps


@pytest.fixture(scope="session")
def toy_models(toy_data, tmp_path_factory):
    return ToyModels(toy_data, tmp_path_factory)


# Test tiers: `slow` marks what trains models end to end or runs a pipeline for minutes (the toy task's trained
# models, the study and demo scripts, several processes); `pytest -m "not slow"` is the few-minute loop and
# `make test` runs everything. A module is slow as a whole, a test by its own mark or by the fixtures it asks for,
# and a `matrix` test (every model x every precision mode, ...) is slow off its diagonal: the fast loop still
# sees every model and every mode, once each.
SLOW_MODULES = {"test_pipeline", "test_learning", "test_hub", "test_multi30k_study", "test_multi30k_study_schemes",
                "test_multi30k_study_train_short", "test_multi30k_study_retrain", "test_multi30k_smoke",
                "test_resume", "test_distributed", "test_slurm", "test_launchers", "test_precision_decode",
                "test_gpu_check", "test_wmt_pipeline", "test_floater_reproducibility", "test_evaluate",
                "test_prep_interrupt", "test_own_fairseq"}
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


# The costliest files first, by their CPU seconds in make test (2-core machine, 2026-11-26: 229 for the study's
# file down to 47; test_slurm by its wall seconds, mostly waiting on the cluster), longest first: pytest-xdist's
# loadfile hands out whole files in collection order (not sorted by their number of tests, its default:
# helpers/file_order.py), the next file to the first worker with two tests or fewer left, so a long file collected
# last runs alone at the end while the other worker idles. The files that share a fixture built once per run are
# far enough apart that neither waits on the other's lock: the study's first run (study, then study_schemes) and
# the toy task's three demo models, all trained by test_hub, first (test_precision_decode, test_learning and
# test_source_dependence read them well after; when test_pipeline's learning test trained the Transformer while
# test_hub trained the others, test_hub waited 68 s of one core on it).
COSTLIEST_FIRST = ("test_hub", "test_multi30k_study", "test_multi30k_study_schemes",
                   "test_multi30k_study_train_short", "test_own_fairseq", "test_distributed", "test_pipeline",
                   "test_campaign", "test_precision", "test_adam_impl", "test_floater_cuda_graph", "test_fairseq_patch",
                   "test_gpu_bundle", "test_slurm", "test_submit_paper", "test_multi30k_study_retrain", "test_multi30k_smoke",
                   "test_precision_decode", "test_bad_input", "test_readme", "test_learning", "test_position_schemes",
                   "test_configs", "test_launchers", "test_gpu_check")


def _module(item):
    return item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else ""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if (_module(item) in SLOW_MODULES or SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
                or (item.get_closest_marker("matrix") and not on_the_diagonal(item))):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(COSTLIEST_FIRST)}
    items.sort(key=lambda item: rank.get(_module(item), len(rank)))  # stable: each file keeps its own order

