#!/usr/bin/env python3
"""Generate the embedded toy translation task: an SVO source language into an SOV target language.

Word order matters, so a model without usable position information cannot solve it:
  source  det adj* noun[s] verb det adj* noun[s] (with det noun)? adv? (and <clause>)*
  target  noun[-ri] adj* det  noun[-ri] adj* det  o  (noun det mit)? adv? verb-agreement (ko <clause>)*
i.e. per clause the verb moves to the end and takes a subject-number suffix (-a singular, -an plural),
the object takes the accusative particle "o", adjectives follow their noun, plural is a noun suffix and
prepositions become postpositions. Proper names are identical in both languages, so copying the source
scores a small non-zero BLEU (the baseline the tests compare against).

Splits (deterministic from --seed): train/valid/test with 3..MAX_TRAIN_LEN source words, and test_long
with source lengths above anything in train (for length extrapolation). Files: <out>/<split>.{src,tgt}.
"""
import argparse
import os
import random
import sys

from tooling.atomic import atomic_open

DETS = {"the": "ka", "a": "mu", "this": "sel", "that": "tor", "every": "oll", "my": "nim"}
ADJS = {"big": "dara", "small": "pinu", "red": "kiro", "old": "sanu", "young": "lev", "happy": "fumi",
        "green": "verd", "quiet": "shin", "tall": "hoba", "clever": "kasi"}
NOUNS = {"dog": "inu", "cat": "neko", "bird": "tori", "man": "otok", "woman": "zena", "child": "kodo",
         "teacher": "sensi", "farmer": "nomin", "horse": "uma", "king": "raja", "friend": "tomo",
         "doctor": "isha", "book": "hon", "apple": "ringo", "house": "ie", "boat": "fune",
         "letter": "tegam", "song": "uta", "river": "kawa", "tree": "ki"}
VERBS = {"sees": "mi", "likes": "suk", "finds": "mitu", "carries": "hakob", "helps": "tasuk",
         "follows": "ou", "draws": "kak", "buys": "kau", "hears": "kik", "remembers": "obo"}
ADVS = {"today": "kyo", "slowly": "yukur", "again": "mata", "quickly": "hayak", "often": "yoku"}
NAMES = ["Anna", "Bram", "Chen", "Dara", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jonas"]
PLURAL_DETS = {"the", "my", "that"}  # determiners allowed with plural nouns


def noun_phrase(rng, allow_pp):
    """Returns (source words, target words, is_plural)."""
    if rng.random() < 0.15:
        name = rng.choice(NAMES)
        return [name], [name], False
    plural = rng.random() < 0.35
    det = rng.choice(sorted(PLURAL_DETS) if plural else sorted(DETS))
    adjs = rng.sample(sorted(ADJS), k=rng.choice([0, 0, 1, 1, 2, 3]))
    noun = rng.choice(sorted(NOUNS))
    src = [det] + adjs + [noun + ("s" if plural else "")]
    tgt = [NOUNS[noun] + ("ri" if plural else "")] + [ADJS[a] for a in adjs] + [DETS[det]]
    if allow_pp and rng.random() < 0.25:
        pp_src, pp_tgt, _ = noun_phrase(rng, allow_pp=False)
        src += ["with"] + pp_src
        tgt += pp_tgt + ["mit"]
    return src, tgt, plural


def plural_verb(verb):
    """'sees' -> 'see', 'carries' -> 'carry' (agreement with a plural subject)."""
    return verb[:-3] + "y" if verb.endswith("ies") else verb[:-1]


def clause(rng):
    subj_s, subj_t, subj_plural = noun_phrase(rng, allow_pp=True)
    obj_s, obj_t, _ = noun_phrase(rng, allow_pp=True)
    verb = rng.choice(sorted(VERBS))
    src_verb = plural_verb(verb) if subj_plural else verb
    adv = [rng.choice(sorted(ADVS))] if rng.random() < 0.3 else []
    src = subj_s + [src_verb] + obj_s + adv
    tgt = subj_t + obj_t + ["o"] + [ADVS[a] for a in adv] + [VERBS[verb] + ("an" if subj_plural else "a")]
    return src, tgt


def sentence(rng, n_clauses):
    src, tgt = clause(rng)
    for _ in range(n_clauses - 1):
        s, t = clause(rng)
        src += ["and"] + s
        tgt += ["ko"] + t
    return " ".join(src), " ".join(tgt)


def word_by_word(src):
    """Baseline: translate each source word through the lexicon, keeping source order (no reordering,
    no agreement). A model must beat this by a wide margin to show it learned the word order."""
    plural_verbs = {plural_verb(v): v for v in VERBS}
    out = []
    for w in src.split():
        if w in NOUNS or (w.endswith("s") and w[:-1] in NOUNS):
            out.append(NOUNS[w] if w in NOUNS else NOUNS[w[:-1]] + "ri")
        elif w in VERBS or w in plural_verbs:
            out.append(VERBS[plural_verbs.get(w, w)] + "a")
        else:
            out.append({**DETS, **ADJS, **ADVS, "with": "mit", "and": "ko"}.get(w, w))
    return " ".join(out)


def sample(rng, n, min_len, max_len, max_clauses, seen):
    """n distinct sentence pairs whose source length is in [min_len, max_len], none in `seen`."""
    out = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 200 * n + 10000:
            sys.exit(f"make_toy_data.py: cannot draw {n} distinct sentences of length {min_len}..{max_len}")
        s, t = sentence(rng, rng.randint(1, max_clauses))
        if min_len <= len(s.split()) <= max_len and s not in seen:
            seen.add(s)
            out.append((s, t))
    return out


def write_split(out_dir, name, pairs):
    for side, idx in (("src", 0), ("tgt", 1)):
        path = os.path.join(out_dir, f"{name}.{side}")
        with atomic_open(path) as f:
            f.writelines(p[idx] + "\n" for p in pairs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/toy/raw", help="output directory")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--train", type=int, default=12000, help="training pairs")
    ap.add_argument("--valid", type=int, default=500)
    ap.add_argument("--test", type=int, default=500)
    ap.add_argument("--test-long", type=int, default=300, help="pairs longer than any training sentence")
    ap.add_argument("--max-train-len", type=int, default=20, help="max source words in train/valid/test")
    ap.add_argument("--max-long-len", type=int, default=80, help="max source words in test_long")
    args = ap.parse_args()
    if args.max_train_len < 5 or args.max_long_len <= args.max_train_len:
        sys.exit("make_toy_data.py: need --max-train-len >= 5 and --max-long-len > --max-train-len")

    rng = random.Random(args.seed)
    seen = set()
    splits = {
        "train": sample(rng, args.train, 3, args.max_train_len, 2, seen),
        "valid": sample(rng, args.valid, 3, args.max_train_len, 2, seen),
        "test": sample(rng, args.test, 3, args.max_train_len, 2, seen),
        "test_long": sample(rng, args.test_long, args.max_train_len + 1, args.max_long_len, 9, seen),
    }
    os.makedirs(args.out, exist_ok=True)
    for name, pairs in splits.items():
        write_split(args.out, name, pairs)
    print(f"toy data in {args.out}: " + ", ".join(f"{k} {len(v)}" for k, v in splits.items()))


if __name__ == "__main__":
    main()
