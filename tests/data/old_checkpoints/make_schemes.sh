#!/usr/bin/env bash
# Remake schemes/: one small checkpoint of every position scheme and architecture family of one commit's table
# (SCHEMES: fairseq_plugins/modules/position_schemes.py at 9d4ae10, fairseq_plugins/schemes.py since), written
# and run by that commit's code, so
# that tests/test_old_checkpoints.py checks that later code, however it restructures the schemes, loads them
# under their registered architecture names and computes and decodes exactly as the code that wrote them.
# (make.sh's checkpoints are older, c442711, and check flags added since then.)
#
#   tests/data/old_checkpoints/make_schemes.sh [COMMIT]      # from the repository root, the venv on PATH
#   OUT=schemes_a1b2c3d tests/data/old_checkpoints/make_schemes.sh a1b2c3d    # another commit's set beside it
#
# Writes schemes/ (or OUT/): dict.en.txt, dict.de.txt (one joined dictionary), <fixture>.pt (fairseq-train, 3 updates of a
# 1+1-layer d = 16 model (2+2 where the table below says why) on make.sh's 48 sentence pairs, no optimizer
# state; floater_warm.pt converted from sinusoidal.pt by scripts/transformer_to_floater.py), reference.pt (that
# code's outputs, tests/helpers/old_checkpoints.py: eval-mode log-probabilities on one batch, greedy and beam-3
# hypotheses) and manifest.json (the commit, torch and fairseq versions, each fixture's arch and flags, the
# table's schemes then).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
COMMIT=$(git -C "$ROOT" rev-parse "${1:-9d4ae10}^{commit}")
HERE=$ROOT/tests/data/old_checkpoints/${OUT:-schemes}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
git -C "$ROOT" archive "$COMMIT" fairseq_plugins scripts/transformer_to_floater.py scripts/tooling | tar -x -C "$WORK"
cp "$ROOT/tests/helpers/old_checkpoints.py" "$WORK/"
# that commit's code first (the venv's .pth puts another checkout's on the path too)
export PYTHONPATH=$WORK:$WORK/scripts OMP_NUM_THREADS=1
cd "$WORK"
source "$ROOT/tests/data/old_checkpoints/toy_task.sh"
# fixture  arch  flags (after the dimensions above): every row of the table at its tiny size with the table's
# flags; every-layer positions and FLOATER with 2+2 blocks (with one block they would equal the sinusoidal model
# and FLOATER's input-only variant); learned positions for 32 positions (a 1024-row table would triple the file);
# RoPE with inference-time scaling stored in the checkpoint; a different scheme in each stack
FIXTURES="
sinusoidal   transformer_tiny
learned      transformer_tiny                  --encoder-learned-pos --decoder-learned-pos --max-source-positions 32 --max-target-positions 32
every_layer  transformer_every_layer_pos_tiny  --encoder-layers 2 --decoder-layers 2
shape        shape_transformer_tiny
t5           t5_transformer_tiny
alibi        alibi_transformer_tiny
kerple       kerple_transformer_tiny
fire         fire_transformer_tiny
rope         rope_transformer_tiny
rope_ntk     rope_transformer_tiny             --rope-scaling ntk --rope-scaling-factor 2
nope         nope_transformer_tiny
shaw         relative_transformer_tiny
floater      floater_transformer_tiny          --floater-layers all --encoder-layers 2 --decoder-layers 2
mixed        position_transformer              --encoder-position-scheme t5 --decoder-position-scheme rope
"
# the schemes added to the table after 9d4ae10, where the commit's table has them
table=$(python -c 'from fairseq_plugins.schemes import SCHEMES; print(" ".join(SCHEMES))' 2> /dev/null || true)
for row in "cape cape_transformer_tiny" "randomized randomized_transformer_tiny" \
           "alibi_sync alibi_sync_transformer_tiny"; do
  [[ " $table " == *" ${row%% *} "* ]] && FIXTURES+="$row"$'\n'
done
mkdir -p out
while read -r name arch flags; do
  [ -n "$name" ] || continue
  # shellcheck disable=SC2086  # flags: words
  fairseq-train bin --user-dir fairseq_plugins --arch "$arch" "${DIMS[@]}" $flags --source-lang en --target-lang de \
    --share-all-embeddings --optimizer adam --lr 1e-3 --criterion label_smoothed_cross_entropy --dropout 0 \
    --max-tokens 256 --max-update 3 --seed 1 --cpu --num-workers 0 --save-dir "ckpt_$name" \
    --no-epoch-checkpoints --no-save-optimizer-state --no-last-checkpoints > "train_$name.log" 2>&1 ||
    { tail -5 "train_$name.log" >&2; exit 1; }
  cp "ckpt_$name/checkpoint_best.pt" "out/$name.pt"
  echo "$name $arch $flags" >> out/fixtures.txt
done <<< "$FIXTURES"
python scripts/transformer_to_floater.py out/sinusoidal.pt out/floater_warm.pt --arch floater_transformer > /dev/null
echo "floater_warm floater_transformer (scripts/transformer_to_floater.py sinusoidal.pt)" >> out/fixtures.txt
cp bin/dict.en.txt bin/dict.de.txt out/
# that commit's outputs, computed by that commit's code
python - "$COMMIT" <<'PY'
import json
import sys
from argparse import Namespace

import fairseq
import torch
from fairseq import utils

utils.import_user_module(Namespace(user_dir="fairseq_plugins"))
try:  # the table's place moved after 9d4ae10
    from fairseq_plugins.schemes import SCHEMES  # noqa: E402
except ImportError:
    from fairseq_plugins.modules.position_schemes import SCHEMES  # noqa: E402

import old_checkpoints  # noqa: E402

fixtures = {}
for line in open("out/fixtures.txt"):
    name, arch, *flags = line.split()
    fixtures[name] = {"arch": arch, "flags": " ".join(flags)}
missing = [s for s in SCHEMES if s not in fixtures]
assert not missing, f"schemes of the table without a fixture: {missing}"
reference = {"src": old_checkpoints.SRC, "prev": old_checkpoints.PREV}
for name in fixtures:
    model, task = old_checkpoints.load(f"out/{name}.pt", "out")
    reference[name] = old_checkpoints.outputs(model, task)
torch.save(reference, "out/reference.pt")
manifest = {"commit": sys.argv[1], "torch": torch.__version__, "fairseq": fairseq.__version__,
            "made_by": "tests/data/old_checkpoints/make_schemes.sh", "table": list(SCHEMES), "fixtures": fixtures}
with open("out/manifest.json", "w") as f:
    json.dump(manifest, f, indent=1)
    f.write("\n")
PY
rm out/fixtures.txt
# replace the folder whole (a failed run above leaves the old one as it was)
rm -rf "$HERE.new" && cp -r out "$HERE.new" && rm -rf "$HERE" && mv "$HERE.new" "$HERE"
ls -la "$HERE"
