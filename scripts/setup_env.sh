#!/usr/bin/env bash
# One-shot, idempotent environment set-up: .venv/ with torch, patched fairseq 0.12.2 and the pinned
# requirements. A rerun whose inputs (this script, requirements.txt, the patch) are unchanged exits at once.
#
#   PYTHON=python3.11   interpreter for the venv (must be 3.11)
#   VENV=.venv          where the venv goes
#   FAIRSEQ_SDIST=path  use a local copy of fairseq-0.12.2.tar.gz instead of downloading it
#
# torch: if PYTHON already has torch >= 2.1 (a cluster's CUDA build), the venv is created with
# --system-site-packages and that torch is used as is; otherwise torch==2.13.0 is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
VENV=${VENV:-.venv}
CACHE=$ROOT/.cache
SDIST_URL=https://files.pythonhosted.org/packages/30/36/db42846570f479ac859be3b48d8b47f2ae9b0b9c77487a512f2f2ecbcb6b/fairseq-0.12.2.tar.gz
SDIST_SHA256=34f1b18426bf3844714534162f065ab733e049597476daa35fffb4d06a92b524
PATCH=$ROOT/third_party/fairseq-0.12.2.patch

stamp_inputs() { cat scripts/setup_env.sh requirements.txt "$PATCH" | sha256sum | cut -c1-16; }
STAMP=$(stamp_inputs)
if [ -f "$VENV/.setup-stamp" ] && [ "$(cat "$VENV/.setup-stamp")" = "$STAMP" ]; then
  exit 0
fi

"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null ||
  { echo "setup_env.sh: PYTHON=$PYTHON must be Python 3.11" >&2; exit 1; }

has_torch() {  # prints the version if torch >= 2.1 is importable
  "$1" - <<'PY' 2>/dev/null
import torch, re
major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
assert (major, minor) >= (2, 1)
print(torch.__version__)
PY
}

if [ ! -x "$VENV/bin/python" ]; then
  if has_torch "$PYTHON" >/dev/null; then
    echo "setup: using the torch $(has_torch "$PYTHON") already installed for $PYTHON"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
PY=$ROOT/$VENV/bin/python
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

if ! has_torch "$PY" >/dev/null; then
  echo "setup: installing torch==2.13.0"
  "${PIP[@]}" torch==2.13.0
fi
# --no-deps: never let a requirement pull in (and replace) torch.
"${PIP[@]}" --no-deps -r requirements.txt

# fairseq: official sdist (checksum-pinned) + our patch, built once into a cached wheel.
TORCH_VER=$(has_torch "$PY")
PATCH_SHA=$(sha256sum "$PATCH" | cut -c1-12)
WHEEL_DIR=$CACHE/wheels/fairseq-0.12.2-$PATCH_SHA-torch$TORCH_VER
mkdir -p "$CACHE" "$WHEEL_DIR"
if ! ls "$WHEEL_DIR"/fairseq-*.whl >/dev/null 2>&1; then
  SDIST=${FAIRSEQ_SDIST:-$CACHE/fairseq-0.12.2.tar.gz}
  if [ ! -f "$SDIST" ]; then
    echo "setup: downloading fairseq 0.12.2 sdist"
    curl -fsSL --retry 3 -o "$SDIST.part" "$SDIST_URL"
    mv "$SDIST.part" "$SDIST"
  fi
  echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - ||
    { echo "setup_env.sh: $SDIST does not match sha256 $SDIST_SHA256" >&2; exit 1; }
  BUILD=$(mktemp -d)
  trap 'rm -rf "$BUILD"' EXIT
  tar xzf "$SDIST" -C "$BUILD"
  (cd "$BUILD/fairseq-0.12.2" && patch -p1 --quiet < "$PATCH")
  echo "setup: building the fairseq wheel (once; cached in $WHEEL_DIR)"
  "$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$BUILD/wheel" "$BUILD/fairseq-0.12.2"
  mv "$BUILD"/wheel/fairseq-*.whl "$WHEEL_DIR"/
fi
"${PIP[@]}" --no-deps --force-reinstall "$WHEEL_DIR"/fairseq-*.whl

# `import fairseq_plugins` from anywhere in the venv (Python API), as an editable install would.
"$PY" -c "import site, sys; open(site.getsitepackages()[0] + '/fairseq_plugins_repo.pth', 'w').write(sys.argv[1] + '\\n')" "$ROOT"
"$PY" -c "import fairseq, fairseq_cli, fairseq_plugins, torch; print('setup: fairseq', fairseq.__version__, '| torch', torch.__version__)"
echo "$STAMP" > "$VENV/.setup-stamp"
