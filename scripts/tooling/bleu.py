"""The papers' BLEU: tokenized text with compound splitting (the "get_ende_bleu" recipe).

Both papers report BLEU the way tensor2tensor's get_ende_bleu.sh (and fairseq's compound_split_bleu.sh)
compute it: hypotheses and references are tokenized, every hyphen between two non-space characters is
split off as ##AT##-##AT## (so a compound counts as several matching tokens, as in GNMT and ConvS2S), and
multi-bleu.perl scores the result without further tokenization. Here:

1. tokenize both sides with sacrebleu's 13a tokenizer (mteval-v13a, the closest standard stand-in for the
   Moses tokenizer.perl the recipe calls; neither is exact for the other);
2. split_compounds: the recipe's substitution s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g, character for character;
3. corpus BLEU with sacrebleu, tokenize='none' (case-sensitive, as multi-bleu.perl).

With lowercase=True, compounds=False it is the Multi30k literature's BLEU (e.g. Wu, Kong & Kao 2021):
lowercased, tokenized text, multi-bleu.perl on the tokens, no compound splitting (METHOD_LOWERCASE). The command
is scripts/tokenized_bleu.py.

This number is comparable to the papers' tables; it is not comparable across tokenizations, which is
why scripts/score.py reports sacreBLEU (with its signature) as well.
"""
import re

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

_COMPOUND = re.compile(r"(\S)-(\S)")
_TOKENIZE = Tokenizer13a()

METHOD = ("sacrebleu 13a tokenization + ##AT##-##AT## compound splitting (get_ende_bleu.sh), "
          "then corpus BLEU with tokenize=none")
METHOD_LOWERCASE = "sacrebleu 13a tokenization, lowercased, then corpus BLEU with tokenize=none (multi-bleu.perl on tokens)"


def split_compounds(line):
    """'a well-known fact' -> 'a well ##AT##-##AT## known fact'.

    Matches are found left to right without overlap, exactly like Perl's s///g in the recipe: in 'a-b-c'
    the first match consumes the 'b', so the result is 'a ##AT##-##AT## b-c' (the recipe's quirk, kept)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def prepare(line, lowercase=False, compounds=True):
    text = _TOKENIZE(line.strip())
    if lowercase:
        text = text.lower()
    return split_compounds(text) if compounds else text


def tokenized_metric():
    """The sacrebleu BLEU that scores prepared text: no tokenization of its own."""
    return sacrebleu.metrics.BLEU(tokenize="none", force=True)  # tokenized on purpose: no "forgot to detokenize?"


def tokenized_bleu(hypotheses, references, lowercase=False, compounds=True):
    """sacrebleu BLEUScore of the prepared hypotheses against one prepared reference per sentence."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    return tokenized_metric().corpus_score([prepare(h, lowercase, compounds) for h in hypotheses],
                                           [[prepare(r, lowercase, compounds) for r in references]])


def tokenized_stats(hypotheses, references, lowercase=False, compounds=True):
    """tokenized_bleu's per-sentence sufficient statistics, one row per sentence in sacrebleu's layout (hypothesis
    length, reference length, n-gram matches for n = 1..4, n-gram totals for n = 1..4): the sum of any rows,
    through tokenized_metric()._compute_score_from_stats, is the corpus BLEU of those sentences (what
    tokenized_bleu computes from the sum of all of them)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    return tokenized_metric()._extract_corpus_statistics([prepare(h, lowercase, compounds) for h in hypotheses],
                                                         [[prepare(r, lowercase, compounds) for r in references]])


def read_hypotheses(generate_log):
    """{sentence id: hypothesis pieces} from fairseq-generate's 'H-<id>\\t<score>\\t<pieces>' lines."""
    hyps = {}
    with open(generate_log, encoding="utf-8") as f:
        for line in f:
            if line.startswith("H-"):
                head, _score, *text = line.rstrip("\n").split("\t")
                hyps[int(head[2:])] = text[0] if text else ""
    return hyps
