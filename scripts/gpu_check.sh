#!/usr/bin/env bash
# One command for a machine with one GPU (about 25 minutes on an H100): FLOATER's CUDA-graph solve against its
# loop on real CUDA, every arch in every precision mode on the toy task, and the benchmark; writes
# results/gpu_check.md (+ .json, gpu_check_bench.md). Commit them.
#   bash scripts/gpu_check.sh              on the GPU machine
#   bash scripts/gpu_check.sh --dry-run    on CPU at the smallest sizes (CUDA graphs emulated): checks the script
# Other flags: --out-dir DIR, --data BIN_DIR, --jobs N (scripts/gpu_check.py --help).
set -euo pipefail
cd "$(dirname "$0")/.."
# On a bare GPU image (Python and torch, nothing else, no package index): set up offline from the carried
# bundle (`make gpu-bundle` here; BUNDLE=dir to name another) over the image's python3 and its torch.
VENV=${VENV:-.venv}
if [ -n "${BUNDLE:-}" ] || { [ ! -f "$VENV/.setup-stamp" ] && [ -f .gpu_bundle/MANIFEST ]; }; then
  started=$SECONDS
  PYTHON=${PYTHON:-python3} VENV=$VENV BUNDLE=${BUNDLE:-.gpu_bundle} bash scripts/setup_env.sh
  export GPU_CHECK_SETUP_SECONDS=$((SECONDS - started))
  echo "set-up from the bundle: $GPU_CHECK_SETUP_SECONDS s" >&2
fi
[ -f "$VENV/bin/activate" ] && source "$VENV/bin/activate"
for arg in "$@"; do
  # the dry run borrows the test layer's CPU emulation of CUDA graphs
  [ "$arg" = --dry-run ] && export PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
done
exec python scripts/gpu_check.py "$@"
