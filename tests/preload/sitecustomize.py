"""A Python process the suite starts hands itself to its worker's fork server (server.py) when it runs one of the
fairseq commands (`fairseq-train`, `python -m fairseq_cli.generate`, ...) or this project's scripts and modules
(`scripts/**.py`, `python -m fairseq_plugins ...`, the tests' own fairseq-train wrappers `tests/*.py`), with no interpreter option and no tty; anything else, or a
server that says the process would import differently, starts as usual. Set up by tests/conftest.py (PRELOAD_SOCKET); a test that needs fresh interpreters asks for them by its module
(conftest.FRESH_MODULES) or PRELOAD=0 turns the server off. Only the cheap built-in modules are imported here."""
import os


def _program(argv):
    """("script", path) or ("module", name) for what may be handed over, else None."""
    if len(argv) >= 3 and argv[1] == "-m" and argv[2].split(".")[0] in ("fairseq_cli", "fairseq_plugins"):
        return "module", argv[2]
    if len(argv) >= 2 and not argv[1].startswith("-"):
        script = os.path.abspath(argv[1])
        name = os.path.basename(script)
        if ((name.startswith("fairseq-") and os.path.dirname(script) == os.path.dirname(argv[0]))
                or (name.endswith(".py") and f"{os.sep}scripts{os.sep}" in script)
                or (name.endswith(".py") and os.path.basename(os.path.dirname(script)) == "tests")):
            return "script", script
    return None


def _log(why):
    if os.environ.get("PRELOAD_LOG"):  # why a process started fresh: one line each
        import sys
        with open(os.environ["PRELOAD_LOG"], "a") as f:
            f.write(f"{sys.orig_argv[:3]} {why}\n")


def _hand_over(path):
    import json
    import signal
    import socket
    import struct
    import sys

    program = _program(sys.orig_argv)
    if program is None or any(os.isatty(fd) for fd in (0, 1, 2)):
        return _log("not a program handed over" if program is None else "a tty")
    # Descriptors beyond the standard three stay with this process, which holds them open until the program ends:
    # a lock a script took (multi30k_study.sh's `exec {lock}>`) stays held, a pipe's end stays open. The program
    # cannot use them itself; none that the tests start is handed one to use (subprocess closes the rest).
    umask = os.umask(0o022)
    os.umask(umask)
    req = {"argv": sys.argv, "orig_argv": sys.orig_argv, "cwd": os.getcwd(), "env": dict(os.environ),
           "path": sys.path, "prefix": sys.prefix, "executable": sys.executable, "flags": list(sys.flags),
           "umask": umask, "pgid": os.getpgid(0), "module": program[1] if program[0] == "module" else None,
           "script": program[1] if program[0] == "script" else None}
    data = json.dumps(req).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        conn.sendall(struct.pack("!I", len(data)))
        socket.send_fds(conn, [data], [0, 1, 2])
        reply = conn.makefile("rb")
        first = reply.readline().split()
    except OSError as e:
        conn.close()
        return _log(f"no server: {e}")  # no server (not started yet, or gone): a fresh start
    if not first or first[0] != b"PID":
        conn.close()
        _log(b" ".join(first).decode())
        return
    child, group = int(first[1]), first[2:] == [b"GROUP"]

    def forward(signum, frame):  # to the child's group when it leads one, as a signal to this group reaches it all
        try:
            os.killpg(child, signum) if group else os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    while True:
        try:
            last = reply.readline().split()
            break
        except InterruptedError:
            continue
    if not last or last[0] != b"EXIT":
        os._exit(70)  # the server died under its child (EX_SOFTWARE)
    status = int(last[1])
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


if os.environ.get("PRELOAD_SOCKET"):
    _hand_over(os.environ["PRELOAD_SOCKET"])
