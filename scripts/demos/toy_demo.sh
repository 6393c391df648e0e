#!/usr/bin/env bash
# make demo: the toy task end to end on CPU -- data, tiny models trained with one budget, BLEU overall and by
# source length (train <= 20 words; test 3-20, test_long 21-80), a table and a plot.
# A rerun reuses the data, the finished checkpoints (fairseq resumes from checkpoint_last.pt) and their
# translations.
#   MODELS="transformer_tiny relative_transformer_tiny floater_transformer_tiny"  (archs to train; a model name of
#     the table of schemes, e.g. rope or learned, means its tiny arch and flags; MODELS=all: every scheme)
#   EPOCHS=12  (the shared budget)
#   OUT=results/demo  (where the tables, plot and translations go)
set -euo pipefail
cd "$(dirname "$0")/../.."
MODELS=${MODELS:-"transformer_tiny relative_transformer_tiny floater_transformer_tiny"}
OUT=${OUT:-results/demo}  # where the tables, plot and translations go
EDGES=1,11,21,31,41,61,81
[ "$MODELS" != all ] || MODELS=$(python -m fairseq_plugins models)  # the table of schemes
# shellcheck disable=SC2086
spec_lines=$(python -m fairseq_plugins arch $MODELS) || exit 1  # arch and flags each; one line if unknown
mapfile -t specs <<< "$spec_lines"
mkdir -p "$OUT"

[ -s data/toy/raw/test_long.tgt ] || python scripts/make_toy_data.py --out data/toy/raw
bash scripts/prepare_bitext.sh data/toy/raw data/toy src tgt 400 test_long

read -r -a names <<< "$MODELS"
lengths=()
for i in "${!specs[@]}"; do
  read -r arch flags <<< "${specs[$i]}"
  name=${names[$i]}
  exp=toy_${arch%_tiny}
  [ -z "$flags" ] || exp=toy_${name}_transformer  # a scheme that is flags on another's arch (learned)
  echo "== $arch${flags:+ $flags}: training (log: checkpoints/$exp/train.log)"
  mkdir -p "checkpoints/$exp"
  start=$(date +%s)
  # a line per epoch with its validation loss; the whole log in train.log
  # shellcheck disable=SC2086
  bash scripts/train_small.sh data/toy/bin "checkpoints/$exp" "$arch" $flags 2>&1 |
    python scripts/epoch_progress.py "checkpoints/$exp/train.log" --prefix "   $arch " ||
    { tail -5 "checkpoints/$exp/train.log" >&2; exit 1; }
  echo "   trained in $(( $(date +%s) - start )) s"
  for subset in test test_long; do
    REUSE=1 bash scripts/generate.sh data/toy "checkpoints/$exp/checkpoint_best.pt" "$subset" \
      "$OUT/$exp.$subset.json" | sed 's/^/   /'
  done
  python scripts/length_eval.py score --name "${exp#toy_}" --edges "$EDGES" \
    --src data/toy/raw/test.src data/toy/raw/test_long.src --ref data/toy/raw/test.tgt data/toy/raw/test_long.tgt \
    --hyp "$OUT/$exp.test.hyp" "$OUT/$exp.test_long.hyp" --out "$OUT/$exp.length.json" > /dev/null
  lengths+=("$OUT/$exp.length.json")
done

echo
echo "BLEU on the toy test sets by source length (training sentences have <= 20 words):"
python scripts/length_eval.py table "${lengths[@]}" --out "$OUT/table.md"
python scripts/length_eval.py plot "${lengths[@]}" --out "$OUT/length.png" --train-max-len 20 \
  --title "Toy SVO->SOV task: BLEU by source length" > /dev/null
echo
echo "results: $OUT/table.md, plot: $OUT/length.png, per-split JSON: $OUT/*.json"
