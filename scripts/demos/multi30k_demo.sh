#!/usr/bin/env bash
# Real-text recipe: Multi30k task 1 (image captions), the demo's three models with one budget, BLEU overall and by
# source length under a train-short / test-long protocol, table + plot.
#
#   MULTI30K_DIR=../shared/data/multi30k scripts/demos/multi30k_demo.sh  # local copy: train/val/test_2016_flickr.{en,de,fr}
#   scripts/demos/multi30k_demo.sh                                   # otherwise downloads the public task-1 files
#
# Protocol: train on training pairs whose source has <= MAX_TRAIN_LEN words (default 14: 79% of the
# corpus), validate on val, test on the full test_2016_flickr (1000 sentences) bucketed by source length, so
# the last buckets hold sentences longer than any seen in training.
#   PAIR=en-de|en-fr (default en-de), MODELS, EPOCHS (default 12, as the toy demo), MAX_TRAIN_LEN, VOCAB (8000),
#   EDGES, SMALL_MODEL_ARGS; DATA_DIR, CKPT_ROOT, OUT_DIR (default data/, checkpoints/, results/multi30k_SRCTGT).
# Idempotent: reuses prepared data and finished checkpoints.
set -euo pipefail
cd "$(dirname "$0")/../.."
PAIR=${PAIR:-en-de}
SRC=${PAIR%-*} TGT=${PAIR#*-}
MODELS=${MODELS:-"transformer_tiny relative_transformer_tiny floater_transformer_tiny"}
MAX_TRAIN_LEN=${MAX_TRAIN_LEN:-14}
EDGES=${EDGES:-1,10,15,20,inf}
# 3+3 layers, d=128, 4 heads, FFN 512 on top of the *_tiny archs: enough for real text, ~1.5 min per epoch on 2 cores.
SMALL_MODEL_ARGS=${SMALL_MODEL_ARGS:-"--encoder-embed-dim 128 --decoder-embed-dim 128 --encoder-ffn-embed-dim 512 \
--decoder-ffn-embed-dim 512 --encoder-layers 3 --decoder-layers 3 --encoder-attention-heads 4 --decoder-attention-heads 4"}
DATA=${DATA_DIR:-data/multi30k_$SRC$TGT}
OUT=${OUT_DIR:-results/multi30k_$SRC$TGT}
CKPT_ROOT=${CKPT_ROOT:-checkpoints}
URL=https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw

if [ -z "${MULTI30K_DIR:-}" ]; then
  MULTI30K_DIR=data/multi30k_download
  mkdir -p "$MULTI30K_DIR"
  for split in train val test_2016_flickr; do
    for lang in "$SRC" "$TGT"; do
      f=$MULTI30K_DIR/$split.$lang
      [ -s "$f" ] && continue
      curl -fsSL --retry 3 -C - -o "$f.gz.part" "$URL/$split.$lang.gz"
      gunzip -c "$f.gz.part" > "$f.tmp" && mv "$f.tmp" "$f" && rm -f "$f.gz.part"
    done
  done
fi

for split in train val test_2016_flickr; do
  for lang in "$SRC" "$TGT"; do
    [ -s "$MULTI30K_DIR/$split.$lang" ] ||
      { echo "multi30k_demo.sh: MULTI30K_DIR=$MULTI30K_DIR lacks $split.$lang (expected train, val, test_2016_flickr .$SRC/.$TGT)" >&2; exit 1; }
  done
done
mkdir -p "$DATA/raw" "$OUT"
if [ ! -s "$DATA/raw/test.$TGT" ]; then
  python scripts/filter_by_length.py --max-words "$MAX_TRAIN_LEN" \
    --src "$MULTI30K_DIR/train.$SRC" --tgt "$MULTI30K_DIR/train.$TGT" --out-prefix "$DATA/raw/train"
  for lang in "$SRC" "$TGT"; do
    cp "$MULTI30K_DIR/val.$lang" "$DATA/raw/valid.$lang.tmp" && mv "$DATA/raw/valid.$lang.tmp" "$DATA/raw/valid.$lang"
    cp "$MULTI30K_DIR/test_2016_flickr.$lang" "$DATA/raw/test.$lang.tmp" && mv "$DATA/raw/test.$lang.tmp" "$DATA/raw/test.$lang"
  done
fi
bash scripts/prepare_bitext.sh "$DATA/raw" "$DATA" "$SRC" "$TGT" "${VOCAB:-8000}"

lengths=()
for arch in $MODELS; do
  exp=multi30k_$SRC${TGT}_${arch%_tiny}
  echo "== $arch on Multi30k $SRC-$TGT (log: $CKPT_ROOT/$exp/train.log)"
  mkdir -p "$CKPT_ROOT/$exp"
  start=$(date +%s)
  # shellcheck disable=SC2086
  EPOCHS=${EPOCHS:-12} bash scripts/train_small.sh "$DATA/bin" "$CKPT_ROOT/$exp" "$arch" $SMALL_MODEL_ARGS \
    --max-source-positions 512 --max-target-positions 512 >> "$CKPT_ROOT/$exp/train.log" 2>&1 ||
    { tail -5 "$CKPT_ROOT/$exp/train.log" >&2; exit 1; }
  echo "   trained in $(( $(date +%s) - start )) s"
  ckpt=$CKPT_ROOT/$exp/checkpoint_best.pt
  REUSE=1 SRC=$SRC TGT=$TGT bash scripts/generate.sh "$DATA" "$ckpt" test "$OUT/$exp.test.json" | sed 's/^/   /'
  python scripts/length_eval.py score --name "${arch%_tiny}" --edges "$EDGES" --src "$DATA/raw/test.$SRC" \
    --ref "$DATA/raw/test.$TGT" --hyp "$OUT/$exp.test.hyp" --out "$OUT/$exp.length.json" > /dev/null
  lengths+=("$OUT/$exp.length.json")
done

echo
echo "Multi30k $SRC-$TGT test_2016_flickr BLEU by source length (training sentences have <= $MAX_TRAIN_LEN words):"
python scripts/length_eval.py table "${lengths[@]}" --out "$OUT/table.md"
python scripts/length_eval.py plot "${lengths[@]}" --out "$OUT/length.png" --train-max-len "$MAX_TRAIN_LEN" \
  --title "Multi30k $SRC-$TGT: BLEU by source length" > /dev/null
echo "results: $OUT/"
