"""`make gpu-bundle` and the offline set-up it feeds, as on the lent GPU image: a Python whose own venv holds torch,
numpy, Cython, sacrebleu, sentencepiece and torchdiffeq but no fairseq, hydra-core, omegaconf, antlr4 or bitarray,
no package index, no network, no ensurepip (an Ubuntu Python without python3-venv), CUDA_HOME set.
`scripts/gpu/gpu_check.sh --dry-run` sets up from the bundle (a venv over that venv's torch, pip --no-index, fairseq's
Cython parts built from the sdist there) and runs every section.

The image is emulated here by a venv whose site-packages link to this project's venv's packages, less the bundle's;
the bundle is made for this machine's Python (the GPU image's is 3.12: `make gpu-bundle` defaults to that)."""
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO
from helpers.small_task import small_data

PYVER = f"{sys.version_info.major}.{sys.version_info.minor}"
# what the image lacks (top-level names in site-packages), and this checkout's own .pth files
NOT_ON_IMAGE = ("fairseq", "fairseq_cli", "hydra", "omegaconf", "antlr4", "bitarray")


def clean_env(**extra):
    """The environment without this project's venv on PATH or PYTHONPATH."""
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    e["PATH"] = os.pathsep.join(p for p in e.get("PATH", "").split(os.pathsep)
                                if not p.startswith(str(REPO / ".venv")))
    return {**e, **extra}


def make_image(where):
    """A venv (like the image's /opt/torch/.venv) with every package of .venv but the bundle's."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(where)], check=True)
    (site,) = where.glob("lib/python3.*/site-packages")
    (ours,) = (REPO / ".venv").glob("lib/python3.*/site-packages")
    for entry in ours.iterdir():
        name = entry.name.split("-")[0].lower()
        if name in NOT_ON_IMAGE or name.startswith(("hydra_core", "antlr4_python3")) or \
                entry.name.startswith("fairseq_plugins"):
            continue
        (site / entry.name).symlink_to(entry)
    return where / "bin" / "python"


def no_network_prefix():
    """Run in a network namespace of its own (nothing reachable) where the kernel allows it."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0:
        return ["unshare", "-rn"]
    return []


@pytest.mark.slow
def test_offline_setup_from_the_bundle_runs_the_gpu_check(tmp_path_factory, tmp_path):
    data = small_data(tmp_path_factory)
    bundle = tmp_path / "bundle"
    made = subprocess.run(["bash", "scripts/gpu/make_gpu_bundle.sh"], cwd=REPO, capture_output=True, text=True,
                          env=clean_env(PYVER=PYVER, BUNDLE=str(bundle), MULTI30K_DIR=str(tmp_path / "none")),
                          timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    wheels = sorted(p.name.split("-")[0] for p in bundle.glob("*.whl"))
    assert wheels == ["antlr4_python3_runtime", "bitarray", "hydra_core", "omegaconf"]
    assert (bundle / "fairseq-0.12.2.tar.gz").exists() and not list(bundle.glob("torch*"))
    assert not list(tmp_path.glob("bundle.part*"))  # no half-made bundle left

    image_python = make_image(tmp_path / "image")
    probe = subprocess.run([str(image_python), "-c", "import torch, numpy, Cython, sacrebleu\n"
                            "try:\n import fairseq\nexcept ImportError: print('no fairseq')"],
                           capture_output=True, text=True, env=clean_env())
    assert probe.stdout.strip() == "no fairseq", probe.stderr  # the emulated image lacks what the bundle brings

    # an Ubuntu Python without its venv package: `python -m venv` fails at ensurepip (leaving a venv without pip)
    # unless told --without-pip
    no_ensurepip = tmp_path / "image" / "bin" / "python-no-ensurepip"
    no_ensurepip.write_text(f"""#!/usr/bin/env bash
if [ "$1 $2" = "-m venv" ] && [[ " $* " != *" --without-pip "* ]]; then
  "{image_python}" "$@" --without-pip
  echo "The virtual environment was not created successfully because ensurepip is not available." >&2; exit 1
fi
exec "{image_python}" "$@"
""")
    no_ensurepip.chmod(0o755)
    venv, out = tmp_path / "venv", tmp_path / "out"
    started = time.time()
    proc = subprocess.run(
        [*no_network_prefix(), "bash", "scripts/gpu/gpu_check.sh", "--dry-run", "--out-dir", str(out),
         "--data", str(data / "bin")], cwd=REPO, capture_output=True, text=True, timeout=1500,
        env=clean_env(PYTHON=str(no_ensurepip), VENV=str(venv), BUNDLE=str(bundle), CACHE=str(tmp_path / "cache"),
                      CUDA_HOME=str(tmp_path / "cuda"), PIP_NO_CACHE_DIR="1", PIP_NO_INDEX="1",
                      http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9", OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "has no ensurepip" in proc.stdout + proc.stderr  # the venv runs the image's pip instead
    print(f"offline set-up + dry run: {time.time() - started:.0f} s; " +
          next(line for line in proc.stderr.splitlines() if line.startswith("set-up from the bundle")))
    # fairseq was built from the sdist here (its Cython parts compiled), not taken from a cache
    built = list((tmp_path / "cache" / "wheels").glob("*/fairseq-0.12.2-*.whl"))
    assert built and "linux" in built[0].name, built
    # the venv's packages: the bundle's and fairseq in the venv, torch from the image
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import torch, fairseq, hydra, bitarray, fairseq.data.data_utils_fast as c\n"
                            "print(torch.__file__); print(fairseq.__file__); print(hydra.__file__); print(c.__file__)"],
                           capture_output=True, text=True, env=clean_env(), cwd=tmp_path)
    torch_file, fairseq_file, hydra_file, cython_file = where.stdout.split()
    assert torch_file.startswith(str(tmp_path / "image")), torch_file  # the image's torch
    for f in (fairseq_file, hydra_file, cython_file):
        assert f.startswith(str(venv)), f
    assert (out / "gpu_check.md").read_text().startswith("# GPU check — DRY RUN on CPU")
