"""Slurm's clients for a submission that must never queue a job twice (scripts/submit_paper.py).

    Slurm(dry_run)        sbatch (--parsable, in a session of its own), a job's state (scontrol, then sacct)
    jobs_in_queue(...)    this user's live jobs by name whose log goes to one folder: the jobs of a submission that
                          was killed after sbatch accepted them and before they were recorded (SIGKILL)
    manifest_lock(path)   one submission per manifest at a time; the lock file goes when the lock is released
    held_signals()        SIGTERM, SIGHUP and SIGINT wait until the job being queued is recorded, then stop
    Journal               the manifest, written after each accepted job, before the next sbatch
    missing_folders, remove_if_empty   what a submission made, removed when it queued nothing

Why sbatch runs in a session of its own: a dropped ssh connection (SIGHUP) or Ctrl-C reaches every process of
the terminal's foreground group, and an sbatch killed after the controller accepted the job never prints its id.
"""
import errno
import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path

from tooling.atomic import write_text

LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
        "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}
HELD = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Refusal(Exception):
    """Bad input: one line, no traceback."""


class Stopped(Exception):
    """A held signal arrived; raised once the job being queued is recorded."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def say(text=""):
    """A line of the submission's plan; a terminal gone (ssh dropped: SIGHUP) does not stop the bookkeeping."""
    try:
        print(text, flush=True)
    except OSError:  # the terminal is gone (SIGHUP): the bookkeeping goes on
        pass


def _word(word):
    """shlex.quote, but a dry run's job ids ($dry1) are left for the shell to expand."""
    return f'"{word}"' if "$dry" in word else shlex.quote(word)


def one_line(tool, text):
    """A Slurm client's error lines as one: its 'sbatch: error: ' prefixes dropped, the lines joined by '; '."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    lines = [line for line in lines if line.startswith(f"{tool}: fatal: ")] or lines  # the cause, where named
    for prefix in (f"{tool}: error: ", f"{tool}: fatal: ", f"{tool}: "):
        lines = [line[len(prefix):] if line.startswith(prefix) else line for line in lines]
    return "; ".join(dict.fromkeys(lines)) or "no message"


class Slurm:
    """sbatch and the job states, through Slurm's own clients, run from `cwd`."""

    def __init__(self, cwd, dry_run=False):
        self.cwd, self.dry_run, self.fake_ids = cwd, dry_run, 0

    def run(self, *args, check=True, env=None, what=None):
        try:
            proc = subprocess.run(list(args), capture_output=True, text=True, env={**os.environ, **(env or {})},
                                  cwd=self.cwd, start_new_session=True, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise Refusal(f"{args[0]}: not found (run this on a Slurm login node, or use --dry-run)")
        if check and proc.returncode != 0:
            raise Refusal(f"{what or args[0] + ' failed'}: {one_line(args[0], proc.stderr or proc.stdout)}")
        return proc

    def submit(self, args, env, options):
        """Prints the sbatch command and queues it: the job id. A dry run queues nothing and prints
        `dryN=$(ENV sbatch --parsable ...)`, a line a shell runs, and returns $dryN, which a later job's
        dependency reads. `options` names the flags its sbatch options came from (for a refusal's message)."""
        if self.dry_run:
            self.fake_ids += 1
            args = [*args[:2], "--parsable", *args[2:]]
        line = "".join(f"{k}={shlex.quote(v)} " for k, v in env.items()) + "sbatch " + " ".join(map(_word, args))
        if self.dry_run:
            say(f"dry{self.fake_ids}=$({line})")
            return f"$dry{self.fake_ids}"
        say("  " + line)
        name = args[args.index("--job-name") + 1]
        return self.run("sbatch", "--parsable", *args, env=env,
                        what=f"sbatch refused {name} (its options: {options})").stdout.strip().split(";")[0]

    def info(self, job):
        """{'JobState': ..., 'ExitCode': ..., 'Reason': ..., 'StdOut': ...}, or {} when Slurm no longer knows the
        job."""
        if not job or job.startswith("$dry"):
            return {}
        out = self.run("scontrol", "show", "job", "-o", job, check=False).stdout
        fields = dict(part.split("=", 1) for part in out.split() if "=" in part)
        if fields.get("JobState"):
            return fields
        try:  # a finished job scontrol has forgotten (after MinJobAge): Slurm's accounting, where the cluster keeps it
            acct = self.run("sacct", "-n", "-X", "-P", "-j", job, "-o", "State,ExitCode", check=False).stdout.split()
        except Refusal:  # no sacct here
            return {}
        if acct and "|" in acct[0]:
            state, code = acct[0].split("|", 1)
            return {"JobState": state.split()[0], "ExitCode": code}
        return {}

    def live(self, job):
        return self.info(job).get("JobState") in LIVE


def jobs_in_queue(slurm, names, log_folder):
    """{job name: [job ids, oldest first]} of this user's queued or running jobs named in `names` whose Slurm log
    goes to `log_folder` (submit_paper.py's --output=CHECKPOINTS/slurm-<name>-%j.out: another submission's
    checkpoints folder has its own). A submission killed between sbatch's acceptance and its record (SIGKILL)
    leaves only this trace."""
    proc = slurm.run("squeue", "--me", "-h", "-o", "%i|%j", check=False)
    if proc.returncode != 0:
        raise Refusal(f"squeue failed: {one_line('squeue', proc.stderr or proc.stdout)} (the queue is read for jobs "
                      "of an interrupted submission before any job is queued)")
    found = {}
    for line in proc.stdout.splitlines():
        job, _, name = line.strip().partition("|")
        if name in names:
            out = slurm.info(job).get("StdOut", "")
            if out and Path(out).parent == Path(log_folder):
                found.setdefault(name, []).append(job)
    return {name: sorted(jobs, key=_job_order) for name, jobs in found.items()}


def _job_order(job):
    head = job.split("_")[0]
    return (int(head) if head.isdigit() else 0, job)


@contextmanager
def manifest_lock(manifest_path, shown=str):
    """Held while a submission reads, submits and writes the manifest: a second submission waits here, then sees
    the first one's jobs as queued. POSIX record locks (lockf): NFS and Lustre clients honour them across nodes.
    The lock file is removed while the lock is still held; a waiter that then gets the lock on the removed file
    sees that the path no longer names it and locks again (so two never run at once)."""
    lock_path = Path(f"{manifest_path}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        lock = open(lock_path, "a+")
        try:
            _lock(lock, manifest_path, lock_path, shown)
            try:
                current = os.stat(lock_path)
            except FileNotFoundError:
                current = None
            mine = os.fstat(lock.fileno())
            if current is not None and (current.st_ino, current.st_dev) == (mine.st_ino, mine.st_dev):
                break
        except BaseException:
            lock.close()
            raise
        lock.close()  # the holder removed this file on its way out: lock the new one
    try:
        lock.seek(0)
        lock.truncate()
        lock.write(f"submit_paper.py, pid {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
        yield
    finally:
        try:
            os.unlink(lock_path)
        except FileNotFoundError:
            pass
        lock.close()


def _lock(lock, manifest_path, lock_path, shown):
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno not in (errno.EACCES, errno.EAGAIN):
            raise Refusal(f"--manifest {shown(manifest_path)}: cannot lock {shown(lock_path)} ({err.strerror}); "
                          "put the manifest on a file system with locks")
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        print(f"waiting for the submission running on {shown(manifest_path)} ({holder})", flush=True)
        fcntl.lockf(lock, fcntl.LOCK_EX)


class HeldSignals:
    """SIGTERM, SIGHUP and SIGINT noted, not acted on, until `check()`: called once each accepted job is
    recorded, it raises Stopped. A second signal of the same kind while one waits is the same request."""

    def __init__(self):
        self.signum = None

    def _note(self, signum, frame):
        self.signum = self.signum or signum

    def check(self):
        if self.signum is not None:
            raise Stopped(self.signum)


@contextmanager
def held_signals():
    held, old = HeldSignals(), {}
    for sig in HELD:
        old[sig] = signal.signal(sig, held._note)
    try:
        yield held
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


class Journal:
    """The manifest, rewritten (atomically) after each job sbatch accepts and before the next sbatch, so that no
    kill leaves a queued job unrecorded but SIGKILL in the instant between the two (the rerun then finds that job
    in the queue by its name and log folder: jobs_in_queue). `manifest` and `held` are set once the lock is held."""

    def __init__(self, path, dry_run, shown=str):
        self.path, self.dry_run, self.shown = Path(path), dry_run, shown
        self.manifest, self.held, self.queued = None, None, 0

    def write(self, job=None):
        if self.dry_run:
            return
        try:
            write_text(self.path, json.dumps(self.manifest, indent=1) + "\n")
        except OSError as err:  # a full disk, a quota: stop before queueing more that nothing records
            queued = f"job {job} is queued and recorded only in Slurm's queue" if job else "nothing more was queued"
            raise Refusal(f"--manifest {self.shown(self.path)}: cannot write it ({err.strerror or err}); {queued}: "
                          "free the space and rerun the same command, which finds the queued jobs of this submission "
                          "by their names and queues each job once")

    def accepted(self, job):
        self.queued += 1
        self.write(job)
        if not self.dry_run:
            say(f"  job {job} queued (recorded in {self.shown(self.path)})")
            self.held.check()  # a signal that came during this sbatch stops here, with the job recorded


def missing_folders(*paths):
    """The folders among paths and their parents that do not exist yet, deepest first."""
    out = []
    for path in paths:
        for folder in [Path(path), *Path(path).parents]:
            if folder.exists():
                break
            out.append(folder)
    return sorted(set(out), key=lambda f: len(f.parts), reverse=True)


def remove_if_empty(folders):
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (a job's log, the manifest), or gone
            pass
