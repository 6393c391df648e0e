#!/usr/bin/env bash
# The commands for a machine with one GPU, sized for a 15-minute lease (at most 10 minutes a command): FLOATER's
# CUDA-graph solve against its loop on real CUDA, every arch in every precision mode on the toy task, and the
# benchmarks; each writes gpu_check.md (+ .json; the benchmarks' reports beside it) in --out-dir after each section.
#   bash scripts/gpu/gpu_check.sh              on the GPU machine, the correctness sections: ≤ 8 min of checks (≤ 9.7
#                                          min with the set-up)
#   bash scripts/gpu/gpu_check.sh --sections bench --out-dir DIR
#                                          the speed section, a second call (≤ 3 min), same machine or next lease
#   bash scripts/gpu/gpu_check.sh --sections invariance --out-dir DIR
#                                          batch invariance and replay (≤ 4 min), a call of its own
#   bash scripts/gpu/gpu_check.sh --sections users_path --out-dir DIR
#                                          train.sh, evaluate.sh, make_tables.py for WMT14 cells on a stand-in
#                                          corpus (≤ 4 min), a call of its own
#   bash scripts/gpu/gpu_check.sh --dry-run    on CPU at the smallest sizes (CUDA graphs emulated): checks the script
# Sections in priority order, each in its own process killed at its cap (--cap NAME=SECONDS): machine 20 s,
# floater_graph 100 s (graph vs loop: solve, Trainer with --update-freq 3 in fp32/amp/fp16/bf16, buckets in both
# orders, memory_reserved against its bound), precision 360 s (every arch × fp16/bf16/amp, 100 updates), bench
# 180 s (T = 64, 256; FLOATER with and without --floater-cuda-graph), invariance 240 s, users_path 240 s (fused
# was removed with --attention-backend flex). A section that fails or times out is reported with
# its reason and the next one runs; the exit status is 1 if any did or any check is out of bounds. Other flags:
# --sections (or all), --out-dir DIR, --data BIN_DIR, --jobs N, --models (scripts/gpu/gpu_check.py --help). The
# converged Multi30k campaign on a GPU lease: scripts/gpu/campaign.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/offline_setup.sh GPU_CHECK_SETUP_SECONDS  # a bare GPU image: set up from the bundle
for arg in "$@"; do
  # the dry run borrows the test layer's CPU emulation of CUDA graphs
  [ "$arg" = --dry-run ] && export PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
done
exec python scripts/gpu/gpu_check.py "$@"
