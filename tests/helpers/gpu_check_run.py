"""Running scripts/gpu/gpu_check.sh from the tests, and what its committed output may not hold."""
import subprocess

from conftest import REPO, env


def gpu_check(*argv, extra_env=None, timeout=900):
    return subprocess.run(["bash", "scripts/gpu/gpu_check.sh", *argv], cwd=REPO,
                          env={**env(), "OMP_NUM_THREADS": "1", **(extra_env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def no_machine_paths(out, tmp_path):
    for f in out.iterdir():  # no path of this machine in what gets committed
        for path in (str(REPO), str(tmp_path), "/tmp/", "/home/"):
            assert path not in f.read_text(), (f.name, path)
    assert not list(out.glob(".*"))  # no temporary file left
