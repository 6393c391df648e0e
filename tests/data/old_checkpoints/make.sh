#!/usr/bin/env bash
# Remake this folder's checkpoints with the code of one commit (the code before SHAPE's --shape-eval-offset and
# T5's --t5-bias-init: c442711), so that tests/test_old_checkpoints.py checks that today's code loads them and
# translates exactly as the code that trained them did.
#
#   tests/data/old_checkpoints/make.sh [COMMIT]      # from the repository root, the venv on PATH
#
# Writes dict.en.txt, dict.de.txt (one joined dictionary), shape.pt, t5.pt (fairseq-train, 3 updates of a
# 1+1-layer d = 16 model on 48 sentence pairs, no optimizer state) and reference.pt (that code's outputs on
# one fixed batch: eval-mode log-probabilities, and SHAPE's training-mode first-block input under seed 0).
set -euo pipefail
COMMIT=${1:-c442711}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
git archive "$COMMIT" | tar -x -C "$WORK" fairseq_plugins
cd "$WORK"
source "$HERE/toy_task.sh"
for scheme in shape t5; do
  OMP_NUM_THREADS=1 fairseq-train bin --user-dir fairseq_plugins --arch "${scheme}_transformer_tiny" "${DIMS[@]}" \
    --source-lang en --target-lang de \
    --share-all-embeddings --optimizer adam --lr 1e-3 --criterion label_smoothed_cross_entropy --dropout 0 \
    --max-tokens 256 --max-update 3 --seed 1 --cpu --num-workers 0 --save-dir "ckpt_$scheme" \
    --no-epoch-checkpoints --no-save-optimizer-state --no-last-checkpoints > "train_$scheme.log" 2>&1 ||
    { tail -5 "train_$scheme.log" >&2; exit 1; }
  cp "ckpt_$scheme/checkpoint_best.pt" "$HERE/$scheme.pt"
done
cp bin/dict.en.txt bin/dict.de.txt "$HERE/"
# the old code's outputs, computed by the old code (its fairseq_plugins first on the path)
PYTHONPATH=$WORK python - "$HERE" <<'PY'
import sys
import torch
from fairseq import checkpoint_utils, utils
from argparse import Namespace

here = sys.argv[1]
utils.import_user_module(Namespace(user_dir="fairseq_plugins"))
src = torch.tensor([[4, 5, 6, 7, 8, 9, 10, 2], [1, 1, 11, 12, 13, 5, 6, 2]])  # left-padded, as fairseq batches
prev = torch.tensor([[2, 10, 9, 8, 7, 6, 5, 4], [2, 6, 5, 13, 12, 11, 1, 1]])
lengths = src.ne(1).sum(1)
reference = {"src": src, "prev": prev}
for scheme in ("shape", "t5"):
    (model,), _ = checkpoint_utils.load_model_ensemble(
        [f"{here}/{scheme}.pt"], arg_overrides={"data": here})
    model.eval()
    with torch.no_grad():
        out = model(src, lengths, prev)
        reference[f"{scheme}_eval"] = model.get_normalized_probs(out, log_probs=True)
        if scheme == "shape":  # training mode: the offsets SHAPE drew under seed 0 (dropout is 0)
            model.train()
            seen = []
            hook = model.encoder.layers[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
            torch.manual_seed(0)
            model(src, lengths, prev)
            hook.remove()
            reference["shape_train_first_block"] = seen[0]
torch.save(reference, f"{here}/reference.pt")
PY
ls -la "$HERE"
