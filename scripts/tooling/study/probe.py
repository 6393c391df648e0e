"""The length probe's probes and scores (scripts/study/length_probe.py; its docstring gives the design): test sentences
joined k at a time until enough probes pass a multiple of the longest training source (`make_probes`,
`load_probes`), their buckets by length relative to it (`bucket_members`), and the scores of a bucket's outputs:
tokenized lowercased BLEU, the hypothesis/reference ratios of length and of sentences (`scores`), repeated 4-grams
(`repeated_ngrams`). The table of the probe results is tooling/study/probe_table.py's.
"""
import os
import re

from tooling.bleu import prepare, tokenized_bleu
from tooling.tool import Tool

MAX_LEN_A, MAX_LEN_B = 2, 10
# a sentence end: . ! or ? (repeated, then closing quotes or brackets) before a space or the end of the line
SENTENCE_END = re.compile(r"[.!?]+[\"'»«“”‘’)\]]*(?=\s|$)")


TOOL = Tool("length_probe.py")
fail, read_lines = TOOL.fail, TOOL.read_lines


def parse_edges(text):
    try:
        edges = [float(e) for e in text.split(",")]
    except ValueError:
        fail(f"--edges must be comma-separated numbers (multiples of the longest training source), got {text!r}")
    if not edges or edges[0] <= 0 or any(b <= a for a, b in zip(edges, edges[1:])):
        fail(f"--edges must be positive and strictly increasing, got {text!r}")
    return edges


def bucket_labels(edges):
    return ([f"≤ {edges[0]:g}×"] + [f"{a:g}–{b:g}×" for a, b in zip(edges, edges[1:])] + [f"> {edges[-1]:g}×"])


def bucket_of(ratio, edges):
    return next((i for i, e in enumerate(edges) if ratio <= e), len(edges))


def bucket_members(probes, longest, edges):
    """Each bucket's probe indices (len(edges) + 1 buckets), by source length relative to longest."""
    members = [[] for _ in range(len(edges) + 1)]
    for i, p in enumerate(probes):
        members[bucket_of(p[4] / longest, edges)].append(i)
    return members


def sentences(text):
    """How many sentences a line holds: its sentence ends (a line without end punctuation holds none)."""
    return len(SENTENCE_END.findall(text))


def multi_sentence_share(lines):
    """The share of lines that hold more than one sentence."""
    return sum(sentences(line) > 1 for line in lines) / len(lines) if lines else 0.0


def scores(hyps, refs):
    """tok-lc BLEU, hypothesis/reference length (tok-lc tokens) and sentences (None where the references hold
    none) of aligned hypotheses and references."""
    bleu = tokenized_bleu(hyps, refs, lowercase=True, compounds=False)
    ref_sentences = sum(sentences(r) for r in refs)
    return {"bleu_tok_lc": round(bleu.score, 2), "hyp_ref_ratio": round(bleu.sys_len / bleu.ref_len, 3),
            "hyp_ref_sentences": round(sum(sentences(h) for h in hyps) / ref_sentences, 3) if ref_sentences else None}


def repeated_ngrams(lines, n=4):
    """(repeated, all) n-grams of the lines in tok-lc tokens (as BLEU counts them): an n-gram is repeated where it
    occurred earlier in the same line. An output that loops ("im im im ...") repeats most of its n-grams; a
    translation of k joined captions, few."""
    repeated = total = 0
    for line in lines:
        words, seen = prepare(line, lowercase=True, compounds=False).split(), set()
        for i in range(len(words) - n + 1):
            gram = tuple(words[i:i + n])
            repeated += gram in seen
            seen.add(gram)
        total += max(0, len(words) - n + 1)
    return repeated, total


def longest_training(data, src, tgt):
    """(longest source, longest target) of the run's binarized training data, in tokens (pieces + EOS)."""
    from fairseq.data import indexed_dataset

    lengths = []
    for lang in (src, tgt):
        prefix = os.path.join(data, "bin", f"train.{src}-{tgt}.{lang}")
        impl = indexed_dataset.infer_dataset_impl(prefix)
        dataset = indexed_dataset.make_dataset(prefix, impl) if impl else None
        if dataset is None:
            fail(f"--data {data}: no binarized training data {prefix}.bin/.idx (expected prepare_bitext.sh output)")
        lengths.append(int(dataset.sizes.max()))
    return tuple(lengths)


def make_probes(src, ref, count_tokens, longest, per_k, beyond, max_k):
    """[(k, start, source, reference, source tokens)], k = 1, 2, ... until per_k probes are > beyond × longest."""
    n = len(src)
    if n < per_k:
        fail(f"the test set has {n} sentences: fewer than --per-k {per_k}")
    stride = n // per_k
    probes, k = [], 0
    while sum(p[4] > beyond * longest for p in probes) < per_k:
        k += 1
        if k > max_k:
            fail(f"k = {max_k} (--max-k) joined test sentences are not longer than {beyond:g} × {longest} tokens "
                 f"for {per_k} probes")
        for j in range(per_k):
            idx = [(j * stride + i) % n for i in range(k)]
            source = " ".join(src[i] for i in idx)
            probes.append((k, j * stride, source, " ".join(ref[i] for i in idx), count_tokens(source)))
    return probes



def load_probes(data, src_lang, tgt_lang, per_k, beyond, max_k):
    """The probes of the study's data directory (raw/test.*, spm.model, bin/): (probes, longest training source,
    longest training target, test sentences)."""
    if not os.path.isfile(os.path.join(data, "spm.model")):
        fail(f"--data: {os.path.join(data, 'spm.model')} not found")
    src = read_lines(os.path.join(data, "raw", f"test.{src_lang}"), "--data")
    ref = read_lines(os.path.join(data, "raw", f"test.{tgt_lang}"), "--data")
    if len(src) != len(ref) or not src:
        fail(f"--data {data}: raw/test.{src_lang} and raw/test.{tgt_lang} have {len(src)} and {len(ref)} lines")
    longest_src, longest_tgt = longest_training(data, src_lang, tgt_lang)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(data, "spm.model"))
    probes = make_probes(src, ref, lambda text: len(sp.encode(text)) + 1, longest_src, per_k, beyond, max_k)
    return probes, longest_src, longest_tgt, len(src)

