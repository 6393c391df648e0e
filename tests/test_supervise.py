"""scripts/tooling/supervise.py: a process group started with its output pumped, killed at its cap with all it
started; a command that ends in time is waited for and its last lines kept."""
import collections
import os
import time

from tooling.supervise import kill_group, start_group, wait_capped


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie left for its (killed) parent to reap counts as gone
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_group_is_killed_at_its_cap_with_its_children(capfd):
    tail = collections.deque(maxlen=5)
    proc, pump = start_group(["bash", "-c", "sleep 3600 & echo child $!; wait"], "  t| ", tail)
    deadline = time.monotonic() + 30
    while not tail and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(tail[0].split()[1])
    assert wait_capped(proc, pump, 0.5) is True
    assert proc.returncode is not None
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)
    assert f"  t| child {child}" in capfd.readouterr().err


def test_a_command_that_ends_in_time_keeps_its_last_lines():
    tail = collections.deque(maxlen=2)
    proc, pump = start_group(["bash", "-c", "echo one; echo two; echo three; exit 3"], None, tail)
    assert wait_capped(proc, pump, 30) is False
    assert proc.returncode == 3 and list(tail) == ["two", "three"]


def test_kill_group_with_grace_lets_a_process_end_on_sigterm():
    tail = collections.deque(maxlen=5)
    proc, pump = start_group(["bash", "-c", "trap 'echo stopping; exit 0' TERM; echo ready; "
                                            "while true; do sleep 0.1; done"], None, tail)
    deadline = time.monotonic() + 30
    while "ready" not in tail and time.monotonic() < deadline:
        time.sleep(0.05)
    kill_group(proc, grace=10)
    proc.wait()
    pump.join(timeout=10)
    assert proc.returncode == 0 and tail[-1] == "stopping"
