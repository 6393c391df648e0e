"""The suite's fork server: one per pytest worker, holding torch and fairseq imported, so that the fairseq commands
and scripts the tests start skip the 2.9 CPU seconds each fresh interpreter spends importing them (515 of the
suite's 1,403 Python processes did, 45% of its CPU time: results/suite/times_05d330e_loaded.md).

    python tests/preload/server.py SOCKET CPU_FILE

A process started with this folder on PYTHONPATH and PRELOAD_SOCKET set asks here at start-up (sitecustomize.py,
which decides what may be handed over). This process forks; the child takes the caller's standard streams,
working directory, environment, umask, argv and sys.path, runs the script or module as `python` would and ends
as the interpreter ends a program (threads joined, atexit, files flushed, its exit status) without tearing its
modules down (leave()). The caller waits, forwards the signals it gets to the child, and ends as the child did.
A caller that dies takes its child with it (SIGKILL).

A caller in a process group of its own (scripts/tooling/supervise.py's sections, a test's start_new_session: a
group that is signalled, or killed, as a whole) gets a child that leads a group of its own, which the program's
own children join as they would have joined the caller's: the caller forwards each signal to that whole group,
and a caller killed with its group takes the child's group with it. (A process cannot join a group of another
session, so the child cannot enter the caller's.)

Only what a fresh interpreter would import the same way is preloaded: torch, numpy and fairseq, from
site-packages, before any tensor work (no thread pool started, nothing drawn from a generator). fairseq_cli's
modules are not (each configures logging when imported), nor this project's code (a changed file must be read).
Every reaped child's CPU seconds are added to CPU_FILE, which the tier clock reads (tests/helpers/tier_clock.py).

What a child cannot get fresh, and why that is harmless here: its string hash seed is the server's (a running
interpreter cannot change it; a fresh one draws its own), so every child iterates a set of strings in one order,
as any one fresh process does. The thread count is set from the caller's OMP_NUM_THREADS (required: without it a
fresh torch picks its own), and Python's, numpy's and torch's global generators are seeded anew from the OS.
"""
import json
import os
import select
import socket
import struct
import sys

PRELOADED = ("torch", "numpy", "fairseq")


def preload():
    for name in PRELOADED:
        __import__(name)
    import gc
    import threading
    # Out of the collector's reach in every child: a child's collections, and its exit, then neither walk nor
    # touch (and so copy) the preloaded objects; its exit took 0.73 CPU s without this, 0.11 with it.
    gc.freeze()
    # A fork copies one thread: a Python thread here would leave its locks held in every child. (numpy's OpenBLAS
    # starts OMP_NUM_THREADS - 1 native threads when it loads, and stops them itself around a fork.)
    assert threading.active_count() == 1, "preload started a thread"
    assert "torch._inductor" not in sys.modules, "preload loaded torch._inductor (its variables are not checked: LAZY)"


def recv_request(conn):
    """The caller's request (JSON) and its three standard streams, passed as file descriptors."""
    size = struct.unpack("!I", conn.recv(4, socket.MSG_WAITALL))[0]
    msg, fds, _, _ = socket.recv_fds(conn, size, 3, socket.MSG_WAITALL)
    data = msg
    while len(data) < size:
        data += conn.recv(size - len(data))
    return json.loads(data), fds


def compatible(req):
    """Why the caller must start fresh, or None: anything read at import time that differs from this process."""
    if req["prefix"] != sys.prefix or req["executable"] != sys.executable:
        return "another interpreter"
    if req["flags"] != list(sys.flags):
        return "interpreter flags"
    def read_at_import(k):
        return k.startswith(IMPORT_TIME_VARIABLES) and k not in THREADS and not k.startswith(LAZY)

    mine = {k: v for k, v in os.environ.items() if read_at_import(k)}
    theirs = {k: v for k, v in req["env"].items() if read_at_import(k)}
    if not req["env"].get("OMP_NUM_THREADS", "").isdigit() or int(req["env"]["OMP_NUM_THREADS"]) < 1:
        return "no OMP_NUM_THREADS: a fresh torch would pick its own thread count"
    if req["env"].get("MKL_NUM_THREADS", req["env"]["OMP_NUM_THREADS"]) != req["env"]["OMP_NUM_THREADS"]:
        return "MKL_NUM_THREADS differs from OMP_NUM_THREADS"
    if mine != theirs:
        return "environment read at import: " + " ".join(sorted({k for k, _ in set(mine.items()) ^ set(theirs.items())}))
    for entry in req["path"]:  # a module that the caller's sys.path would find elsewhere than the preloaded one
        if entry not in sys.path and os.path.isdir(entry):
            names = {n.split(".")[0] for n in os.listdir(entry)}
            if names & TOP_LEVEL:
                return f"{entry} shadows a preloaded module"
    return None


# PYTHONPATH differences are judged by shadowing (above); the rest of these are read by Python, torch, OpenMP,
# MKL or the allocator when they load.
IMPORT_TIME_VARIABLES = ("PYTHONHOME", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONWARNINGS",
                         "PYTHONDONTWRITEBYTECODE", "PYTHONMALLOC", "TORCH", "PYTORCH", "OMP_", "MKL", "KMP_", "GOMP_",
                         "OPENBLAS", "CUDA", "NCCL", "LD_", "MALLOC_", "LANG", "LC_", "HYDRA", "NUMEXPR", "NUMPY")
# (fairseq 0.12.2 reads no variable of its own; FAIRSEQ_TRAIN, which the campaign's probe sets, is train_small.sh's.)
TOP_LEVEL = set()
# Read by torch's thread pools when they first run, not at import (the pools start lazily): the child sets its
# own count explicitly (run_child), as a fresh process would have read it.
THREADS = {"OMP_NUM_THREADS", "MKL_NUM_THREADS"}
# Read by torch._inductor when it loads, which the preload does not (preload() asserts it); importing it sets
# TORCHINDUCTOR_CACHE_DIR in the caller's environment, so a caller that has run a compiled test differs there.
LAZY = ("TORCHINDUCTOR_",)


def grouped(req):
    """Whether the caller is in a process group of its own, not the server's (then so is its child)."""
    return req["pgid"] != os.getpgid(0)


def end(pid, group):
    """SIGKILL to a child, and to the group it leads if it leads one."""
    try:
        os.killpg(pid, 9) if group else os.kill(pid, 9)
    except ProcessLookupError:
        pass


def run_child(req, fds):
    """In the forked child: become the caller's process and run its program (returns when it ends, raises what it
    raised)."""
    if grouped(req):
        os.setpgid(0, 0)  # also done by the server right after the fork: the group exists before the caller hears
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.umask(req["umask"])
    os.environ.clear()
    os.environ.update(req["env"])
    import tempfile
    tempfile.tempdir = None  # recomputed from the caller's TMPDIR
    import torch
    torch.set_num_threads(int(req["env"]["OMP_NUM_THREADS"]))  # the count a fresh torch reads from it
    # a fresh process's global generators are seeded from the OS at start-up, each its own: not the server's
    import random
    import numpy
    random.seed()
    numpy.random.seed()
    torch.seed()
    import runpy
    sys.argv, sys.orig_argv = req["argv"], req["orig_argv"]
    if req["module"]:
        sys.path[:] = [req["cwd"]] + req["path"]
        runpy._run_module_as_main(req["module"], alter_argv=True)
    else:
        sys.path[:] = [os.path.dirname(os.path.realpath(req["script"]))] + req["path"]
        runpy.run_path(req["script"], run_name="__main__")


def program_frames(tb, req):
    """A traceback from the program's first frame, as a fresh interpreter prints it: without this file's frames,
    and for a script without runpy's (`python -m` shows runpy's frames too, and runs through the same function)."""
    runpy_frames = ("<frozen runpy>", "runpy.py")
    while tb is not None and (tb.tb_frame.f_code.co_filename == __file__ or
                              (req["script"] and tb.tb_frame.f_code.co_filename.endswith(runpy_frames))):
        tb = tb.tb_next
    return tb


def leave(req, fds):
    """Run the program in this forked child and end the child as the interpreter ends a program, less the teardown
    of its modules: non-daemon threads joined, the atexit functions run, a last collection, every file object the
    program left open flushed, the exit status as `python` gives it. The teardown would touch every object the
    server preloaded, and so copy each of their pages: 0.19 CPU s a program, against 0.02 without it; what it
    does beyond the above (__del__ of objects the modules still hold) is what no program here relies on."""
    try:
        run_child(req, fds)
        code = 0
    except SystemExit as e:
        code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        raise  # the interpreter ends by SIGINT itself, as a fresh one does; teardown and all
    except BaseException as e:
        e.__traceback__ = program_frames(e.__traceback__, req)  # what the hook prints (not its third argument)
        sys.excepthook(type(e), e, e.__traceback__)
        code = 1
    import atexit
    import gc
    import io
    import threading
    threading._shutdown()  # what the interpreter's finalisation does first: wait for the non-daemon threads
    atexit._run_exitfuncs()
    gc.collect()  # the interpreter's last collection: cycles with finalizers (the preload's objects are frozen)
    for obj in gc.get_objects():  # the program's own objects (frozen ones are not listed): a file left open
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # the interpreter's status when flushing at exit fails
    os._exit(code & 0xFF)


def main():
    path, cpu_file = sys.argv[1], sys.argv[2]
    preload()
    TOP_LEVEL.update(n.split(".")[0] for n, m in sys.modules.items() if getattr(m, "__file__", None))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    os.rename(path + ".tmp", path)  # callers see the socket only once everything is loaded
    listener.listen(16)
    parent, cpu = os.getppid(), 0.0
    children = {}  # pidfd -> [pid, the caller's connection (None once it closed), whether it leads a group]
    while os.getppid() == parent:
        callers = [c for _, c, _ in children.values() if c is not None]
        ready, _, _ = select.select([listener, *children, *callers], [], [], 1.0)
        for r in ready:
            if r is listener:
                conn, _ = listener.accept()
                try:
                    req, fds = recv_request(conn)
                except (OSError, ValueError, struct.error):
                    conn.close()
                    continue
                why = compatible(req)
                if why:
                    for fd in fds:
                        os.close(fd)
                    conn.sendall(b"FRESH " + why.encode()[:200] + b"\n")
                    conn.close()
                    continue
                sys.stdout.flush(), sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for fd, (_, c, _) in children.items():
                        os.close(fd)
                        if c is not None:
                            c.close()
                    conn.close()
                    children.clear()
                    leave(req, fds)
                for fd in fds:
                    os.close(fd)
                group = grouped(req)
                if group:
                    try:
                        os.setpgid(pid, pid)
                    except OSError:  # the child has already made it (EACCES) or already ended (ESRCH)
                        pass
                entry = [pid, conn, group]
                children[os.pidfd_open(pid)] = entry
                try:
                    conn.sendall(f"PID {pid} {'GROUP' if group else 'ONE'}\n".encode())
                except OSError:  # the caller died while it waited: so does its child
                    end(pid, group)
                    conn.close()
                    entry[1] = None
            elif isinstance(r, int):  # a child ended
                pid, conn, _ = children.pop(r)
                os.close(r)
                _, status, usage = os.wait4(pid, 0)
                cpu += usage.ru_utime + usage.ru_stime
                with open(cpu_file + ".tmp", "w") as f:
                    f.write(f"{cpu:.3f}\n")
                os.replace(cpu_file + ".tmp", cpu_file)  # before the caller hears: its test counts this child
                if conn is not None:
                    try:
                        conn.sendall(f"EXIT {status}\n".encode())
                    except OSError:
                        pass
                    conn.close()
            else:  # a caller's connection reads only when the caller died before its child: so does the child
                for entry in children.values():
                    if entry[1] is r:
                        end(entry[0], entry[2])
                        r.close()
                        entry[1] = None
    for pid, _, group in children.values():  # the worker is gone: so are its tests
        end(pid, group)


if __name__ == "__main__":
    main()
