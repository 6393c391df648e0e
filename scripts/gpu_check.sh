#!/usr/bin/env bash
# One command for a machine with one GPU (about 25 minutes on an H100): FLOATER's CUDA-graph solve against its
# loop on real CUDA, every arch in every precision mode on the toy task, and the benchmark; writes
# results/gpu_check.md (+ .json, gpu_check_bench.md). Commit them.
#   bash scripts/gpu_check.sh              on the GPU machine
#   bash scripts/gpu_check.sh --dry-run    on CPU at the smallest sizes (CUDA graphs emulated): checks the script
# Other flags: --out-dir DIR, --data BIN_DIR, --jobs N (scripts/gpu_check.py --help).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .venv/bin/activate ] && source .venv/bin/activate
for arg in "$@"; do
  # the dry run borrows the test layer's CPU emulation of CUDA graphs
  [ "$arg" = --dry-run ] && export PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
done
exec python scripts/gpu_check.py "$@"
