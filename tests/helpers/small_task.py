"""A small toy corpus and a fast CPU training command, shared by the reliability tests (resume, distributed,
data-prep interruption, bad input, checkpoint safety). Kept small so that each training run takes seconds."""
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from conftest import BIN, REPO, built_once, env, run

# make_toy_data.py sizes: ~600 pairs of 3-20 words -> ~40 updates of --max-tokens 512 per epoch.
TOY_SIZES = ["--train", "600", "--valid", "40", "--test", "40", "--test-long", "8", "--seed", "7"]
VOCAB = "200"
# Every process these tests start runs one intra-op thread: on a small shared machine two OpenMP threads per
# process slow tiny models down many times over, and bit-for-bit comparisons need one fixed thread count (a
# multi-threaded CPU kernel splits its sums by thread).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
_CACHE = {}


def small_raw(root):
    """Writes the small toy corpus into root (deterministic); returns root."""
    run([sys.executable, "scripts/make_toy_data.py", "--out", str(root), *TOY_SIZES])
    return root


def small_data(tmp_path_factory):
    """The small toy corpus prepared by scripts/prepare_bitext.sh, once per run (the workers share it)."""
    if "data" not in _CACHE:
        def build(out):
            small_raw(out / "raw")
            run1(["bash", "scripts/prepare_bitext.sh", str(out / "raw"), str(out), "src", "tgt", VOCAB])
        _CACHE["data"] = built_once(tmp_path_factory, "small_toy", build)
    return _CACHE["data"]


def train_cmd(data, save_dir, arch, *extra, max_update=12, seed=1):
    """fairseq-train on the small corpus: the demo recipe (scripts/train_small.sh) with small batches, a short
    warm-up and no dropout by default (callers add --dropout where they want randomness)."""
    return [str(BIN / "fairseq-train"), str(data / "bin"), "--user-dir", "fairseq_plugins", "--arch", arch,
            "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "2e-3",
            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0",
            "--max-tokens", "512", "--max-update", str(max_update), "--seed", str(seed),
            "--cpu", "--num-workers", "0", "--save-dir", str(save_dir), "--no-epoch-checkpoints",
            "--log-format", "simple", "--log-interval", "1", *extra]


def run1(cmd, check=True):
    """conftest.run with one thread (ONE_THREAD)."""
    return run(cmd, check=check, env_extra=ONE_THREAD)


def last_valid_loss(log):
    """The last 'valid on 'valid' subset | loss X' figure of a fairseq-train log, as printed (3 decimals)."""
    losses = re.findall(r"valid on 'valid' subset \| loss ([0-9.]+)", log)
    assert losses, log[-2000:]
    return losses[-1]


def load(path):
    """A checkpoint through fairseq's own loader (the patched, weights_only one)."""
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(str(path))


def assert_same_model(a, b, rtol=0.0):
    """Two checkpoints hold bit-identical model parameters and buffers (rtol > 0: each tensor within rtol,
    relative to its norm), and the same update count."""
    sa, sb = load(a), load(b)
    assert sa["model"].keys() == sb["model"].keys()

    def same(x, y):
        if not rtol or not x.is_floating_point():
            return torch.equal(x, y)
        return float((x.double() - y.double()).norm()) <= rtol * float(y.double().norm())

    # fairseq's SinusoidalPositionalEmbedding._float_tensor is torch.FloatTensor(1): uninitialised memory that
    # only marks dtype and device, so its value is arbitrary
    differ = [k for k in sa["model"] if not k.endswith("._float_tensor") and not same(sa["model"][k], sb["model"][k])]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[:3]}"
    assert (sa["optimizer_history"][-1]["num_updates"] == sb["optimizer_history"][-1]["num_updates"])


def start(cmd, log_path):
    """Start a command (one thread) in its own process group, so that it and its children can be killed
    together; stdout and stderr into log_path. A process that dies of a signal (an abort in C++ code) writes
    every thread's Python stack to the log first (PYTHONFAULTHANDLER)."""
    with open(log_path, "w") as log:  # unbuffered: the log shows what the process did up to the kill
        extra = {**ONE_THREAD, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
        return subprocess.Popen(cmd, cwd=REPO, env={**env(), **extra}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, text=True)


def wait_for(predicate, proc, timeout=300, what="condition"):
    """Poll predicate() every 20 ms until true; fail if the process ends first or the timeout passes."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"process ended ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            kill_group(proc)
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def kill_group(proc):
    """SIGKILL the process group started by start() and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# Ports handed to the processes a test starts (gloo rendezvous, slurmctld, slurmd). Never from the kernel's
# ephemeral range: a port found free there and released can be taken, before the test's process binds it, by any
# outgoing connection or gloo listener of the other xdist worker (seen in CI: a Slurm job's rank 1 reached a
# foreign listener, "TCPStore ... Failed to recv, got 0 bytes"). Below the range, only an explicit bind takes a
# port; each xdist worker draws from its own slice, each call a new port; 20000 and up stays clear of fairseq's
# own random 10000-20000 rendezvous port.
PORT_FLOOR = 20000
_next_port = None  # this worker's next port to try, once free_port has been called


def ephemeral_range():
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default (macOS's 49152-65535 lies above its low end)
    return low, high


def port_slice(worker=None, workers=None):
    """[start, stop) of the ports this xdist worker hands out: its share of PORT_FLOOR..ephemeral low (empty where
    the kernel's range starts at or below PORT_FLOOR)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0") if worker is None else worker
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) if workers is None else workers
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = max(ephemeral_range()[0] - PORT_FLOOR, 0) // max(workers, 1)
    return PORT_FLOOR + index * width, PORT_FLOOR + (index + 1) * width


def free_port():
    """A port no one holds now, outside the ephemeral range, never handed out before in this worker."""
    global _next_port
    start, stop = port_slice()
    if stop == start:  # a kernel that lends every port out: only its own choice is left
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    if _next_port is None:
        # several pytest sessions side by side start at different places of the slice
        _next_port = start + os.getpid() % (stop - start)
    for _ in range(stop - start):
        port, _next_port = _next_port, start + (_next_port + 1 - start) % (stop - start)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}-{stop - 1}")


def two_ranks(data, save, arch, *extra, log_prefix, max_update, timeout=600, wrap=lambda cmd: cmd):
    """fairseq-train as the two gloo ranks of one job (--distributed-no-spawn), each command passed through
    wrap (e.g. to run it under a CPU stand-in); waits for both, kills both if either hangs. Returns
    [(returncode, log text)] per rank; rank R logs to {log_prefix}{R}.log."""
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    try:
        for rank in (0, 1):
            cmd = train_cmd(data, save, arch, *extra, "--distributed-world-size", "2", "--distributed-backend", "gloo",
                            "--distributed-init-method", init, "--distributed-rank", str(rank),
                            "--distributed-no-spawn", max_update=max_update)
            procs.append(start(wrap(cmd), f"{log_prefix}{rank}.log"))
        for proc in procs:
            proc.wait(timeout=timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_group(proc)
    return [(proc.returncode, Path(f"{log_prefix}{rank}.log").read_text()) for rank, proc in enumerate(procs)]


def tiny_checkpoint(tmp_path_factory, arch, *extra):
    """checkpoint_last.pt of a 2-update run of arch on the small corpus, once per session and arch."""
    key = ("checkpoint", arch, *extra)
    if key not in _CACHE:
        data = small_data(tmp_path_factory)
        name = "ckpt_" + "_".join(str(a).strip("-").replace("-", "") for a in (arch, *extra))
        save = built_once(tmp_path_factory, name, lambda save: run1(train_cmd(data, save, arch, *extra, max_update=2)))
        _CACHE[key] = save / "checkpoint_last.pt"
    return _CACHE[key]


def run_split(cmd):
    """Run a command from the repo root with the venv on PATH; stdout and stderr kept apart."""
    return subprocess.run(cmd, cwd=REPO, env={**env(), **ONE_THREAD}, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
