"""A fairseq as a user's cluster has it: the PyPI release 0.12.2 with none of this project's patch but its first part,
third_party/fairseq-0.12.2/01-compat.patch: what Python 3.11, numpy >= 1.24, torch >= 2.6 and hydra-core 1.3 need to
build it, import it and load its checkpoints at all (none of the fixes, plugin hooks or the fast update of the parts
after it). Made once per content of that part and torch in .cache/: the release's Python packages with it, and the
compiled extensions of the venv's fairseq (no part changes a compiled source), in a folder that goes first on
PYTHONPATH, so that the venv's torch, hydra-core and the rest serve both fairseqs."""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import fairseq
import torch

from conftest import REPO

PATCHES = REPO / "third_party" / "fairseq-0.12.2"  # its parts, applied in their names' order
COMPAT = PATCHES / "01-compat.patch"
# where scripts/setup_env.sh keeps what it downloads and builds: $CACHE (default .cache), the sdist there
# (checksum-pinned) unless $FAIRSEQ_SDIST names one
CACHE = REPO / os.environ.get("CACHE", ".cache")
SDIST = Path(os.environ.get("FAIRSEQ_SDIST") or CACHE / "fairseq-0.12.2.tar.gz")


def patched_files(patch_text):
    """The paths a patch changes (its '--- a/' lines)."""
    return re.findall(r"^--- a/(\S+)", patch_text, flags=re.M)


def stock_fairseq():
    """The folder holding the stock-equivalent fairseq package (built and installed once)."""
    text = COMPAT.read_text()
    key = hashlib.sha256(text.encode()).hexdigest()[:12]
    pyver = "%d.%d" % sys.version_info[:2]
    target = CACHE / f"fairseq-0.12.2-stock-{key}-py{pyver}-torch{torch.__version__}"
    if (target / ".done").exists():
        return target
    assert SDIST.exists(), f"{SDIST}: the fairseq sdist (make setup downloads it)"
    compiled = [f for part in sorted(PATCHES.glob("*.patch")) for f in patched_files(part.read_text())
                if f.endswith((".c", ".cpp", ".cu", ".h", ".pyx"))]
    assert not compiled, f"the patches change compiled sources ({compiled}): build the stock tree's own extensions"
    with tempfile.TemporaryDirectory() as build:
        subprocess.run(["tar", "xzf", str(SDIST), "--no-same-owner", "-C", build], check=True)
        src = Path(build) / "fairseq-0.12.2"
        subprocess.run(["patch", "-p1", "--quiet"], input=text, text=True, cwd=src, check=True)
        partial = target.with_name(target.name + ".part")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        for package in ("fairseq", "fairseq_cli"):
            shutil.copytree(src / package, partial / package)
        # The compiled extensions (libbleu, the data utilities): the patch changes none of their sources, so the
        # venv's, built from the same sources against this torch, are the release's; copied, not built again
        installed = Path(fairseq.__file__).parent
        for ext in installed.rglob("*.so"):
            shutil.copy2(ext, partial / "fairseq" / ext.relative_to(installed))
        partial.rename(target)
    (target / ".done").touch()
    return target
