"""A fairseq as a user's cluster has it: the PyPI release 0.12.2 with none of this project's patch but the hunks that
Python 3.11, numpy >= 1.24 and torch >= 2.6 need to import it, build it and load its checkpoints at all
(``COMPAT_FILES``). Made once per patch content and torch in .cache/: the release's Python packages with those hunks,
and the compiled extensions of the venv's fairseq (the patch changes no compiled source), in a folder that goes first
on PYTHONPATH, so that the venv's torch, hydra-core and the rest serve both fairseqs."""
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import fairseq
import torch

from conftest import REPO

PATCH = REPO / "third_party" / "fairseq-0.12.2.patch"
SDIST = REPO / ".cache" / "fairseq-0.12.2.tar.gz"  # scripts/setup_env.sh downloads it (checksum-pinned)
# The patch's files whose hunks only make the release run here; what is left out is every fix and feature:
# FP16Optimizer, the BetterTransformer path, legacy_ddp's hook, the trainer's and options' messages, --adam-impl,
# the CPU DDP device ids, decoding precision, the patch marker. configs.py also carries the --bf16 help text.
COMPAT_FILES = (
    "setup.py",  # hydra-core 1.3 / omegaconf 2.3 (1.0 / 2.0 do not import on 3.11), no torchaudio, the shipped extensions
    "fairseq/dataclass/configs.py", "fairseq/dataclass/initialize.py",  # mutable dataclass defaults (3.11)
    "fairseq/models/transformer/transformer_config.py",  # the same
    "fairseq/data/data_utils.py", "fairseq/modules/dynamic_crf_layer.py",  # np.int, np.float (numpy 1.24)
    "fairseq/checkpoint_utils.py", "fairseq/distributed/utils.py",  # torch.load's weights_only default (torch 2.6)
)


def file_sections(patch_text):
    """{path: its part of the patch}: a part starts at its 'diff -ruN' line or, without one, its '--- a/' line."""
    starts = [(m.start(), m.group(1) or m.group(2)) for m in
              re.finditer(r"^(?:diff -ruN a/(\S+) \S+\n)?--- a/(\S+)", patch_text, flags=re.M)]
    ends = [s for s, _ in starts[1:]] + [len(patch_text)]
    return {path: patch_text[start:end] for (start, path), end in zip(starts, ends)}


def compat_patch():
    sections = file_sections(PATCH.read_text())
    missing = [f for f in COMPAT_FILES if f not in sections]
    assert not missing, f"{PATCH} has no hunk for {missing}"
    return "".join(sections[f] for f in COMPAT_FILES)


def stock_fairseq():
    """The folder holding the stock-equivalent fairseq package (built and installed once)."""
    text = compat_patch()
    key = hashlib.sha256(text.encode()).hexdigest()[:12]
    pyver = "%d.%d" % sys.version_info[:2]
    target = REPO / ".cache" / f"fairseq-0.12.2-stock-{key}-py{pyver}-torch{torch.__version__}"
    if (target / ".done").exists():
        return target
    assert SDIST.exists(), f"{SDIST}: the fairseq sdist (make setup downloads it)"
    compiled = [f for f in file_sections(PATCH.read_text()) if f.endswith((".c", ".cpp", ".cu", ".h", ".pyx"))]
    assert not compiled, f"the patch changes compiled sources ({compiled}): build the stock tree's own extensions"
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
