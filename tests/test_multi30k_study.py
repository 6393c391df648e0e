"""scripts/study/multi30k_study.sh end to end on a synthetic Multi30k-shaped slice (never skips): two models, two
seeds, one epoch of a tiny model, the FLOATER warm start from each seed's transformer, the table with mean ± std
and paired bootstrap p-values; a rerun retrains nothing; a run of a few models keeps every finished run in the
table. The literature's tokenized lowercased BLEU against a hand computation from n-gram counts, and the paired
bootstrap over seeds and sentences (scripts/tooling/bootstrap.py) against a naive one."""
import fcntl
import json
import math
import re
import sys
from collections import Counter

import numpy as np
import pytest
import sacrebleu

from conftest import REPO, run
from helpers.study_corpus import MODELS, SEEDS, corpus, first_run, start_from, study  # noqa: F401  (fixtures)

from tooling import bootstrap
from tooling.study import table as study_table
from fairseq_plugins.schemes import SCHEMES
from tooling.bleu import tokenized_bleu


def test_study_end_to_end_and_rerun_skips(corpus, first_run, tmp_path):
    # seed 1's transformer as the shared first run left it (data prepared, trained, probed): the study trains the
    # other three runs, the fine-tunes two side by side, and tabulates all four
    start_from(first_run, tmp_path)
    out = study(corpus, tmp_path).stdout
    results = tmp_path / "results"
    n_test = len((corpus / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines())
    for model in MODELS:
        for seed in SEEDS:
            res = json.loads((results / "runs" / f"{model}.seed{seed}.json").read_text())
            assert res["model"] == model and res["seed"] == seed
            assert res["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
            assert 0 <= res["bleu_tok_lc"] <= 100 and "lowercased" in res["bleu_tok_lc_method"]
            assert res["checkpoint"].endswith(f"{model}.seed{seed}/average.pt") and res["beam"] == "5"
            assert res["valid_loss"] and res["train_seconds"] >= 0
            hyps = (results / "runs" / f"{model}.seed{seed}.hyp").read_text(encoding="utf-8").splitlines()
            assert len(hyps) == n_test
            dep = json.loads((results / "source_dependence" / f"{model}.seed{seed}.json").read_text())
            assert dep["sentences"] == n_test and dep["shuffled_loss"] > 0 and dep["true_loss"] > 0
            assert re.search(rf"\| {model} seed {seed} \| [\d.]+ \| [\d.]+ \| [\d.]+ \| \d+ \| {dep['gap']:.2f} \|",
                             (results / "table.md").read_text(encoding="utf-8"))
    warm = json.loads((results / "runs" / "floater_warm.seed2.json").read_text())
    assert warm["arch"] == "floater_transformer" and float(warm["lr"]) == 0.0025  # half the peak lr
    assert int(warm["update_offset"]) == json.loads((results / "runs" / "transformer.seed2.json").read_text())[
        "valid_loss"][-1][0], "the warm start continues its own seed's transformer"
    assert (tmp_path / "ckpt" / "floater_warm.seed2" / "warm_start.pt").is_file()

    table = (results / "table.md").read_text(encoding="utf-8")
    assert table in out and "PARTIAL" not in table
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in table.splitlines()
            if r.startswith("| transformer") or r.startswith("| floater_warm")}
    assert rows["transformer"][0] == rows["floater_warm"][0] == "2/2"
    assert re.fullmatch(r"\d+\.\d\d ± \d+\.\d\d", rows["transformer"][1])
    # the interval and p over seeds and sentences, then the sentence-only p of the seeds together and of each
    p = r"(<0\.001|[01]\.\d{3})"
    assert re.fullmatch(r"\[[-+]\d+\.\d\d, [-+]\d+\.\d\d\]", rows["floater_warm"][4])
    assert re.fullmatch(p, rows["floater_warm"][5])
    assert re.fullmatch(rf"{p} \({p}, {p}\)", rows["floater_warm"][6])
    assert "FLOATER > sinusoidal, paper's protocol" in table
    summary = json.loads((results / "summary.json").read_text())
    cmp = summary["models"]["floater_warm"]["vs_transformer"]
    assert cmp["seeds"] == [1, 2]
    for key, test in cmp["bootstrap"].items():
        assert 0 < test["p"] <= 1 and 0 < test["p_sentences"] <= 1 and test["ci"][0] <= test["ci"][1]
        assert test["effect"] == pytest.approx(cmp["delta"][key], abs=0.01)  # the table's Δ, of rounded scores
    assert (results / "valid_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.rglob("*.tmp")), "no temporary file is left behind"
    # every run's length probe, right after its test decoding, and their table
    for model in MODELS:
        for seed in SEEDS:
            probe = json.loads((results / "runs" / f"{model}.seed{seed}.probe.json").read_text())
            assert probe["name"] == f"{model}.seed{seed}" and probe["model"] == model and probe["per_k"] == 5
            assert probe["checkpoint"].endswith(f"{model}.seed{seed}/average.pt") and probe["buckets"][-1]["probes"]
            assert len((results / "runs" / f"{model}.seed{seed}.probe.hyp").read_text().splitlines()) == probe["probes"]
    probe_table = (results / "probe_table.md").read_text(encoding="utf-8")
    assert probe_table in out and "| transformer | 2 |" in probe_table and "| floater_warm | 2 |" in probe_table

    # a rerun skips every finished run: no checkpoint is touched, the table is the same
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "ckpt").rglob("*.pt")}
    again = study(corpus, tmp_path).stdout
    assert again.count(": skipped (done") == len(MODELS) * len(SEEDS)
    assert ": training " not in again
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "ckpt").rglob("*.pt")} == stamps
    assert (results / "table.md").read_text(encoding="utf-8") == table

    # a finished run without its probe (finished before the probe existed) is probed, nothing is trained
    probe = (results / "runs" / "transformer.seed1.probe.json").read_text()
    (results / "runs" / "transformer.seed1.probe.json").unlink()
    again = study(corpus, tmp_path).stdout
    assert "== transformer.seed1: done (" in again and "its length probe now" in again
    assert again.count(": skipped (done") == len(MODELS) * len(SEEDS) - 1 and ": training " not in again
    assert json.loads((results / "runs" / "transformer.seed1.probe.json").read_text())["buckets"] == json.loads(
        probe)["buckets"]

    # seeds asked for but not run yet: the table says so (the table step alone, which would not train them)
    run([sys.executable, "scripts/study/study.py", "table", "--runs", str(results / "runs"), "--models",
         " ".join(MODELS), "--seeds", "1 2 3", "--out", str(tmp_path / "partial")])
    assert "**PARTIAL: 4 of 6 runs done** (seeds done: transformer 2/3, floater_warm 2/3)" in (
        tmp_path / "partial" / "table.md").read_text(encoding="utf-8")

    # the table again on the test sentences longer than a training limit: both metrics recomputed on them alone
    src = (corpus / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    refs = (corpus / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    keep = [i for i, line in enumerate(src) if len(line.split()) > 10]
    assert 0 < len(keep) < len(src)
    run([sys.executable, "scripts/study/study.py", "table", "--runs", str(results / "runs"), "--models",
         " ".join(MODELS), "--seeds", "1 2", "--split-src", str(corpus / "test_2016_flickr.en"), "--split-at", "10",
         "--out", str(tmp_path / "long")])
    summary = json.loads((tmp_path / "long" / "summary.json").read_text())
    beyond, within = summary["long_sources"], summary["short_sources"]
    assert beyond["sentences"] == len(keep) and beyond["split_at"] == within["split_at"] == 10
    assert within["sentences"] == len(src) - len(keep)
    short = [i for i in range(len(src)) if i not in keep]
    hyps = (results / "runs" / "transformer.seed2.hyp").read_text(encoding="utf-8").splitlines()
    assert within["models"]["transformer"]["bleu"][1] == round(sacrebleu.corpus_bleu(
        [hyps[i] for i in short], [[refs[i] for i in short]]).score, 2)
    for model in MODELS:
        hyps = [(results / "runs" / f"{model}.seed{s}.hyp").read_text(encoding="utf-8").splitlines() for s in SEEDS]
        assert beyond["models"][model]["bleu_tok_lc"] == [round(tokenized_bleu(
            [h[i] for i in keep], [refs[i] for i in keep], lowercase=True, compounds=False).score, 2) for h in hyps]
        assert beyond["models"][model]["bleu"] == [round(sacrebleu.corpus_bleu(
            [h[i] for i in keep], [[refs[i] for i in keep]]).score, 2) for h in hyps]
    assert beyond["models"]["floater_warm"]["vs_transformer"]["seeds"] == [1, 2]
    assert "FLOATER > sinusoidal, paper's protocol (Liu et al. 2020, Table 2), sources > 10 words" in (
        tmp_path / "long" / "table.md").read_text(encoding="utf-8")
    alone = run([sys.executable, "scripts/study/study.py", "table", "--runs", str(results / "runs"), "--models",
                 "transformer", "--seeds", "1", "--split-at", "10", "--out", str(tmp_path / "bad")], check=False)
    assert alone.returncode != 0 and alone.stdout.strip().splitlines() == [
        "study.py: --split-src and --split-at go together (the test sources, and a length in source words)"]
    assert not (tmp_path / "bad").exists()


def test_a_run_another_study_process_holds_is_left_to_it(corpus, tmp_path):
    """Two study processes started on one directory never train one run side by side: the second leaves a run
    whose lock the first holds, and trains nothing into it."""
    run_dir = tmp_path / "ckpt" / "transformer.seed1"
    run_dir.mkdir(parents=True)
    with open(run_dir / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out = study(corpus, tmp_path, MODELS="transformer", SEEDS="1", JOBS="1").stdout
    assert "== transformer.seed1: another study process is running it" in out
    assert ": training " not in out and not list(run_dir.glob("*.pt"))
    assert "PARTIAL: 0 of 1 runs done" in (tmp_path / "results" / "table.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("overrides, message", [
    ({"JOBS": "two"}, "JOBS=two: expected a positive integer"),
    ({"JOIN_TRAIN": "yes", "MAX_TRAIN_TOKENS": "12"}, "JOIN_TRAIN=yes: expected 1 (or unset)"),
    ({"JOIN_TRAIN": "1"}, "JOIN_TRAIN=1 needs MAX_TRAIN_TOKENS (joins are capped in tokens), e.g. "
                          "MAX_TRAIN_TOKENS=32 JOIN_TRAIN=1"),
    ({"MAX_TRAIN_TOKENS": "0"}, "MAX_TRAIN_TOKENS=0: expected a positive integer"),
    ({"SHAPE_K": "x"}, "SHAPE_K=x: expected a positive integer"),
    ({"MAX_TRAIN_LEN": "10", "MAX_TRAIN_TOKENS": "12"},
     "MAX_TRAIN_LEN=10 and MAX_TRAIN_TOKENS=12: choose one cap (words or tokens)"),
    ({"SEEDS": "1 x"}, "SEEDS=\"1 x\": expected positive integers, got 'x'"),
    ({"MODELS": "transformer shaw"}, "MODELS=\"transformer shaw\": unknown model 'shaw' (expected one of "
                                     f"{' '.join(s.model for s in SCHEMES.values())} "  # the table's, in its order
                                     "floater_warm transformer_ft floater_authors)"),  # and the study's own
    ({"MODELS": "floater_warm"}, "MODELS=\"floater_warm\": floater_warm starts from the transformer of the same "
                                 "seed, so MODELS must list transformer"),
    ({"AVG": "3"}, "AVG=3: expected at most EPOCHS=1 checkpoints to average"),
    ({"TABLES_ONLY": "yes"}, "TABLES_ONLY=yes: expected 1 (or unset)"),
    ({"PROBE": "no"}, "PROBE=no: expected 1 (the length probe after each run) or 0 (none)"),
    ({"PROBE_PER_K": "0"}, "PROBE_PER_K=0: expected a positive integer"),
    ({"PROBE_RETRAIN": "yes"}, "PROBE_RETRAIN=yes: expected 1 (train a finished run whose checkpoints are gone again to "
                               "probe it) or 0"),
    ({"PROBE_RETRAIN": "1", "PROBE": "0"}, "PROBE_RETRAIN=1 trains runs again for their probe: it needs PROBE=1"),
    ({"MULTI30K_DIR": "/nonexistent"}, "MULTI30K_DIR=/nonexistent lacks train.en "
                                       "(expected train, val, test_2016_flickr .en/.de)"),
])
def test_bad_input_is_one_line_before_anything_is_written(corpus, tmp_path, overrides, message):
    proc = study(corpus, tmp_path, check=False, **overrides)
    assert proc.returncode != 0
    assert proc.stdout.strip().splitlines() == [f"multi30k_study.sh: {message}"]
    assert not list(tmp_path.iterdir()), "nothing is written before the input is checked"


def hand_bleu(hyps, refs):
    """Corpus BLEU from n-gram counts (Papineni et al.): clipped n-gram precisions for n = 1..4, their
    geometric mean, brevity penalty exp(1 - r/c) when the hypotheses are shorter."""
    matches, totals, c, r = [0] * 4, [0] * 4, 0, 0
    for h, ref in zip(hyps, refs):
        h, ref = h.split(), ref.split()
        c, r = c + len(h), r + len(ref)
        for n in range(1, 5):
            hn = Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            rn = Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
            matches[n - 1] += sum(min(k, rn[g]) for g, k in hn.items())
            totals[n - 1] += max(len(h) - n + 1, 0)
    bp = 1.0 if c > r else math.exp(1 - r / c)
    return 100 * bp * math.exp(sum(math.log(m / t) for m, t in zip(matches, totals)) / 4)


def test_tokenized_lowercased_bleu_matches_a_hand_computation():
    refs = ["A man in a blue shirt is riding a bike.", "Two dogs play in the snow, near a tree."]
    assert tokenized_bleu(refs, refs, lowercase=True, compounds=False).score == pytest.approx(100)
    hyps = ["a man in a blue shirt rides a bicycle.", "Two dogs are playing in the snow near a tree"]
    # what the literature scores: 13a tokens (punctuation split off), lowercased
    tok_refs = ["a man in a blue shirt is riding a bike .", "two dogs play in the snow , near a tree ."]
    tok_hyps = ["a man in a blue shirt rides a bicycle .", "two dogs are playing in the snow near a tree"]
    # by hand: 1-grams 16/20, 2-grams 10/18, 3-grams 6/16, 4-grams 3/14; c = 20 < r = 22
    assert hand_bleu(tok_hyps, tok_refs) == pytest.approx(
        100 * math.exp(1 - 22 / 20) * (16 / 20 * 10 / 18 * 6 / 16 * 3 / 14) ** 0.25)
    assert tokenized_bleu(hyps, refs, lowercase=True, compounds=False).score == pytest.approx(
        hand_bleu(tok_hyps, tok_refs), abs=1e-9)
    # case matters without --lowercase
    assert tokenized_bleu(hyps, refs).score < tokenized_bleu(hyps, refs, lowercase=True, compounds=False).score


def test_tokenized_bleu_cli_lowercase(tmp_path):
    # 120 lines ending in a tokenized period: sacrebleu warns "forgot to detokenize?" from 100 on, which is
    # wrong for text tokenized on purpose; stdout and stderr together must be the score alone
    (tmp_path / "hyp").write_text("A DOG RUNS .\n" * 120, encoding="utf-8")
    (tmp_path / "ref").write_text("a dog runs.\n" * 120, encoding="utf-8")
    out = run([sys.executable, "scripts/tokenized_bleu.py", "--lowercase", "--no-compound-split",
               str(tmp_path / "hyp"), str(tmp_path / "ref")]).stdout
    assert out == "100.00\n"


def test_committed_study_tables_cover_every_committed_run():
    """Each committed study table is made from all of its committed runs: a table rewritten from a subset of them
    (a run of some models alone tabulates only those) must not be what the README's numbers point to."""
    summaries = sorted(p for p in (REPO / "results" / "multi30k_study").rglob("summary.json")
                       if (p.parent / "runs").is_dir())
    assert summaries, "no committed study?"
    for summary in summaries:
        runs = sorted(p.name[:-len(".json")] for p in (summary.parent / "runs").glob("*.seed*.json")
                      if re.fullmatch(r"[\w]+\.seed\d+\.json", p.name))
        models = json.loads(summary.read_text())["models"]
        tabulated = {f"{m}.seed{s}" for m, row in models.items() for s in row["seeds"]}
        missing = [r for r in runs if r not in tabulated]
        assert not missing, f"{summary.relative_to(REPO)} leaves out {missing}: remake it with TABLES_ONLY=1"


def synthetic_systems(n=40, seeds=(1, 2, 3), noise=None, seed=0):
    """References, and per seed two systems' hypotheses: each reference with words dropped and replaced at random,
    the model's at noise[s][0], the reference system's at noise[s][1] (default 0.2 and 0.3 on every seed)."""
    rng = np.random.default_rng(seed)
    vocab = "a man woman dog in the on park street red blue runs sits with ball .".split()
    refs = [" ".join(rng.choice(vocab, rng.integers(4, 12))) for _ in range(n)]
    noise = noise or {s: (0.2, 0.3) for s in seeds}

    def noisy(p):
        words = [[w if rng.random() > p else str(rng.choice(vocab)) for w in r.split() if rng.random() > p / 2]
                 for r in refs]
        return [" ".join(w) or "a" for w in words]

    return refs, {s: noisy(noise[s][0]) for s in seeds}, {s: noisy(noise[s][1]) for s in seeds}


def stats_of(systems, refs, key="bleu_tok_lc"):
    metric = bootstrap.sentence_stats(refs, refs, key)[0]
    return metric, {s: bootstrap.sentence_stats(h, refs, key)[1] for s, h in systems.items()}


def naive_bleu(hyps, refs, idx):
    """Corpus BLEU of the sentences idx (with repeats), from their text."""
    return tokenized_bleu([hyps[i] for i in idx], [refs[i] for i in idx], lowercase=True, compounds=False).score


def test_seed_and_sentence_bootstrap_against_a_naive_one():
    """bootstrap.resample and compare against the same resamples done naively in float64: the drawn seeds' and
    sentences' text, corpus BLEU recomputed from it (tooling.bleu.tokenized_bleu), one sentence draw for every
    drawn seed and both systems."""
    refs, model, other = synthetic_systems()
    metric, m = stats_of(model, refs)
    _, r = stats_of(other, refs)
    samples = 60
    seeds, observed, diffs, both = bootstrap.resample(m, r, metric, samples)
    sentences, drawn = bootstrap.sentence_draws(len(refs), samples), bootstrap.seed_draws(len(seeds), samples)
    every = range(len(refs))
    naive_observed = [naive_bleu(model[s], refs, every) - naive_bleu(other[s], refs, every) for s in seeds]
    assert observed == pytest.approx(naive_observed, abs=1e-9)
    naive = np.array([np.mean([naive_bleu(model[seeds[j]], refs, sentences[b]) -
                               naive_bleu(other[seeds[j]], refs, sentences[b]) for j in drawn[b]])
                      for b in range(samples)])
    assert both == pytest.approx(naive, abs=1e-9)
    assert len(set(map(tuple, drawn))) > 1 and len({tuple(sorted(d)) for d in drawn}) > 1, "seeds are resampled"

    result = bootstrap.compare(m, r, metric, samples)
    # the point estimate is the tables' Δ: the mean per-seed difference on all sentences
    assert result["effect"] == pytest.approx(np.mean(naive_observed), abs=1e-9)
    assert result["ci"] == pytest.approx(list(np.quantile(naive, [0.025, 0.975])), abs=1e-9)
    far = np.abs(naive - naive.mean()) >= abs(np.mean(naive_observed))
    assert result["p"] == pytest.approx((far.sum() + 1) / (samples + 1))
    # sacreBLEU's statistics too: their sum is sacrebleu's corpus BLEU
    sac, stats = bootstrap.sentence_stats(model[1], refs, "bleu")
    assert bootstrap.score(sac, stats.sum(0)) == pytest.approx(sacrebleu.corpus_bleu(model[1], [refs]).score,
                                                               abs=1e-9)


def test_bootstrap_of_identical_systems_and_of_one_seed():
    refs, model, other = synthetic_systems()
    metric, m = stats_of(model, refs)
    _, r = stats_of(other, refs)
    same = bootstrap.compare(m, m, metric, samples=200)
    assert same["effect"] == 0 and same["p"] == 1 and same["p_sentences"] == 1
    assert set(same["p_per_seed"].values()) == {1.0} and same["ci"] == [0.0, 0.0] and bootstrap.within_noise(same)
    assert study_table.verdict({"bootstrap": {"bleu_tok_lc": same}}) == "within seed noise"
    # one seed: the variance over seeds is not estimated, and the verdict says so
    one = bootstrap.compare({1: m[1]}, {1: r[1]}, metric, samples=200)
    assert one["ci"] is None and one["p"] is None and one["note"] == bootstrap.ONE_SEED
    assert 0 < one["p_sentences"] <= 1 and bootstrap.within_noise(one) is None
    assert study_table.verdict({"bootstrap": {"bleu_tok_lc": one}}).endswith("on one seed; seed noise not measured")


def test_two_seeds_get_no_verdict():
    """Two seeds better by the same margin: the bootstrap's interval excludes 0, but resampling two seeds sees only
    their own spread, so the claim gets no verdict until the design's third seed; with three it gets one."""
    refs, model, other = synthetic_systems(n=200, noise={s: (0.2, 0.35) for s in (1, 2, 3)})
    metric, m = stats_of(model, refs)
    _, r = stats_of(other, refs)
    two = bootstrap.compare({s: m[s] for s in (1, 2)}, {s: r[s] for s in (1, 2)}, metric, samples=500)
    assert two["ci"][0] > 0 and not bootstrap.within_noise(two)
    assert study_table.verdict({"bootstrap": {"bleu_tok_lc": two}}) == \
        "same direction on 2 seeds; too few for a verdict (3 at least)"
    three = bootstrap.compare(m, r, metric, samples=500)
    assert study_table.verdict({"bootstrap": {"bleu_tok_lc": three}}) == "yes, beyond seed noise"


def test_seed_noise_is_counted():
    """A model better on two seeds and worse on the third: every seed's sentence-only test is confident, the mean
    difference is positive, but the seeds disagree, and over seeds and sentences it is within seed noise. A model
    better on every seed by a similar margin is beyond it."""
    refs, model, other = synthetic_systems(n=200, noise={1: (0.05, 0.45), 2: (0.05, 0.45), 3: (0.45, 0.05)})
    metric, m = stats_of(model, refs)
    _, r = stats_of(other, refs)
    mixed = bootstrap.compare(m, r, metric, samples=500)
    assert mixed["effect"] > 5 and mixed["p_sentences"] < 0.01 and max(mixed["p_per_seed"].values()) < 0.01
    assert mixed["ci"][0] < 0 < mixed["ci"][1] and mixed["p"] > 0.05
    assert study_table.verdict({"bootstrap": {"bleu_tok_lc": mixed}}) == "within seed noise"
    refs, model, other = synthetic_systems(n=200, noise={s: (0.2, 0.35) for s in (1, 2, 3)})
    metric, m = stats_of(model, refs)
    _, r = stats_of(other, refs)
    steady = bootstrap.compare(m, r, metric, samples=500)
    assert steady["ci"][0] > 0 and steady["p"] < 0.01
    assert study_table.verdict({"bootstrap": {"bleu_tok_lc": steady}}) == "yes, beyond seed noise"


def test_committed_claims_are_judged_over_seeds_and_sentences():
    """Every committed study table judges its claims by the bootstrap over seeds and sentences (a table of the
    sentence-only test of the pooled seeds has no such verdict), and its Δ is that bootstrap's point estimate."""
    summaries = sorted((REPO / "results" / "multi30k_study").rglob("summary.json"))
    assert summaries
    for path in summaries:
        summary = json.loads(path.read_text())
        claims = summary["claims"] + summary.get("long_sources", {}).get("claims", [])
        rows = [row["vs_transformer"] for row in summary["models"].values() if "vs_transformer" in row]
        for cmp in claims + rows:
            assert "pooled_p" not in cmp, f"{path.relative_to(REPO)}: remake it (scripts/study/study.py table)"
            for key, test in cmp["bootstrap"].items():
                assert test["effect"] == pytest.approx(cmp["delta"][key], abs=0.01), path
                assert (test["ci"] is None) == (len(cmp["seeds"]) < 2) == (test["p"] is None), path
        for claim in claims:
            assert claim["verdict"] == study_table.verdict(claim, at_least=">=" in claim["claim"]), path
