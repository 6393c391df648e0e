#!/usr/bin/env bash
# scripts/submit_paper.py tried small, on the cluster one is logged into: three WMT14 cells (a Transformer, its
# FLOATER warm start, Shaw's relative) shrunk to tiny models on the toy task, trained and evaluated by CPU jobs,
# then the tables job. About a minute on an idle node; everything under OUT, nothing in checkpoints/ or results/.
#
#   bash scripts/demos/slurm_tryout.sh [submit_paper.py options ...]
#   squeue -u "$USER"                               # the jobs, as a real submission's
#   cat checkpoints/slurm_tryout/results/tables.md  # once the tables job has ended: the three cells filled
#
# Options go to submit_paper.py after the try-out's own (--sbatch="--partition=X" where the default partition does
# not take CPU jobs, --dry-run to see the job graph). Environment:
#   OUT=checkpoints/slurm_tryout  (its data, checkpoints, logs, manifest and results)
#   CELLS="..."                   (other cells than the three, shrunk the same way)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ ! -d .venv/bin ] || export PATH="$PWD/.venv/bin:$PATH"  # make setup's environment, for this script and the jobs
OUT=${OUT:-checkpoints/slurm_tryout}
CELLS=${CELLS:-"wmt14_en_de_base_transformer wmt14_en_de_base_floater_all_warm wmt14_en_de_base_relative"}
DATA=$OUT/data/wmt14_en_de  # shaped like scripts/prepare_wmt14.sh's output: raw/, spm.model, bin/

if [ ! -s "$DATA/bin/dict.de.txt" ]; then
  python scripts/make_toy_data.py --out "$OUT/data/toy" --train 600 --valid 30 --test 30 --test-long 2
  mkdir -p "$DATA/raw"
  for split in train valid test; do
    cp "$OUT/data/toy/$split.src" "$DATA/raw/$split.en"
    cp "$OUT/data/toy/$split.tgt" "$DATA/raw/$split.de"
  done
  bash scripts/prepare_bitext.sh "$DATA/raw" "$DATA" en de 200
fi
DATA=$(cd "$DATA" && pwd)

# the jobs read CPU and OMP_NUM_THREADS from this environment (sbatch exports it)
export CPU=1 OMP_NUM_THREADS=1
TINY=(encoder_embed_dim=16 decoder_embed_dim=16 encoder_ffn_embed_dim=32 decoder_ffn_embed_dim=32 encoder_layers=1
      decoder_layers=1 encoder_attention_heads=2 decoder_attention_heads=2)
overrides=("--override=task.data=$DATA/bin")
for kv in "${TINY[@]}"; do overrides+=("--override=++model.$kv"); done
overrides+=(--override=optimization.max_update=4 "--override=optimization.update_freq=[1]"
            --override=dataset.max_tokens=1024 --override=dataset.max_valid_steps=1 --override=dataset.num_workers=0)
# shellcheck disable=SC2086
exec python scripts/submit_paper.py $CELLS --checkpoints "$OUT" --results "$OUT/results" \
  --eval-args="--cpu --data-dir $DATA --checkpoint-kind last" \
  --warm-args="--arch floater_transformer" \
  --train="--ntasks=1 --cpus-per-task=1" --eval="--ntasks=1 --cpus-per-task=1" \
  "${overrides[@]}" "$@"
