#!/usr/bin/env bash
# make demo: the toy task end to end on CPU -- data, tiny models trained with one budget, BLEU table.
# A rerun reuses the data and the finished checkpoints (fairseq resumes from checkpoint_last.pt).
#   MODELS="transformer_tiny relative_transformer_tiny floater_transformer_tiny"  (archs to train)
#   EPOCHS=12  (the shared budget)
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=${MODELS:-"transformer_tiny relative_transformer_tiny floater_transformer_tiny"}
OUT=results/demo
mkdir -p "$OUT"

[ -s data/toy/raw/test_long.tgt ] || python scripts/make_toy_data.py --out data/toy/raw
bash scripts/prepare_bitext.sh data/toy/raw data/toy src tgt 400 test_long

for arch in $MODELS; do
  exp=toy_${arch%_tiny}
  echo "== $arch: training (log: checkpoints/$exp/train.log)"
  mkdir -p "checkpoints/$exp"
  start=$(date +%s)
  bash scripts/train_toy.sh "$exp" "$arch" > "checkpoints/$exp/train.log" 2>&1 ||
    { tail -5 "checkpoints/$exp/train.log" >&2; exit 1; }
  echo "   trained in $(( $(date +%s) - start )) s"
  for subset in test test_long; do
    bash scripts/generate.sh data/toy "checkpoints/$exp/checkpoint_best.pt" "$subset" "$OUT/$exp.$subset.json" \
      | sed 's/^/   /'
  done
done

python - "$OUT" $MODELS <<'PY'
import json, sys
out, archs = sys.argv[1], sys.argv[2:]
rows = ["| model | test BLEU (3-20 words) | test_long BLEU (21-80 words) |", "|---|---|---|"]
for arch in archs:
    exp = "toy_" + arch.removesuffix("_tiny")
    s = [json.load(open(f"{out}/{exp}.{sub}.json"))["bleu"] for sub in ("test", "test_long")]
    rows.append(f"| {arch} | {s[0]:.1f} | {s[1]:.1f} |")
table = "\n".join(rows)
open(f"{out}/table.md.tmp", "w").write(table + "\n")
import os; os.replace(f"{out}/table.md.tmp", f"{out}/table.md")
print("\n" + table + f"\n\nresults: {out}/*.json, table: {out}/table.md")
PY
