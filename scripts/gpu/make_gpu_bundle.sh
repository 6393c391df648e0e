#!/usr/bin/env bash
# `make gpu-bundle`: one folder (.gpu_bundle/, ignored by git) holding what a bare GPU image lacks to run this
# project offline: an image that brings Python, torch (with CUDA), numpy, Cython, sacrebleu, sentencepiece and
# torchdiffeq, but no fairseq, hydra-core, omegaconf, antlr4 or bitarray, and no package registry. Nothing torch.
#
#   PYVER=3.12          the image's Python (the wheel with compiled code, bitarray, is built for it)
#   BUNDLE=.gpu_bundle  where it goes
#   MULTI30K_DIR=dir    Multi30k files to take along for scripts/gpu/campaign.sh, the converged Multi30k campaign on a
#                       GPU lease (default ../shared/data/multi30k, left out when absent)
#
# On the GPU machine, `bash scripts/gpu/gpu_check.sh` sets up from it (scripts/setup_env.sh with BUNDLE=.gpu_bundle:
# a venv over the image's torch, pip --no-index, fairseq's Cython parts built there). The folder is written
# under a temporary name and renamed when complete, so a half-made bundle never looks finished; its size is
# checked against the 64 MiB that may travel with the working tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PYVER=${PYVER:-3.12}
BUNDLE=${BUNDLE:-.gpu_bundle}
MULTI30K_DIR=${MULTI30K_DIR:-../shared/data/multi30k}
LIMIT_MIB=${LIMIT_MIB:-40}  # the bundle's share: the working tree (~13 MiB) travels with it within 64 MiB
PY=${PY:-$ROOT/.venv/bin/python}
die() { echo "make_gpu_bundle.sh: $*" >&2; exit 1; }
[[ $PYVER =~ ^3\.(10|11|12|13)$ ]] || die "PYVER=$PYVER: expected one of 3.10, 3.11, 3.12, 3.13"
[ -x "$PY" ] || die "$PY not found: run make setup first (the bundle is made with the project's pip)"
pin() {  # the version requirements.txt pins for $1
  local v
  v=$(sed -n "s/^$1==\([^ ]*\)$/\1/p" requirements.txt)
  [ -n "$v" ] || die "requirements.txt pins no $1"
  echo "$v"
}

# the fairseq sdist, checksum-pinned: setup_env.sh's copy (downloads it once if missing)
eval "$(grep -E '^(SDIST_URL|SDIST_SHA256)=' scripts/setup_env.sh)"
SDIST=$ROOT/.cache/fairseq-0.12.2.tar.gz
if [ ! -f "$SDIST" ]; then
  mkdir -p "$ROOT/.cache"
  echo "gpu-bundle: downloading the fairseq 0.12.2 sdist"
  curl -fsSL --retry 3 -o "$SDIST.part" "$SDIST_URL" && mv "$SDIST.part" "$SDIST"
fi
echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - || die "$SDIST does not match sha256 $SDIST_SHA256"

TMP=$(mktemp -d "${BUNDLE%/}.part.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cp "$SDIST" "$TMP/"
PIP=("$PY" -m pip --disable-pip-version-check --quiet)
# pure-Python wheels (any Python)
"${PIP[@]}" download --no-deps --only-binary=:all: -d "$TMP" \
  "hydra-core==$(pin hydra-core)" "omegaconf==$(pin omegaconf)"
# antlr4-python3-runtime is published as an sdist only: a (pure-Python) wheel built here
"${PIP[@]}" wheel --no-deps --no-binary=:all: -w "$TMP" "antlr4-python3-runtime==$(pin antlr4-python3-runtime)"
# bitarray has C code: the manylinux wheel for the image's Python
"${PIP[@]}" download --no-deps --only-binary=:all: -d "$TMP" --implementation cp --python-version "$PYVER" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  "bitarray==$(pin bitarray)"
if [ -s "$MULTI30K_DIR/train.en" ]; then  # the campaign's data (the folder beside the checkout does not travel)
  mkdir "$TMP/multi30k"
  for split in train val test_2016_flickr; do cp "$MULTI30K_DIR/$split".{en,de} "$TMP/multi30k/"; done
fi
(cd "$TMP" && { echo "# made by scripts/gpu/make_gpu_bundle.sh for Python $PYVER"; sha256sum -- *.whl *.tar.gz; } \
  > MANIFEST)
size_kib=$(du -sk "$TMP" | cut -f1)
(( size_kib <= LIMIT_MIB * 1024 )) || die "the bundle is $((size_kib / 1024)) MiB: expected at most $LIMIT_MIB MiB"
rm -rf "$BUNDLE"
mv "$TMP" "$BUNDLE"
trap - EXIT
echo "gpu-bundle: $BUNDLE ($((size_kib / 1024)) MiB, Python $PYVER):" $(cd "$BUNDLE" && ls)
