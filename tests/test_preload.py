"""The suite's fork server (tests/preload/): a program handed over to it sees what a fresh interpreter sees where it
matters (argv, path, working directory, environment, standard streams, umask, thread count, signal handlers, random
state, exit status), its caller forwards signals and ends as it did, and its CPU time reaches the tier clock."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import env
from helpers import tier_clock

PROBE = r'''
import sys
preloaded = "torch" in sys.modules  # before any import of its own: only a forked child has torch already
import json, os, signal, time
import numpy, torch
if "--sleep" in sys.argv:
    signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", flush=True), sys.exit(7)))
    if "--grandchild" in sys.argv:  # a program's own child, in its group
        import subprocess
        child = subprocess.Popen(["sleep", "300"])
        print(json.dumps({"preloaded": preloaded, "pid": os.getpid(), "child": child.pid}), flush=True)
    print("ready", flush=True)
    signal.pause()
if "--burn" in sys.argv:
    end = time.process_time() + 1.0
    while time.process_time() < end:
        pass
umask = os.umask(0o022)
print(json.dumps({
    "preloaded": preloaded, "name": __name__, "file": __file__, "argv": sys.argv, "path0": sys.path[0],
    "cwd": os.getcwd(), "env": os.environ.get("PROBE_VALUE"), "umask": umask, "threads": torch.get_num_threads(),
    "stdin": sys.stdin.read(), "torch_draw": torch.rand(3).tolist(), "torch_seed": torch.initial_seed(),
    "numpy_draw": numpy.random.rand(), "random_draw": __import__("random").random(), "sigint": str(signal.getsignal(signal.SIGINT)),
    "sigterm": str(signal.getsignal(signal.SIGTERM)), "tmp": __import__("tempfile").gettempdir(),
}))
sys.stderr.write("to stderr\n")
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
'''


@pytest.fixture
def server():
    """This worker's server socket, once it listens (it starts with the worker, in the background)."""
    sock = os.environ.get("PRELOAD_SOCKET")
    if not sock:
        pytest.skip("no fork server in this run (PRELOAD=0)")
    deadline = time.time() + 120
    while not os.path.exists(sock) and time.time() < deadline:
        time.sleep(0.2)
    assert os.path.exists(sock), "the fork server did not start listening in 120 s"
    return sock


def probe(tmp_path, *args, preload, stdin="", extra_env=None, cwd=None):
    script = tmp_path / "scripts" / "probe.py"  # under a scripts/ folder: a program the server takes
    script.parent.mkdir(exist_ok=True)
    script.write_text(PROBE)
    e = {**env(), "PROBE_VALUE": "v", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path), **(extra_env or {})}
    if not preload:
        e.pop("PRELOAD_SOCKET", None)
    return subprocess.run([sys.executable, str(script), *args], input=stdin, env=e, cwd=cwd or tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_a_handed_over_program_sees_what_a_fresh_one_sees(server, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    runs = {}
    for preload in (True, False):
        proc = probe(tmp_path, "a b", "--x", preload=preload, stdin="line one\n", cwd=tmp_path / "elsewhere",
                     extra_env={"PROBE_EXIT": "3"})
        assert proc.returncode == 3 and proc.stderr.endswith("to stderr\n"), proc.stderr[-2000:]
        runs[preload] = json.loads(proc.stdout)
    forked, fresh = runs[True], runs[False]
    assert forked.pop("preloaded") and not fresh.pop("preloaded")
    for key in ("numpy_draw", "random_draw", "torch_draw", "torch_seed"):  # seeded from the OS in both: they differ
        assert forked.pop(key) != fresh.pop(key), key
    assert forked == fresh
    assert forked["argv"][1:] == ["a b", "--x"] and forked["threads"] == 1 and forked["stdin"] == "line one\n"


def test_two_handed_over_programs_draw_different_random_numbers(server, tmp_path):
    """Each fresh process seeds Python's, numpy's and torch's global generators from the OS; forked children of one
    server would otherwise all draw the server's numbers."""
    runs = [json.loads(probe(tmp_path, preload=True).stdout) for _ in range(2)]
    assert runs[0]["preloaded"] and runs[1]["preloaded"]
    for key in ("numpy_draw", "random_draw", "torch_draw", "torch_seed"):
        assert runs[0][key] != runs[1][key], key


def test_the_thread_count_follows_the_callers_environment(server, tmp_path):
    for n in ("1", "2"):
        out = json.loads(probe(tmp_path, preload=True, extra_env={"OMP_NUM_THREADS": n}).stdout)
        assert out["preloaded"] and out["threads"] == int(n)


def test_a_signal_to_the_caller_reaches_the_program(server, tmp_path):
    script = tmp_path / "scripts" / "probe.py"
    probe(tmp_path, preload=True)  # writes the script
    proc = subprocess.Popen([sys.executable, str(script), "--sleep"], env={**env(), "OMP_NUM_THREADS": "1"},
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert out == "got SIGTERM\n" and proc.returncode == 7, (out, err, proc.returncode)


def test_a_programs_cpu_time_reaches_the_tier_clock(server, tmp_path):
    before = tier_clock.preloaded_seconds()
    assert json.loads(probe(tmp_path, "--burn", preload=True).stdout)["preloaded"]
    assert tier_clock.preloaded_seconds() - before >= 0.9


def test_what_torch_reads_only_later_does_not_stop_a_hand_over(server, tmp_path):
    """A worker that has run a compiled test carries TORCHINDUCTOR_CACHE_DIR (inductor sets it when it loads, after
    the server's preload); a variable read at import (PYTHONHASHSEED) still sends the program to a fresh start."""
    later = probe(tmp_path, preload=True, extra_env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert json.loads(later.stdout)["preloaded"]
    at_import = probe(tmp_path, preload=True, extra_env={"PYTHONHASHSEED": "123"})
    assert not json.loads(at_import.stdout)["preloaded"]


def test_a_lock_the_caller_holds_stays_held_while_the_program_runs(server, tmp_path):
    """multi30k_study.sh takes a lock on a descriptor of its own and its Python children inherit it: handed over,
    the program no longer holds that descriptor, its caller does, until the program ends."""
    probe(tmp_path, preload=True)  # writes the script
    check = tmp_path / "scripts" / "lock_check.py"
    check.write_text('import fcntl, json, sys\npreloaded = "torch" in sys.modules\n'
                     'f = open(sys.argv[1], "a")\ntry:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n'
                     '    held = False\nexcept BlockingIOError:\n    held = True\n'
                     'print(json.dumps({"preloaded": preloaded, "held": held}))\n')
    lock = tmp_path / ".lock"
    for preload in (True, False):
        e = {**env(), "OMP_NUM_THREADS": "1"}
        if not preload:
            e.pop("PRELOAD_SOCKET", None)
        proc = subprocess.run(["bash", "-c", f'exec {{fd}}> "{lock}"; flock "$fd"; "{sys.executable}" "{check}" "{lock}"'],
                              env=e, capture_output=True, text=True, timeout=120)
        assert json.loads(proc.stdout) == {"preloaded": preload, "held": True}, proc.stderr[-2000:]


def alive(pid):
    """Whether a process runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone(*pids, timeout=30):
    deadline = time.time() + timeout
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.parametrize("preload", [True, False])
def test_a_caller_in_a_session_of_its_own_is_signalled_as_a_group(server, tmp_path, preload, sig):
    """A caller started in a new session (scripts/tooling/supervise.py, a test's start_new_session) is signalled, or
    killed, as a group: handed over, the signal reaches the program and the program's own children as it does in a
    fresh process (SIGTERM: the program's handler runs and the caller ends with its status; SIGKILL: all end)."""
    probe(tmp_path, preload=True)  # writes the script
    script = tmp_path / "scripts" / "probe.py"
    e = {**env(), "OMP_NUM_THREADS": "1"}
    if not preload:
        e.pop("PRELOAD_SOCKET", None)
    proc = subprocess.Popen([sys.executable, str(script), "--sleep", "--grandchild"], env=e, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    started = json.loads(proc.stdout.readline())
    assert proc.stdout.readline() == "ready\n"
    assert started["preloaded"] == preload and (started["pid"] == proc.pid) != preload, started
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert out == "got SIGTERM\n" and proc.returncode == 7, (out, err, proc.returncode)
    else:
        assert proc.returncode == -signal.SIGKILL
    assert gone(started["pid"], started["child"]), "the program or its child outlived the signal to the group"


ENDINGS = r'''
import atexit, sys, threading, time
sys.left_open = open(sys.argv[2], "w")  # held by a module past the program's end, as an imported module's global:
sys.left_open.write("buffered\n")  # what it holds reaches the file only as the process ends
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished", flush=True))).start()
print("main done", flush=True)
ending = sys.argv[1]
if ending == "exit 3":
    sys.exit(3)
if ending == "exit message":
    sys.exit("a message")
if ending == "raise":
    raise ValueError("raised")
'''


@pytest.mark.parametrize("ending", ["return", "exit 3", "exit message", "raise"])
def test_a_handed_over_program_ends_as_a_fresh_one(server, tmp_path, ending):
    """The child leaves without tearing its modules down (that would copy every preloaded page): a non-daemon thread
    still finishes, atexit still runs, a file the program left open still gets what it wrote, and the exit status
    and stderr are the interpreter's, as in a fresh process."""
    script = tmp_path / "scripts" / "endings.py"
    script.parent.mkdir()
    script.write_text(ENDINGS)
    runs = {}
    for preload in (True, False):
        e = {**env(), "OMP_NUM_THREADS": "1"}
        if not preload:
            e.pop("PRELOAD_SOCKET", None)
        left_open = tmp_path / f"left_open_{preload}.txt"
        proc = subprocess.run([sys.executable, str(script), ending, str(left_open)], env=e, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        stderr = proc.stderr.replace(str(script), "SCRIPT")
        runs[preload] = (proc.returncode, proc.stdout, stderr, left_open.read_text())
    assert runs[True] == runs[False]
    code, stdout, stderr, left_open = runs[True]
    assert code == {"return": 0, "exit 3": 3, "exit message": 1, "raise": 1}[ending]
    assert stdout == "main done\nthread finished\natexit ran\n" and left_open == "buffered\n", runs[True]
    assert ("ValueError: raised" in stderr) == (ending == "raise") and ("a message" in stderr) == (ending == "exit message")
