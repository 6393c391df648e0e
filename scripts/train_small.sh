#!/usr/bin/env bash
# Train one small model on CPU (or, DEVICE=cuda, on the GPU): the one training command of the toy demo and the Multi30k recipes (fairseq-train,
# one process, shared embeddings, Adam (0.9, 0.98), inverse-sqrt schedule, label-smoothed cross-entropy 0.1).
#
#   scripts/train_small.sh DATA_BIN SAVE_DIR ARCH [fairseq-train args: dimensions, scheme flags, ...]
#
# Run from the repository root (or a snapshot's). Rerunning resumes from SAVE_DIR/checkpoint_last.pt (fairseq's
# default). Environment, defaults the toy task's: LR (2e-3), WARMUP (300 updates), DROPOUT (0.1), MAX_TOKENS
# (4096), EPOCHS (12), SEED (1), KEEP_LAST (0: no epoch checkpoints, only checkpoint_best/last.pt; N: keep the
# last N epoch checkpoints, for averaging), LOG_INTERVAL (100), DEVICE (cpu: --cpu; cuda: fairseq's default device),
# FAIRSEQ_TRAIN (fairseq-train: the command given these arguments; scripts/gpu/campaign.py's throughput probe times the
# same command's updates through its own).
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 DATA_BIN SAVE_DIR ARCH [fairseq-train args ...]" >&2; exit 2
fi
DATA=$1 SAVE=$2 ARCH=$3
shift 3
case ${DEVICE:-cpu} in
  cpu) device=(--cpu) ;;
  cuda) device=() ;;
  *) echo "train_small.sh: DEVICE=$DEVICE: expected cpu or cuda" >&2; exit 2 ;;
esac
if [ "${KEEP_LAST:-0}" = 0 ]; then keep=(--no-epoch-checkpoints); else keep=(--keep-last-epochs "$KEEP_LAST"); fi
read -ra train <<< "${FAIRSEQ_TRAIN:-fairseq-train}"
exec "${train[@]}" "$DATA" --user-dir fairseq_plugins --arch "$ARCH" --share-all-embeddings \
  --optimizer adam --adam-betas '(0.9,0.98)' --lr "${LR:-2e-3}" --lr-scheduler inverse_sqrt \
  --warmup-updates "${WARMUP:-300}" --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --dropout "${DROPOUT:-0.1}" --max-tokens "${MAX_TOKENS:-4096}" --max-epoch "${EPOCHS:-12}" --seed "${SEED:-1}" \
  ${device[@]+"${device[@]}"} --num-workers 0 --save-dir "$SAVE" "${keep[@]}" --log-format simple --log-interval "${LOG_INTERVAL:-100}" "$@"
