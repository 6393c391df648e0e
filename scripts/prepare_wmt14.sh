#!/usr/bin/env bash
# WMT14 English-German / English-French, from the statmt.org archives to fairseq binarized data.
#
#   scripts/prepare_wmt14.sh en-de|en-fr [--from DIR] [--out DIR] [--vocab N] [--download-dir DIR]
#                            [--checksums FILE]
#
# The corpora are those of fairseq's examples/translation/prepare-wmt14en2de.sh --icml17 (WMT14 data only) and
# prepare-wmt14en2fr.sh, the data both papers train on:
#   en-de  train  europarl-v7 + commoncrawl + news-commentary-v9                          (~4.5M pairs)
#   en-fr  train  europarl-v7 + commoncrawl + UN (undoc.2000) + news-commentary-v9 + giga-fren   (~36M pairs)
#   both   valid  newstest2013 (dev.tgz, the papers' development set)
#          test   newstest2014, the full 3003-sentence version (test-full.tgz), as the papers' BLEU tables
#
# Steps (each skipped on a rerun once done; every file is written under a temporary name and renamed when
# complete, and a step's marker is written after its files, so a killed run is safe to rerun):
#   1. archives: taken from --from DIR (already downloaded; nothing is fetched), or downloaded into
#      --download-dir (default data/wmt14_downloads) with resume (curl -C -), then checked against
#      --checksums (default scripts/wmt14_checksums.txt; an archive without a recorded checksum is reported
#      with its sha256 for recording);
#   2. the needed members are extracted to OUT/orig/;
#   3. train: normalised (non-printing characters removed, whitespace collapsed) and cleaned like Moses'
#      clean-corpus-n.perl -ratio 1.5 (1..250 tokens) -> OUT/raw/train.{en,XX};
#      valid/test: text of the SGML segments, as sacrebleu extracts them -> OUT/raw/{valid,test}.{en,XX}
#      (scripts/wmt14_data.py documents both);
#   4. a joint sentencepiece model (BPE) on train, both sides, and fairseq-preprocess --joined-dictionary:
#      scripts/prepare_bitext.sh OUT/raw OUT en XX VOCAB -> OUT/spm.model, OUT/bin/.
#
# Vocabulary (--vocab, a joint sentencepiece BPE vocabulary): default 32768 for en-de and 40000 for en-fr. The
# papers differ: Shaw et al. used 32,768 word-pieces for both pairs; FLOATER used fairseq's scripts, i.e.
# 40k joint BPE merges for both. One vocabulary per pair serves both papers' tables here; pass --vocab to
# match one paper exactly (the configs do not depend on it).
#
# Output (default --out data/wmt14_en_de or data/wmt14_en_fr, where configs/pair/*.yaml look):
#   OUT/raw/{train,valid,test}.{en,XX}   plain text (test.XX is the sacrebleu reference)
#   OUT/spm.model, OUT/bin/              sentencepiece model, fairseq data
# Environment: WORKERS (fairseq-preprocess workers, default 2), SPM_TRAIN_SENTENCES (default 2000000), PY,
# WMT14_URL_BASE (default https://www.statmt.org: a mirror with the same wmt10/ wmt13/ wmt14/ layout).
set -euo pipefail
SCRIPTS=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$SCRIPTS")
PY=${PY:-python}
die() { echo "prepare_wmt14.sh: $*" >&2; exit 1; }
usage() { echo "usage: $0 en-de|en-fr [--from DIR] [--out DIR] [--vocab N] [--download-dir DIR] [--checksums FILE]" >&2; exit 2; }

[ $# -ge 1 ] || usage
PAIR=$1
shift
case "$PAIR" in
  en-de) TGT=de VOCAB=32768 ;;
  en-fr) TGT=fr VOCAB=40000 ;;
  *) usage ;;
esac
FROM="" OUT="$ROOT/data/wmt14_${PAIR/-/_}" DL="$ROOT/data/wmt14_downloads" SUMS="$SCRIPTS/wmt14_checksums.txt"
while [ $# -gt 0 ]; do
  case "$1" in
    --from) FROM=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --vocab) VOCAB=${2:?}; shift 2 ;;
    --download-dir) DL=${2:?}; shift 2 ;;
    --checksums) SUMS=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
[[ "$VOCAB" =~ ^[0-9]+$ ]] || die "--vocab must be a number, got '$VOCAB'"
[ -z "$FROM" ] || [ -d "$FROM" ] || die "--from $FROM: no such directory"
[ -f "$SUMS" ] || die "checksum file $SUMS not found"
export PATH="$ROOT/.venv/bin:$PATH"

BASE=${WMT14_URL_BASE:-https://www.statmt.org}  # another mirror of statmt.org's layout (wmt10/, wmt13/, wmt14/)
# archive name | URL | members needed (paths inside the archive)
if [ "$PAIR" = en-de ]; then
  ARCHIVES=(
    "training-parallel-europarl-v7.tgz|$BASE/wmt13/training-parallel-europarl-v7.tgz|training/europarl-v7.de-en.en training/europarl-v7.de-en.de"
    "training-parallel-commoncrawl.tgz|$BASE/wmt13/training-parallel-commoncrawl.tgz|commoncrawl.de-en.en commoncrawl.de-en.de"
    "training-parallel-nc-v9.tgz|$BASE/wmt14/training-parallel-nc-v9.tgz|training/news-commentary-v9.de-en.en training/news-commentary-v9.de-en.de"
    "dev.tgz|$BASE/wmt14/dev.tgz|dev/newstest2013-src.en.sgm dev/newstest2013-ref.de.sgm"
    "test-full.tgz|$BASE/wmt14/test-full.tgz|test-full/newstest2014-deen-src.en.sgm test-full/newstest2014-deen-ref.de.sgm"
  )
  CORPORA=(training/europarl-v7.de-en commoncrawl.de-en training/news-commentary-v9.de-en)
  TEST_SGM=test-full/newstest2014-deen
else
  ARCHIVES=(
    "training-parallel-europarl-v7.tgz|$BASE/wmt13/training-parallel-europarl-v7.tgz|training/europarl-v7.fr-en.en training/europarl-v7.fr-en.fr"
    "training-parallel-commoncrawl.tgz|$BASE/wmt13/training-parallel-commoncrawl.tgz|commoncrawl.fr-en.en commoncrawl.fr-en.fr"
    "training-parallel-un.tgz|$BASE/wmt13/training-parallel-un.tgz|un/undoc.2000.fr-en.en un/undoc.2000.fr-en.fr"
    "training-parallel-nc-v9.tgz|$BASE/wmt14/training-parallel-nc-v9.tgz|training/news-commentary-v9.fr-en.en training/news-commentary-v9.fr-en.fr"
    "training-giga-fren.tar|$BASE/wmt10/training-giga-fren.tar|giga-fren.release2.fixed.en.gz giga-fren.release2.fixed.fr.gz"
    "dev.tgz|$BASE/wmt14/dev.tgz|dev/newstest2013-src.en.sgm dev/newstest2013-ref.fr.sgm"
    "test-full.tgz|$BASE/wmt14/test-full.tgz|test-full/newstest2014-fren-src.en.sgm test-full/newstest2014-fren-ref.fr.sgm"
  )
  CORPORA=(training/europarl-v7.fr-en commoncrawl.fr-en un/undoc.2000.fr-en training/news-commentary-v9.fr-en
           giga-fren.release2.fixed)
  TEST_SGM=test-full/newstest2014-fren
fi

mkdir -p "$OUT/orig" "$OUT/raw" "$OUT/.done"
done_marker() { [ -f "$OUT/.done/$1" ]; }
mark_done() { touch "$OUT/.done/$1"; }

# 1 + 2. archives: locate (or download), verify, extract
for entry in "${ARCHIVES[@]}"; do
  IFS='|' read -r name url members <<< "$entry"
  done_marker "extract.$name" && continue
  if [ -n "$FROM" ]; then
    archive="$FROM/$name"
    [ -f "$archive" ] || die "missing archive $archive (expected the WMT14 download $url)"
  else
    archive="$DL/$name"
    if [ ! -f "$archive" ]; then
      mkdir -p "$DL"
      echo "downloading $url" >&2
      curl -fL --retry 5 --retry-delay 10 --progress-bar -C - -o "$archive.part" "$url" ||
        die "download of $url failed (rerun to resume $archive.part)"
      mv "$archive.part" "$archive"
    fi
  fi
  "$PY" "$SCRIPTS/wmt14_data.py" verify "$archive" --checksums "$SUMS"
  # shellcheck disable=SC2086  # members are space-separated paths without spaces
  "$PY" "$SCRIPTS/wmt14_data.py" extract "$archive" "$OUT/orig" $members
  mark_done "extract.$name"
done

# 3. text
if ! done_marker train; then
  pairs=()
  for corpus in "${CORPORA[@]}"; do pairs+=(--pair "$OUT/orig/$corpus.en" "$OUT/orig/$corpus.$TGT"); done
  "$PY" "$SCRIPTS/wmt14_data.py" clean "${pairs[@]}" --out-prefix "$OUT/raw/train" --src en --tgt "$TGT"
  mark_done train
fi
if ! done_marker dev_test; then
  "$PY" "$SCRIPTS/wmt14_data.py" sgm "$OUT/orig/dev/newstest2013-src.en.sgm" "$OUT/raw/valid.en"
  "$PY" "$SCRIPTS/wmt14_data.py" sgm "$OUT/orig/dev/newstest2013-ref.$TGT.sgm" "$OUT/raw/valid.$TGT"
  "$PY" "$SCRIPTS/wmt14_data.py" sgm "$OUT/orig/$TEST_SGM-src.en.sgm" "$OUT/raw/test.en"
  "$PY" "$SCRIPTS/wmt14_data.py" sgm "$OUT/orig/$TEST_SGM-ref.$TGT.sgm" "$OUT/raw/test.$TGT"
  for split in valid test; do "$PY" "$SCRIPTS/wmt14_data.py" aligned "$OUT/raw/$split.en" "$OUT/raw/$split.$TGT"; done
  mark_done dev_test
fi

# 4. joint sentencepiece + binarize (skips its own finished steps); a different --vocab needs a new --out
if [ -f "$OUT/.done/vocab" ] && [ "$(cat "$OUT/.done/vocab")" != "$VOCAB" ]; then
  die "$OUT was prepared with --vocab $(cat "$OUT/.done/vocab"), not $VOCAB (use another --out)"
fi
[ -f "$OUT/.done/vocab" ] || echo "$VOCAB" > "$OUT/.done/vocab"
PY=$PY bash "$SCRIPTS/prepare_bitext.sh" "$OUT/raw" "$OUT" en "$TGT" "$VOCAB"
for split in train valid test; do
  printf '%s %s lines\n' "$OUT/raw/$split.en" "$(wc -l < "$OUT/raw/$split.en")"
done
