#!/usr/bin/env bash
# Beam-search one split with a checkpoint and score it with sacrebleu against the raw reference.
#   scripts/generate.sh DATA_DIR CHECKPOINT SUBSET OUT_JSON [extra fairseq-generate args]
# DATA_DIR is a prepare_bitext.sh output (bin/, spm.model, raw/ or RAW_DIR). Writes OUT_JSON, and the
# generate log and detokenized hypotheses beside it (OUT_JSON minus .json, + .gen / .hyp).
# BEAM (default 4), LENPEN (default 0.6: the papers' length penalty), SRC/TGT (default src/tgt), DEVICE (cpu, the
# default: --cpu; cuda: fairseq's default device).
# REUSE=1: keep an existing OUT_JSON (and its .hyp) instead of decoding again when it is newer than the
# checkpoint and records the same checkpoint, subset, reference, beam, length penalty and extra arguments.
set -euo pipefail
DATA=$1 CKPT=$2 SUBSET=$3 OUT=$4
shift 4
SRC=${SRC:-src} TGT=${TGT:-tgt}
RAW=${RAW_DIR:-$DATA/raw}
case ${DEVICE:-cpu} in
  cpu) device=(--cpu) ;;
  cuda) device=() ;;
  *) echo "generate.sh: DEVICE=$DEVICE: expected cpu or cuda" >&2; exit 2 ;;
esac
[ -f "$CKPT" ] || { echo "generate.sh: checkpoint $CKPT not found" >&2; exit 1; }
base=${OUT%.json}
meta=("checkpoint=$CKPT" "subset=$SUBSET" "reference=$RAW/$SUBSET.$TGT" "beam=${BEAM:-4}"
      "lenpen=${LENPEN:-0.6}" "generate_args=$*")
if [ "${REUSE:-0}" = 1 ] && [ "$OUT" -nt "$CKPT" ] && [ -s "$base.hyp" ] &&
   python - "$OUT" "${meta[@]}" <<'PY'
import json, sys
try:
    recorded = json.load(open(sys.argv[1], encoding="utf-8"))
except ValueError:
    sys.exit(1)
sys.exit(any(recorded.get(k) != v for k, v in (kv.split("=", 1) for kv in sys.argv[2:])))
PY
then
  echo "reusing $OUT (newer than $CKPT, same decoding settings)"
  exit 0
fi
mkdir -p "$(dirname "$OUT")"
fairseq-generate "$DATA/bin" --user-dir fairseq_plugins --path "$CKPT" --gen-subset "$SUBSET" \
  --source-lang "$SRC" --target-lang "$TGT" --beam "${BEAM:-4}" --lenpen "${LENPEN:-0.6}" \
  --max-tokens "${MAX_TOKENS:-8000}" ${device[@]+"${device[@]}"} --num-workers 0 "$@" > "$base.gen.tmp" 2> "$base.gen.err" ||
  { tail -3 "$base.gen.err" >&2; exit 1; }
mv "$base.gen.tmp" "$base.gen"
python "$(dirname "$0")/score.py" --generate-log "$base.gen" --spm "$DATA/spm.model" \
  --ref "$RAW/$SUBSET.$TGT" --out "$OUT" --hyp-out "$base.hyp" --meta "${meta[@]}"
