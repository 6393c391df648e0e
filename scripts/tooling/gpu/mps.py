"""CUDA MPS (the multi-process service) for a call that runs many processes on one GPU: without it their kernels
time-slice the GPU; with it they share it. Started as the call's own daemon (its pipe and log folders in the call's
scratch folder), stopped at the call's end; where it cannot start, the caller runs without it and reports why.

    env, why = start(scratch)     # env: os.environ plus the daemon's folders, for the client processes; or None, why
    stop(env)                     # `quit` to the daemon
"""
import os
import shutil
import subprocess
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"


def start(scratch):
    """(environment for MPS clients, None) once the daemon runs, or (None, why it did not start)."""
    exe = shutil.which(CONTROL)
    if exe is None:
        return None, f"{CONTROL} is not on PATH"
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(Path(scratch) / "mps_pipe"),
           "CUDA_MPS_LOG_DIRECTORY": str(Path(scratch) / "mps_log")}
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run([exe, "-d"], env=env, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{CONTROL} -d: {e}"
    if proc.returncode:
        return None, f"{CONTROL} -d exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:200]}"
    return env, None


def stop(env):
    """Ask the daemon started by `start` to quit (its clients have exited)."""
    exe = shutil.which(CONTROL)
    if env is not None and exe is not None:
        subprocess.run([exe], input="quit\n", env=env, capture_output=True, text=True, timeout=30)
