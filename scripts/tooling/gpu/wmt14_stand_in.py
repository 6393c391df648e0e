"""A stand-in for scripts/prepare_wmt14.sh's En-De output, for timing the users' path where WMT14 is not
(the GPU check's section users_path): the same layout (raw/{train,valid,test}.{en,de}, spm.model, spm/, bin/ binarized by
scripts/prepare_bitext.sh with one joined dictionary), sentence lengths drawn from newstest2014's
(tooling.bench.length_mix), the words arbitrary.

    write_stand_in(out, sizes, vocab, seed)   out/ as prepare_wmt14.sh leaves it; returns the dictionary's size
                                              as the model sees it (fairseq's 4 specials; a multiple of 8)

Speed depends on the lengths and on the vocabulary's size (the output layer), not on what the words are: each
sentence is as many made-up words as the length drawn, by a Zipf law, with every word of the vocabulary at least
once in train (so the dictionary has the size asked for), and the sentencepiece model is a word model
(spm_train.py --model-type word), so that a sentence of n words is n pieces.
"""
import os
import string
import subprocess
import sys
from pathlib import Path

import numpy as np

from tooling.bench import length_mix

REPO = Path(__file__).resolve().parents[3]
LANGS = ("en", "de")


def made_up_words(n, rng):
    """n distinct lowercase words of 2-9 letters."""
    words, letters = set(), np.array(list(string.ascii_lowercase))
    while len(words) < n:
        words.add("".join(rng.choice(letters, size=int(rng.integers(2, 10)))))
    return sorted(words)


def sentences(lengths, words, rng, cover_all):
    """One line per length: that many words drawn by a Zipf law (rank r with weight 1/r); with cover_all, every
    word placed once at a random position first (all the lines must hold at least len(words) words)."""
    p = 1.0 / np.arange(1, len(words) + 1)
    tokens = rng.choice(len(words), size=sum(lengths), p=p / p.sum())
    if cover_all:
        if len(tokens) < len(words):
            raise ValueError(f"{len(tokens)} words cannot hold a vocabulary of {len(words)}")
        tokens[rng.choice(len(tokens), size=len(words), replace=False)] = rng.permutation(len(words))
    ends = np.cumsum(lengths)
    return [" ".join(words[t] for t in tokens[end - n:end]) for n, end in zip(lengths, ends)]


def run(cmd, env=None):
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or "?").splitlines()[-1]
        raise RuntimeError(f"{Path(cmd[1]).name} exited with {proc.returncode}: {last}")


def write_stand_in(out, sizes, vocab, seed, workers=2):
    """out/raw, out/spm.model, out/spm, out/bin as `prepare_wmt14.sh en-de --out out` writes them, sizes = {split:
    sentences} for train, valid, test; returns the joined dictionary's number of entries, fairseq's <s>, <pad>,
    </s>, <unk> and the padding to a multiple of 8 (madeupword0000...) that dict.en.txt lists included."""
    out = Path(out)
    (out / "raw").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = made_up_words(vocab, rng)
    pairs = length_mix.load_pairs()
    for k, split in enumerate(("train", "valid", "test")):
        drawn = length_mix.draw(pairs, sizes[split], seed + k)
        for side, lang in enumerate(LANGS):
            lines = sentences([pair[side] for pair in drawn], words, rng, cover_all=split == "train")
            (out / "raw" / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    # the word model first: prepare_bitext.sh keeps an spm.model it finds, then encodes and binarizes as the recipe
    run([sys.executable, "scripts/spm_train.py", "--input", *(str(out / "raw" / f"train.{lang}") for lang in LANGS),
         "--model-prefix", str(out / "spm"), "--vocab-size", str(vocab + 1), "--model-type", "word"])
    venv = Path(sys.executable).parent  # fairseq-preprocess beside this Python
    run(["bash", "scripts/prepare_bitext.sh", str(out / "raw"), str(out), *LANGS, str(vocab + 1)],
        env={"WORKERS": str(workers), "PY": sys.executable, "PATH": f"{venv}:{os.environ['PATH']}"})
    dictionary = (out / "bin" / "dict.en.txt").read_text(encoding="utf-8").splitlines()
    return len(dictionary) + 4  # + fairseq's 4 specials, which dict.txt does not list
