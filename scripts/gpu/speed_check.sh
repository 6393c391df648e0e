#!/usr/bin/env bash
# The training update's speed on one GPU in one call of at most 7 minutes, set-up from the carried bundle included:
# fairseq's default update against --fused-update --adam-impl torch, base and big dims, bf16/fp16/amp at 8,192 and
# 16,384 tokens (scripts/gpu/speed_check.py; docs/benchmarks.md).
#   bash scripts/gpu/speed_check.sh --out-dir "$OUT"              on the GPU machine (carry .gpu_bundle)
#   bash scripts/gpu/speed_check.sh --dry-run --out-dir DIR       on CPU, tiny dims: checks the script
set -euo pipefail
cd "$(dirname "$0")/../.."
export SPEED_CHECK_STARTED=${SPEED_CHECK_STARTED:-$(date +%s.%N)}
source scripts/gpu/offline_setup.sh SPEED_CHECK_SETUP_SECONDS  # a bare GPU image: set up from the bundle
exec python scripts/gpu/speed_check.py "$@"
