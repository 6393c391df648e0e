"""Is a mean per-seed BLEU difference more than noise? A paired bootstrap over both of its sources of variance.

A study compares model M with a reference model R on k seeds, seed s of M against seed s of R (a fine-tune
against the run it continued), every run translating the same n test sentences. What its tables report is the
mean per-seed difference

    Δ = 1/k Σ_s [BLEU(M_s) − BLEU(R_s)]        (corpus BLEU on the n sentences)

and two things make Δ vary: which seeds were trained (the same seed trained again on another CPU moved the
study's 20-epoch transformer by 1.22 BLEU) and which sentences were tested. Each of SAMPLES resamples
(`compare`):

1. draws k of the k seeds with replacement; a drawn seed brings both of its runs, M_s and R_s (paired);
2. draws n of the n test sentences with replacement, one draw for that resample's every seed and both systems:
   the seeds translated the same test set, which is one sample of sentences, counted once (a crossed design:
   seeds × sentences, resampled along both, as Owen's "pigeonhole" bootstrap does, Ann. Appl. Stat. 2007);
3. δ*_b = mean over the drawn seeds of BLEU(M_s) − BLEU(R_s), corpus BLEU of the drawn sentences.

Reported: the effect Δ (the statistic on the data, the tables' Δ), the 95% interval of the δ* (percentiles), and
a two-sided p: the δ* centred on their mean stand in for the distribution under "no difference", and p is the
share of them at least as far from 0 as Δ, (count + 1) / (SAMPLES + 1) (two systems that are the same give
p = 1). Beside it, from the same sentence draws with the k seeds fixed, the sentence-only p of the same Δ (and
of each seed alone): what the test set's sampling alone would say.

With one seed there is no variance over seeds to estimate: `compare` gives no interval and no seeds-and-
sentences p then, only the sentence-only ones. With a few seeds the interval knows only their spread (three
seeds: 10 distinct draws of seeds, and a bootstrap's variance is (k − 1)/k of theirs), so it is, if anything,
too narrow: an effect inside it is within seed noise; one outside it is not shown to be more than a trend of
these seeds.

BLEU per resample is sacrebleu's corpus BLEU from summed sufficient statistics (per sentence: hypothesis and
reference length, n-gram matches and totals, n = 1..4), so a resample costs a matrix product and a sacrebleu
score, not a re-tokenization.
"""
import numpy as np
import sacrebleu

from tooling.bleu import tokenized_metric, tokenized_stats

SAMPLES = 2000
SEED = 12345
LEVEL = 0.95
METRICS = ("bleu_tok_lc", "bleu")  # the study's tokenized lowercased BLEU, and sacreBLEU
ONE_SEED = "one seed: the variance over seeds cannot be estimated"


def sentence_stats(hypotheses, references, key):
    """(metric, per-sentence statistics as an int64 array of (n, 10)): key "bleu_tok_lc" the literature's
    tokenized lowercased BLEU (tooling/bleu.py), "bleu" sacreBLEU (cased, detokenized, 13a)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if key == "bleu_tok_lc":
        metric, stats = tokenized_metric(), tokenized_stats(hypotheses, references, lowercase=True, compounds=False)
    elif key == "bleu":
        metric = sacrebleu.metrics.BLEU()
        stats = metric._extract_corpus_statistics(hypotheses, [references])
    else:
        raise ValueError(f"unknown metric {key!r} (expected one of {', '.join(METRICS)})")
    return metric, np.asarray(stats, dtype=np.int64)


def score(metric, summed):
    """sacrebleu's corpus BLEU from summed statistics (one row of 10)."""
    return metric._compute_score_from_stats([int(x) for x in summed]).score


def sentence_draws(n, samples=SAMPLES, seed=SEED):
    """(samples, n): the test sentences each resample draws, with replacement."""
    return np.random.default_rng([seed, n]).integers(0, n, size=(samples, n))


def seed_draws(k, samples=SAMPLES, seed=SEED):
    """(samples, k): the positions of the seeds each resample draws, with replacement."""
    return np.random.default_rng([seed, k, 1]).integers(0, k, size=(samples, k))


def counts(draws, n):
    """How often each of the n sentences is drawn in each resample: (samples, n), float64 (exact integers)."""
    samples = len(draws)
    flat = (draws + n * np.arange(samples)[:, None]).ravel()
    return np.bincount(flat, minlength=samples * n).reshape(samples, n).astype(np.float64)


def p_value(resampled, observed):
    """Two-sided: the share of the centred resamples at least as far from 0 as the observed statistic."""
    centred = np.abs(resampled - resampled.mean())
    return float((np.sum(centred >= abs(observed)) + 1) / (len(resampled) + 1))


def resample(model, reference, metric, samples=SAMPLES, seed=SEED):
    """The resamples themselves. model, reference: {seed: per-sentence statistics (n, 10)} of the same seeds on
    the same n sentences; metric scores summed statistics (sentence_stats gives both). Returns (seeds, observed:
    each seed's BLEU(M_s) − BLEU(R_s) on all sentences, diffs: (k, samples) the same on each resample's sentence
    draw, both: (samples,) δ*, the drawn seeds' diffs averaged; None with one seed)."""
    seeds = sorted(model)
    if not seeds or sorted(reference) != seeds:
        raise ValueError(f"model seeds {seeds} and reference seeds {sorted(reference)} differ (or none)")
    n = len(model[seeds[0]])
    if any(len(x[s]) != n for x in (model, reference) for s in seeds):
        raise ValueError("every run must be scored on the same sentences")
    weights = counts(sentence_draws(n, samples, seed), n)
    observed = np.zeros(len(seeds))
    diffs = np.zeros((len(seeds), samples))
    for i, s in enumerate(seeds):
        for stats, sign in ((model[s], 1.0), (reference[s], -1.0)):
            observed[i] += sign * score(metric, stats.sum(0))
            diffs[i] += sign * np.array([score(metric, row) for row in weights @ stats])
    both = None
    if len(seeds) >= 2:
        drawn = seed_draws(len(seeds), samples, seed)
        both = diffs[drawn, np.arange(samples)[:, None]].mean(1)  # resample b: diffs[drawn[b, j], b] averaged
    return seeds, observed, diffs, both


def compare(model, reference, metric, samples=SAMPLES, seed=SEED, level=LEVEL):
    """resample's inputs; returns a dict: effect (Δ, the mean per-seed difference), ci ([low, high] over seeds
    and sentences, or None), p (over seeds and sentences, or None), p_sentences (the seeds fixed), p_per_seed
    ({seed: p}, each seed alone), seeds, samples, level, note (why there is no ci, or None)."""
    seeds, observed, diffs, both = resample(model, reference, metric, samples, seed)
    effect = float(observed.mean())
    out = {"effect": effect, "seeds": len(seeds), "samples": samples, "level": level,
           "p_sentences": p_value(diffs.mean(0), effect),
           "p_per_seed": {s: p_value(diffs[i], observed[i]) for i, s in enumerate(seeds)},
           "ci": None, "p": None, "note": ONE_SEED}
    if both is not None:
        low, high = np.quantile(both, [(1 - level) / 2, (1 + level) / 2])
        out.update(ci=[float(low), float(high)], p=p_value(both, effect), note=None)
    return out


def within_noise(result):
    """Whether the interval over seeds and sentences includes 0 (None: one seed, not measured)."""
    if result["ci"] is None:
        return None
    return result["ci"][0] <= 0 <= result["ci"][1]
