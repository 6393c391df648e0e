#!/usr/bin/env bash
# One-shot, idempotent environment set-up: .venv/ with torch, patched fairseq 0.12.2 and the pinned
# requirements. A rerun whose inputs (this script, requirements.txt, the fairseq patches in third_party/fairseq-0.12.2/)
# are unchanged installs nothing: it only points the venv at this checkout's code (a venv shared by two checkouts
# imports the last one set up).
#   scripts/setup_env.sh [--stamp]   (--stamp: print the stamp a venv set up from these inputs records, and exit)
#
#   PYTHON=python3.11   interpreter for the venv (Python 3.10 to 3.13; default python3.11, else python3)
#   VENV=.venv          where the venv goes
#   FAIRSEQ_SDIST=path  use a local copy of fairseq-0.12.2.tar.gz instead of downloading it
#   CACHE=.cache        where the patched fairseq wheel is built once and kept
#   BUNDLE=dir          offline: install from a folder made by `make gpu-bundle` (scripts/gpu/make_gpu_bundle.sh), with
#                       no package index; PYTHON must bring torch and the rest of requirements.txt (a GPU image)
#
# torch: if PYTHON already has torch (a cluster's CUDA build), the venv is created with
# --system-site-packages and that torch is used as is, never replaced: one older than TORCH_FLOOR in
# fairseq_plugins/__init__.py stops the set-up before anything is written. Without torch, torch==2.13.0 is installed.
# PYTHON may itself be a venv's (as on GPU images): the new venv then also sees that venv's packages (a .pth file),
# which --system-site-packages alone would not. CUDA_HOME is ignored: fairseq's CUDA extensions are not built.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
VENV=${VENV:-.venv}
CACHE=${CACHE:-$ROOT/.cache}  # where the fairseq wheel is built and kept
SDIST_URL=https://files.pythonhosted.org/packages/30/36/db42846570f479ac859be3b48d8b47f2ae9b0b9c77487a512f2f2ecbcb6b/fairseq-0.12.2.tar.gz
SDIST_SHA256=34f1b18426bf3844714534162f065ab733e049597476daa35fffb4d06a92b524
# fairseq's patch in parts (compatibility, fixes, plugin hooks, the fast update), applied in this (the names') order
PATCHES=("$ROOT"/third_party/fairseq-0.12.2/[0-9][0-9]-*.patch)
[ -f "${PATCHES[0]}" ] ||
  { echo "setup_env.sh: no NN-*.patch in $ROOT/third_party/fairseq-0.12.2/: expected 01-compat.patch and the rest" >&2; exit 1; }
# their names and contents, in order: a change to any of them, or to their order, is a new fairseq
patches_sha() { (cd "$ROOT/third_party/fairseq-0.12.2" && sha256sum [0-9][0-9]-*.patch) | sha256sum | cut -c1-16; }
case $VENV in /*) PY=$VENV/bin/python ;; *) PY=$ROOT/$VENV/bin/python ;; esac

# What is installed depends on these inputs only; which checkout the venv imports is set apart (link_checkout), so
# that a venv shared by several checkouts imports the code of the one that last ran the set-up, at no reinstall.
stamp_inputs() { { cat scripts/setup_env.sh requirements.txt; patches_sha; echo "${BUNDLE:-}"; } | sha256sum | cut -c1-16; }
STAMP=$(stamp_inputs)
if [ "${1:-}" = --stamp ]; then  # the stamp a venv set up from this checkout's inputs records
  echo "$STAMP"; exit 0
fi
# `import fairseq_plugins` from anywhere in the venv (Python API), as an editable install would, and the scripts'
# shared library `tooling` (scripts/tooling/): this checkout's, written under a temporary name and renamed.
link_checkout() {
  local site pth
  site=$("$PY" -c 'import site; print(site.getsitepackages()[0])')
  pth=$site/fairseq_plugins_repo.pth
  if [ "$(cat "$pth" 2>/dev/null)" != "$(printf '%s\n' "$ROOT" "$ROOT/scripts")" ]; then
    printf '%s\n' "$ROOT" "$ROOT/scripts" > "$pth.tmp.$$"
    mv -f "$pth.tmp.$$" "$pth"
    echo "setup: $VENV now imports fairseq_plugins and tooling from $ROOT"
  fi
}
if [ -f "$VENV/.setup-stamp" ] && [ "$(cat "$VENV/.setup-stamp")" = "$STAMP" ]; then
  link_checkout
  exit 0
fi

PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
  { echo "setup_env.sh: PYTHON=$PYTHON does not run: expected a Python 3.10 to 3.13 interpreter" >&2; exit 1; }
[[ $PYVER =~ ^3\.1[0-3]$ ]] ||
  { echo "setup_env.sh: PYTHON=$PYTHON is Python $PYVER: expected Python 3.10 to 3.13" >&2; exit 1; }
if [ -n "${BUNDLE:-}" ]; then  # offline: nothing may come from an index
  [ -f "$BUNDLE/MANIFEST" ] || { echo "setup_env.sh: BUNDLE=$BUNDLE: expected a folder made by make gpu-bundle (no MANIFEST)" >&2; exit 1; }
  BUNDLE=$(cd "$BUNDLE" && pwd)
  export PIP_NO_INDEX=1 PIP_FIND_LINKS=$BUNDLE
  FAIRSEQ_SDIST=${FAIRSEQ_SDIST:-$BUNDLE/fairseq-0.12.2.tar.gz}
fi

# One torch floor for the set-up and for `import fairseq_plugins`.
TORCH_FLOOR=$(sed -n 's/^TORCH_FLOOR = "\([0-9]*\.[0-9]*\)"$/\1/p' fairseq_plugins/__init__.py)
[ -n "$TORCH_FLOOR" ] || { echo "setup_env.sh: no TORCH_FLOOR = \"X.Y\" line in fairseq_plugins/__init__.py" >&2; exit 1; }
torch_version() {  # the torch version the interpreter $1 imports; nothing without (a working) torch
  "$1" -c 'import torch; print(torch.__version__)' 2>/dev/null | tail -n 1 || true
}
version_key() { [[ $1 =~ ^([0-9]+)\.([0-9]+) ]] && echo $(( BASH_REMATCH[1] * 1000 + BASH_REMATCH[2] )); }
check_torch() {  # $1: a torch version, $2: where it is; one below the floor is never replaced: stop
  local have
  have=$(version_key "$1") || have=0
  (( have >= $(version_key "$TORCH_FLOOR") )) ||
    { echo "setup_env.sh: $2 has torch $1, this project needs torch >= $TORCH_FLOOR (upgrade that torch, or use a PYTHON without torch to get torch==2.13.0 in the venv)" >&2; exit 1; }
}

if [ ! -x "$VENV/bin/python" ]; then
  SYS_TORCH=$(torch_version "$PYTHON")
  if [ -n "$SYS_TORCH" ]; then
    check_torch "$SYS_TORCH" "PYTHON=$PYTHON"  # before the venv exists: a refusal leaves nothing behind
    echo "setup: using the torch $SYS_TORCH already installed for $PYTHON"
    # A Debian/Ubuntu Python without its venv package has no ensurepip: then a venv without pip of its own,
    # which runs PYTHON's pip through the .pth below
    if ! "$PYTHON" -m venv --system-site-packages "$VENV" > "$VENV.log" 2>&1; then
      rm -rf "$VENV"
      "$PYTHON" -m venv --system-site-packages --without-pip "$VENV" ||
        { cat "$VENV.log" >&2; rm -rf "$VENV" "$VENV.log"; exit 1; }
      echo "setup: $PYTHON has no ensurepip: $VENV uses its pip"
    fi
    rm -f "$VENV.log"
    # PYTHON's own packages (its venv's, if it is one: a nested venv sees only the base interpreter's)
    "$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' \
      > "$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')/fairseq_plugins_base.pth"
    "$VENV/bin/python" -m pip --version > /dev/null 2>&1 ||
      { echo "setup_env.sh: PYTHON=$PYTHON has neither ensurepip nor pip: expected one of them" >&2; rm -rf "$VENV"; exit 1; }
  elif [ -n "${BUNDLE:-}" ]; then
    echo "setup_env.sh: BUNDLE=$BUNDLE carries no torch: expected a PYTHON with torch >= $TORCH_FLOOR installed" >&2
    exit 1
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

TORCH_VER=$(torch_version "$PY")
if [ -z "$TORCH_VER" ]; then
  echo "setup: installing torch==2.13.0"
  "${PIP[@]}" torch==2.13.0
  TORCH_VER=$(torch_version "$PY")
else
  check_torch "$TORCH_VER" "$VENV"  # e.g. a venv made earlier on a system torch since downgraded
fi
if [ -n "${BUNDLE:-}" ]; then
  # the bundle's wheels; everything else in requirements.txt comes with PYTHON (checked by the imports below)
  "${PIP[@]}" --no-deps "$BUNDLE"/*.whl
else
  # --no-deps: never let a requirement pull in (and replace) torch.
  "${PIP[@]}" --no-deps -r requirements.txt
fi

# fairseq: official sdist (checksum-pinned) + our patches, built once into a cached wheel.
PATCH_SHA=$(patches_sha | cut -c1-12)
WHEEL_DIR=$CACHE/wheels/fairseq-0.12.2-$PATCH_SHA-py$PYVER-torch$TORCH_VER
mkdir -p "$CACHE" "$WHEEL_DIR"
if ! ls "$WHEEL_DIR"/fairseq-*.whl >/dev/null 2>&1; then
  SDIST=${FAIRSEQ_SDIST:-$CACHE/fairseq-0.12.2.tar.gz}
  if [ ! -f "$SDIST" ] && [ -z "${BUNDLE:-}" ]; then
    echo "setup: downloading fairseq 0.12.2 sdist"
    curl -fsSL --retry 3 -o "$SDIST.part" "$SDIST_URL"
    mv "$SDIST.part" "$SDIST"
  fi
  echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - ||
    { echo "setup_env.sh: $SDIST does not match sha256 $SDIST_SHA256" >&2; exit 1; }
  BUILD=$(mktemp -d)
  trap 'rm -rf "$BUILD"' EXIT
  tar xzf "$SDIST" --no-same-owner -C "$BUILD"  # the sdist's owner ids need not exist here
  for p in "${PATCHES[@]}"; do
    (cd "$BUILD/fairseq-0.12.2" && patch -p1 --quiet < "$p") ||
      { echo "setup_env.sh: $p does not apply to the fairseq 0.12.2 sdist after the parts before it" >&2; exit 1; }
  done
  echo "setup: building the fairseq wheel (once; cached in $WHEEL_DIR)"
  env -u CUDA_HOME -u CUDA_PATH "$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$BUILD/wheel" \
    "$BUILD/fairseq-0.12.2"
  mv "$BUILD"/wheel/fairseq-*.whl "$WHEEL_DIR"/
fi
"${PIP[@]}" --no-deps --force-reinstall "$WHEEL_DIR"/fairseq-*.whl

link_checkout
"$PY" -c "import fairseq, fairseq_cli, fairseq_plugins, tooling, torch, sacrebleu, sentencepiece, torchdiffeq; print('setup: fairseq', fairseq.__version__, '| torch', torch.__version__, '| Python', '$PYVER')"
echo "$STAMP" > "$VENV/.setup-stamp"
