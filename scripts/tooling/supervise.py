"""Process supervision: a command in a process group of its own, its output pumped line by line, killed with
everything it started at a cap.

    proc, pump = start_group(cmd, "  name| ", tail)   # tail: a collections.deque keeping its last lines
    timed_out = wait_capped(proc, pump, cap)          # killed (group) at `cap` seconds, or after it ended
    kill_group(proc, grace=10)                        # SIGTERM, 10 s, then SIGKILL to the whole group
    children_cpu()                                    # CPU seconds of the children that have ended

Used by scripts/gpu/gpu_check.py (each section in its own process, killed at its cap) and by any command that runs
others under a time cap.
"""
import contextlib
import os
import signal
import subprocess
import sys
import threading

__all__ = ["children_cpu", "kill_group", "start_group", "wait_capped"]


def kill_group(proc, grace=0.0):
    """SIGTERM (when a grace period is given) then SIGKILL to the process group of `proc` (its own session)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0)) if grace else ((signal.SIGKILL, 0),):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        if wait:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=wait)


def start_group(cmd, prefix, tail, **popen_kwargs):
    """A process in a session of its own (so that it and all it starts can be killed together), its output echoed
    line by line to stderr with `prefix` (None: not echoed) and its last lines kept in `tail`. Returns the
    process and the thread pumping its output."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True, **popen_kwargs)

    def pump():
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if prefix is not None:
                sys.stderr.write(f"{prefix}{line}")
                sys.stderr.flush()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return proc, thread


def wait_capped(proc, pump, cap, grace=0.0):
    """Waits up to `cap` seconds for a process from start_group; whether it timed out. Then (also on an exception
    such as Ctrl-C, which its session does not get) kills its group, with `grace` seconds after SIGTERM, which
    ends anything it left running after a normal end, and waits for its output."""
    try:
        proc.wait(timeout=cap)
        return False
    except subprocess.TimeoutExpired:
        return True
    finally:
        kill_group(proc, grace)
        proc.wait()
        pump.join(timeout=10)


def children_cpu():
    """CPU seconds (user + system) of this process's children that have ended (and theirs, when waited for)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
