# Sourced by make.sh and make_schemes.sh, in their work folder: the 48 sentence pairs every fixture trains on
# (train = valid), binarized with one joined dictionary into bin/, and DIMS, the fixtures' 1+1-layer d = 16 model.
python - <<'PY'
import random
random.seed(1)
words = [f"w{i}" for i in range(12)]
with open("train.en", "w") as en, open("train.de", "w") as de:
    for _ in range(48):
        s = [random.choice(words) for _ in range(random.randint(3, 9))]
        en.write(" ".join(s) + "\n")
        de.write(" ".join(reversed(s)) + "\n")
PY
cp train.en valid.en && cp train.de valid.de
fairseq-preprocess --source-lang en --target-lang de --joined-dictionary --trainpref train --validpref valid \
  --destdir bin --workers 1 > /dev/null
DIMS=(--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 16 --decoder-embed-dim 16
      --encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 --decoder-attention-heads 2)
