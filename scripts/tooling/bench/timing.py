"""The benchmark's clocks and records: how a call is timed (wall and process CPU time, the device synchronised),
summarised (medians per clock), profiled (torch.profiler's top operators) and described (the machine, the commit).
tooling.bench.phases, tooling.bench.regime and tooling.bench.ops import them.
"""
import contextlib
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from tooling.paths import REPO

def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def num_solves(model):
    """FLOATER's count of ODE solves so far (its flows' num_solves diagnostics)."""
    return sum(getattr(m, "num_solves", 0) for m in model.modules())


def timed(fn, device):
    """(wall seconds, process CPU seconds) of fn()."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def load_average():
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def rotated(names, rep):
    r = rep % len(names)
    return names[r:] + names[:r]


def profile_call(fn, device, top):
    """torch.profiler over one call of fn: the top operators by self time, and the self time of fairseq's
    and FLOATER's labelled ranges (record_function), which is the Python between operators in that range."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    events = prof.key_averages()
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    total = sum(getattr(e, key) for e in events)
    rows = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:top]
    out = {"total_self_ms": total / 1e3,
           "top": [{"op": e.key, "self_ms": getattr(e, key) / 1e3, "calls": e.count,
                    "share": getattr(e, key) / total if total else 0.0} for e in rows]}
    out["ranges_self_ms"] = {e.key: e.self_cpu_time_total / 1e3 for e in events
                             if e.key.startswith("EnsembleModel") or "floater" in e.key.lower()}
    return out


CLOCKS = ("wall", "cpu")


def median(xs):
    return statistics.median(xs) if xs else None


def summarise(row, key, samples, clock):
    """row[key_s] = {clock: samples}, row[key_{clock}_median_s] for both clocks, row[key_median_s] = the chosen one."""
    row[f"{key}_s"] = {c: [t[i] for t in samples] for i, c in enumerate(CLOCKS)}
    for c in CLOCKS:
        row[f"{key}_{c}_median_s"] = median(row[f"{key}_s"][c])
    row[f"{key}_median_s"] = row[f"{key}_{clock}_median_s"]


def parse_lengths(text):
    return [int(x) for x in text.split(",")]


def parse_per_length(text, lengths, name):
    values = [int(x) for x in str(text).split(",")]
    if len(values) == 1:
        values = values * len(lengths)
    if len(values) != len(lengths) or min(values) < 1:
        raise SystemExit(f"--{name}: one positive integer or one per length ({len(lengths)})")
    return dict(zip(lengths, values))


def source_state():
    """The commit measured, and any plugin file that differs from it (uncommitted changes)."""
    import subprocess

    def git(*argv):  # only trailing whitespace is stripped: porcelain lines start with a status column
        try:
            return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=True).stdout.rstrip()
        except (OSError, subprocess.CalledProcessError):
            return None

    changed = git("status", "--porcelain", "--", "fairseq_plugins")
    return {"commit": git("rev-parse", "HEAD"),
            "uncommitted_plugin_files": [line[3:] for line in changed.splitlines()] if changed else []}


def machine(device):
    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cores": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


@contextlib.contextmanager
def counting_graphs(row, key):
    """Adds to row[key] the graphs torch.compile made inside the block (dynamo's count of unique graphs)."""
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    try:
        yield
    finally:
        row[key] = row.get(key, 0) + counters["stats"]["unique_graphs"] - before
