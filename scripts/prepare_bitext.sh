#!/usr/bin/env bash
# Raw parallel text -> joint sentencepiece -> fairseq binarized data (--joined-dictionary).
#
#   scripts/prepare_bitext.sh RAW_DIR OUT_DIR SRC TGT VOCAB_SIZE [EXTRA_TEST_SPLIT ...]
#
# RAW_DIR holds {train,valid,test}.{SRC,TGT} (+ each EXTRA_TEST_SPLIT.{SRC,TGT}), one untokenized sentence a
# line, line-aligned. Writes OUT_DIR/spm.model, OUT_DIR/spm/<split>.<lang> (pieces) and OUT_DIR/bin/ (fairseq
# data; extra splits keep their own names, e.g. --gen-subset test_long). Every step writes to a temporary
# name and renames, and is skipped on a rerun when its output exists, so an interrupted run is safe to rerun.
# SPM_TRAIN_SENTENCES caps the sentences sentencepiece samples for training (default 2000000).
set -euo pipefail
if [ $# -lt 5 ]; then
  echo "usage: $0 RAW_DIR OUT_DIR SRC TGT VOCAB_SIZE [EXTRA_TEST_SPLIT ...]" >&2; exit 2
fi
RAW=$1 OUT=$2 SRC=$3 TGT=$4 VOCAB=$5
shift 5
EXTRA=("$@")
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python}

SPLITS=(train valid test "${EXTRA[@]}")
for split in "${SPLITS[@]}"; do
  for lang in "$SRC" "$TGT"; do
    # empty: no line with text (blank lines only would crash sentencepiece training)
    grep -q '[^[:space:]]' "$RAW/$split.$lang" 2>/dev/null ||
      { echo "prepare_bitext.sh: missing or empty file $RAW/$split.$lang" >&2; exit 1; }
  done
  # awk counts a last line without its newline too (wc -l does not)
  ns=$(awk 'END { print NR }' "$RAW/$split.$SRC"); nt=$(awk 'END { print NR }' "$RAW/$split.$TGT")
  [ "$ns" = "$nt" ] || {
    echo "prepare_bitext.sh: $RAW/$split.$SRC has $ns lines but $RAW/$split.$TGT has $nt (must be line-aligned)" >&2; exit 1; }
done
# every file is UTF-8 text, checked before anything is written: sentencepiece and fairseq fail on other bytes
# with errors that name neither the file nor the line
for split in "${SPLITS[@]}"; do
  for lang in "$SRC" "$TGT"; do
    "$PY" - "$RAW/$split.$lang" <<'PYEOF' || exit 1
import sys
path = sys.argv[1]
with open(path, "rb") as f:
    for number, line in enumerate(f, 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            sys.exit(f"prepare_bitext.sh: {path} line {number} is not UTF-8 (byte 0x{line[e.start]:02x} at "
                     f"offset {e.start}); re-encode the file, e.g. iconv -f latin1 -t utf-8")
PYEOF
  done
done
echo "prepare_bitext.sh: $RAW checked (${#SPLITS[@]} splits of $SRC-$TGT, line-aligned UTF-8)"
mkdir -p "$OUT/spm"

# 1. joint sentencepiece model on train (both sides)
if [ ! -s "$OUT/spm.model" ]; then
  echo "prepare_bitext.sh: 1/3 training the joint sentencepiece model ($VOCAB pieces) on $RAW/train.{$SRC,$TGT}"
  # a fixed temporary name: a rerun after an interruption replaces it instead of leaving a stray directory,
  # and spm.model, which records its model prefix, is the same file on every run with the same paths
  tmp=$OUT/spm.tmp
  rm -rf "$tmp"
  mkdir -p "$tmp"
  "$PY" "$HERE/spm_train.py" --input "$RAW/train.$SRC" "$RAW/train.$TGT" --model-prefix "$tmp/spm" \
    --vocab-size "$VOCAB" --max-sentences "${SPM_TRAIN_SENTENCES:-2000000}"
  mv "$tmp/spm.vocab" "$OUT/spm.vocab"
  mv "$tmp/spm.model" "$OUT/spm.model"  # last: its presence marks the step done
  rm -rf "$tmp"
fi

# 2. encode every split into pieces
for split in "${SPLITS[@]}"; do
  for lang in "$SRC" "$TGT"; do
    dst="$OUT/spm/$split.$lang"
    if [ ! -f "$dst" ]; then
      echo "prepare_bitext.sh: 2/3 encoding $RAW/$split.$lang into pieces"
      "$PY" "$HERE/spm_encode.py" --model "$OUT/spm.model" < "$RAW/$split.$lang" > "$dst.tmp"
      mv "$dst.tmp" "$dst"
    fi
  done
done

# 3. binarize with one joined dictionary
if [ ! -f "$OUT/bin/.done" ]; then
  echo "prepare_bitext.sh: 3/3 binarizing with one joined dictionary (fairseq-preprocess, log: $OUT/preprocess.log)"
  rm -rf "$OUT/bin.tmp"
  fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" --joined-dictionary \
    --trainpref "$OUT/spm/train" --validpref "$OUT/spm/valid" --testpref "$OUT/spm/test" \
    --destdir "$OUT/bin.tmp" --workers "${WORKERS:-2}" --thresholdsrc 0 --thresholdtgt 0 > "$OUT/preprocess.log" 2>&1 ||
    { tail -5 "$OUT/preprocess.log" >&2; exit 1; }
  for split in "${EXTRA[@]}"; do  # extra test splits, binarized with the same dictionary under their own name
    fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" --srcdict "$OUT/bin.tmp/dict.$SRC.txt" \
      --tgtdict "$OUT/bin.tmp/dict.$TGT.txt" --testpref "$OUT/spm/$split" --destdir "$OUT/bin.tmp/$split.tmp" \
      --workers "${WORKERS:-2}" >> "$OUT/preprocess.log" 2>&1 || { tail -5 "$OUT/preprocess.log" >&2; exit 1; }
    for f in "$OUT/bin.tmp/$split.tmp"/test.*; do mv "$f" "$OUT/bin.tmp/$split.${f##*/test.}"; done
    rm -rf "$OUT/bin.tmp/$split.tmp"
  done
  touch "$OUT/bin.tmp/.done"
  rm -rf "$OUT/bin"
  mv "$OUT/bin.tmp" "$OUT/bin"
fi
echo "binarized data in $OUT/bin"
