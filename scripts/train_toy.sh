#!/usr/bin/env bash
# Train one tiny model on the embedded toy task (CPU), same recipe for every arch.
#   scripts/train_toy.sh EXPERIMENT ARCH [extra fairseq-train args]
# Checkpoints: checkpoints/EXPERIMENT/. Rerunning resumes from checkpoint_last.pt (fairseq's default).
# DATA (default data/toy/bin), EPOCHS (default 12), SEED (default 1), SAVE_DIR (default checkpoints/EXPERIMENT).
set -euo pipefail
EXP=$1 ARCH=$2
shift 2
DATA=${DATA:-data/toy/bin}
fairseq-train "$DATA" --user-dir fairseq_plugins --arch "$ARCH" --share-all-embeddings \
  --optimizer adam --adam-betas '(0.9,0.98)' --lr 2e-3 --lr-scheduler inverse_sqrt --warmup-updates 300 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --dropout 0.1 \
  --max-tokens 4096 --max-epoch "${EPOCHS:-12}" --seed "${SEED:-1}" \
  --cpu --num-workers 0 --save-dir "${SAVE_DIR:-checkpoints/$EXP}" --no-epoch-checkpoints \
  --log-format simple --log-interval 100 "$@"
