"""A throwaway one-node Slurm cluster on localhost, for tests/test_slurm.py.

Debian's Slurm (22.05) packages are installed if missing (apt-get; needs root). The cluster lives in a
temporary directory: its own slurm.conf (no munge: auth/none + cred/none; process tracking by process group;
no cgroups; free ports), state and spool directories and logs. slurmctld and slurmd run in the foreground
(-D) as our child processes, so they are stopped by PID: SIGTERM, a timeout, then SIGKILL. Clients
(sbatch, squeue, scontrol, scancel) find the cluster through SLURM_CONF.
"""
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from helpers.small_task import free_port

PACKAGES = ("slurmctld", "slurmd", "slurm-client")
DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")
CRED_EXPIRE = 5  # seconds a finished run's job credential stays revoked on the node (AuthInfo=cred_expire)
# Slurm's job states that are not an end (squeue(1), JOB STATE CODES). COMPLETING is among them: the job's
# processes have exited but the node has not yet released it, and it turns COMPLETED or FAILED after.
LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
        "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}


def ended(info):
    """True once a job's info (SlurmCluster.job) shows a final state: COMPLETED, FAILED, CANCELLED, ..."""
    return info.get("JobState") not in LIVE | {None}


class SlurmUnavailable(Exception):
    """Why Slurm cannot be installed here (the test skips with it)."""


def which(name):
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def ensure_installed():
    """Installs Debian's Slurm packages unless every tool is already there."""
    if all(which(tool) for tool in DAEMONS + CLIENTS):
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable("Slurm is not installed and installing it (apt-get) needs root")
    if not which("apt-get"):
        raise SlurmUnavailable("Slurm is not installed and there is no apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "-o", "DPkg::Lock::Timeout=120", "install", "-y", "--no-install-recommends", *PACKAGES]
    proc = subprocess.run(install, env=env, capture_output=True, text=True)
    if proc.returncode != 0:  # the package lists may be missing or stale
        subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=120", "update"], env=env, capture_output=True)
        proc = subprocess.run(install, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not all(which(tool) for tool in DAEMONS + CLIENTS):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["tools missing after install"]
        raise SlurmUnavailable(f"apt-get install {' '.join(PACKAGES)} failed: {tail[0]}")


def memory_mb():
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 4096


class SlurmCluster:
    def __init__(self, root):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.procs = {}

    @property
    def env(self):
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_conf(self):
        r = self.root
        for d in ("state", "spool"):
            (r / d).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(f"""\
ClusterName=posenc-test
SlurmctldHost=localhost
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire={CRED_EXPIRE}
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=5
InactiveLimit=0
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory={memory_mb() // 2} State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""")

    def start(self, timeout=60):
        self.write_conf()
        for name, args in (("slurmctld", ["-D", "-c"]), ("slurmd", ["-D", "-N", "localhost"])):
            log = open(self.root / f"{name}.out", "w")
            self.procs[name] = subprocess.Popen([which(name), *args, "-f", str(self.conf)], env=self.env,
                                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            log.close()
        deadline = time.time() + timeout
        while time.time() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}): {self.log_tail(name)}")
            state = self.client("sinfo", "-h", "-n", "localhost", "-o", "%t", check=False).stdout.strip()
            if state == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"the node did not become idle in {timeout} s: {self.log_tail('slurmctld')} | "
                           f"{self.log_tail('slurmd')}")

    def log_tail(self, name, n=5):
        path = self.root / f"{name}.out"
        return " / ".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else "(no log)"

    def client(self, tool, *args, check=True, env=None, cwd=None):
        proc = subprocess.run([which(tool), *map(str, args)], env={**self.env, **(env or {})}, cwd=cwd,
                              capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(map(str, args))} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def submit(self, *args, env=None, cwd=None):
        """sbatch --parsable ARGS; returns the job id."""
        return self.client("sbatch", "--parsable", *args, env=env, cwd=cwd).stdout.strip().split(";")[0]

    def job(self, job_id):
        """{'JobState': ..., 'Restarts': ..., ...} from scontrol show job."""
        out = self.client("scontrol", "show", "job", "-o", job_id, check=False).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait(self, job_id, done, timeout, poll=1.0, release_after=15, output=None):
        """Polls until done(job info) is true; returns the job info, raises on timeout. A requeued job waits
        for its begin time, CRED_EXPIRE + 1 s; one still pending after `release_after` seconds is
        made eligible (scontrol update StartTime=now). Not sooner: started before its previous run's
        credential has expired, a requeued batch job is killed ("Job credential revoked"). The timeout's
        message ends with the job's output file (`output`) and the daemons' last errors."""
        deadline = time.time() + timeout
        info, pending_since = {}, None
        while time.time() < deadline:
            info = self.job(job_id)
            if done(info):
                return info
            if info.get("JobState") == "PENDING":
                pending_since = pending_since or time.time()
                if release_after is not None and time.time() - pending_since > release_after:
                    self.client("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=False)
                    pending_since = None
            else:
                pending_since = None
            time.sleep(poll)
        raise TimeoutError(f"job {job_id} after {timeout} s: {info.get('JobState')} "
                           f"(reason {info.get('Reason')}, restarts {info.get('Restarts')})\n"
                           + self.diagnostics(output))

    def diagnostics(self, output=None, lines=40):
        """The tail of a job's output file and the errors the daemons logged, for a failure message."""
        parts = []
        if output is not None:
            text = Path(output).read_text(errors="replace").splitlines() if Path(output).exists() else ["(none)"]
            # the first errors say what went wrong; the tail is often only the other rank's echo of it
            first = [line for line in text if re.search(r"error|exception|traceback|failed", line, re.I)][:10]
            parts.append(f"--- job output {output}, first error lines:\n" + "\n".join(first))
            parts.append(f"--- job output {output} (last {lines} lines):\n" + "\n".join(text[-lines:]))
        for name in DAEMONS:
            log = self.root / f"{name}.log"
            errors = [line for line in log.read_text(errors="replace").splitlines()
                      if "error" in line.lower() and "pmix" not in line.lower()] if log.exists() else []
            parts.append(f"--- {name}.log errors (last 10):\n" + "\n".join(errors[-10:]))
        return "\n".join(parts)

    def let_credential_expire(self, job_id):
        """Returns once a finished job's last run ended more than CRED_EXPIRE + 1 s ago. `scontrol requeue`
        sooner can start the next run while the node still holds the last run's revoked credential: its
        srun steps are then refused ("Job credential revoked") and the run fails. On a real cluster a
        requeue comes minutes later; a test requeues within a second."""
        end = self.job(job_id).get("EndTime", "")
        try:
            ended = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
        except ValueError:  # Unknown / None: wait the whole window
            ended = time.time()
        time.sleep(max(0.0, ended + CRED_EXPIRE + 2 - time.time()))  # + 2: EndTime has whole seconds

    def stop(self, timeout=30):
        """Cancels every job, waits for an empty queue, then stops the daemons by PID."""
        try:
            if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
                jobs = self.client("squeue", "-h", "-o", "%i", check=False).stdout.split()
                if jobs:
                    self.client("scancel", *jobs, check=False)
                deadline = time.time() + timeout
                while time.time() < deadline and self.client("squeue", "-h", "-o", "%i", check=False).stdout.split():
                    time.sleep(0.5)
        finally:
            for name in ("slurmd", "slurmctld"):  # the node daemon first: it ends its job steps
                proc = self.procs.get(name)
                if proc is None or proc.poll() is not None:
                    continue
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
