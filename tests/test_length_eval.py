"""Length-bucketed BLEU: buckets partition the test set, each score is sacrebleu's on that subset, the plot is drawn."""
import json
import random
import sys

import sacrebleu

from conftest import run

import length_eval


def _corpus(tmp_path, n=120, seed=0):
    rng = random.Random(seed)
    words = "a b c d e f g h i j".split()
    src = [" ".join(rng.choices(words, k=rng.randint(1, 45))) for _ in range(n)]
    ref = [" ".join(rng.choices(words, k=rng.randint(3, 30))) for _ in range(n)]
    hyp = [r if i % 3 else " ".join(rng.choices(words, k=8)) for i, r in enumerate(ref)]
    for name, lines in (("src", src), ("ref", ref), ("hyp", hyp)):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    return src, ref, hyp


def test_buckets_partition_and_match_sacrebleu_on_each_subset(tmp_path):
    src, ref, hyp = _corpus(tmp_path)
    edges = length_eval.parse_edges("1,10,20,30,inf")
    buckets, overall = length_eval.score_buckets(src, ref, hyp, edges)
    assert sum(b["sentences"] for b in buckets) == len(src)
    assert overall == round(sacrebleu.corpus_bleu(hyp, [ref]).score, 2)
    for b in buckets:
        hi = b["hi"] or 10**9
        idx = [i for i, s in enumerate(src) if b["lo"] <= len(s.split()) < hi]
        assert len(idx) == b["sentences"] > 0
        expected = sacrebleu.corpus_bleu([hyp[i] for i in idx], [[ref[i] for i in idx]]).score
        assert b["bleu"] == round(expected, 2)
    assert [b["bucket"] for b in buckets] == ["1-9", "10-19", "20-29", "30+"]


def test_sentence_outside_edges_is_an_error_not_dropped(tmp_path):
    _corpus(tmp_path)
    proc = run([sys.executable, "scripts/length_eval.py", "score", "--name", "x", "--src", str(tmp_path / "src"),
                "--ref", str(tmp_path / "ref"), "--hyp", str(tmp_path / "hyp"), "--edges", "1,10,20",
                "--out", str(tmp_path / "x.json")], check=False)
    assert proc.returncode != 0
    assert "lengths outside --edges [1, 20)" in proc.stdout
    assert not (tmp_path / "x.json").exists()


def test_score_table_and_plot_cli(tmp_path):
    _corpus(tmp_path)
    outs = []
    for name in ("transformer", "relative"):
        out = tmp_path / f"{name}.length.json"
        run([sys.executable, "scripts/length_eval.py", "score", "--name", name, "--src", str(tmp_path / "src"),
             "--ref", str(tmp_path / "ref"), "--hyp", str(tmp_path / "hyp"), "--edges", "1,10,20,inf",
             "--out", str(out)])
        outs.append(str(out))
    result = json.loads((tmp_path / "transformer.length.json").read_text())
    assert result["sentences"] == 120 and len(result["buckets"]) == 3

    table = run([sys.executable, "scripts/length_eval.py", "table", *outs]).stdout.splitlines()
    assert table[0] == "| model | all | 1-9 words | 10-19 words | 20+ words |"
    assert table[2].startswith("| sentences | 120 | ")
    assert [row.split(" | ")[0] for row in table[3:]] == ["| transformer", "| relative"]

    png = tmp_path / "length.png"
    run([sys.executable, "scripts/length_eval.py", "plot", *outs, "--out", str(png), "--train-max-len", "15"])
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_mean_over_seeds_and_reference_condition(tmp_path):
    """--mean: one row per (model, note) with the mean and sample std of its runs' scores in every bucket; a run
    scored with --note is its own row; runs scored on different test sets are refused."""
    src, ref, _ = _corpus(tmp_path)
    rng = random.Random(1)
    outs = {}
    for name, model, keep, note in (("t.seed1", "t", 2, None), ("t.seed2", "t", 3, None), ("t.seed3", "t", 5, None),
                                    ("t.seed1", "t", 7, "trained on all lengths")):
        hyp = tmp_path / f"{name}.{keep}.hyp"
        hyp.write_text("\n".join(r if rng.randrange(keep) else "a b" for r in ref) + "\n")
        out = tmp_path / f"{name}.{keep}.length.json"
        run([sys.executable, "scripts/length_eval.py", "score", "--name", name, "--model", model,
             "--src", str(tmp_path / "src"), "--ref", str(tmp_path / "ref"), "--hyp", str(hyp), "--edges", "1,20,inf",
             "--out", str(out)] + (["--note", note] if note else []))
        outs[(name, note)] = json.loads(out.read_text()) | {"path": str(out)}
    table = run([sys.executable, "scripts/length_eval.py", "table", "--mean",
                 *(o["path"] for o in outs.values())]).stdout.splitlines()
    assert len(table) == 5
    seeds = [o for (name, note), o in outs.items() if note is None]
    cells = [c.strip() for c in table[3].strip("|").split("|")]
    for col, values in enumerate([[o["bleu"] for o in seeds]] +
                                 [[o["buckets"][i]["bleu"] for o in seeds] for i in range(2)]):
        mean = sum(values) / 3
        std = (sum((v - mean) ** 2 for v in values) / 2) ** 0.5
        assert std > 0.5 and cells[1 + col] == f"{mean:.1f} ± {std:.1f}"
    assert cells[0] == "t (3 runs)"
    ref_run = outs[("t.seed1", "trained on all lengths")]
    assert table[4] == (f"| t (1 run), trained on all lengths | {ref_run['bleu']:.1f} | "
                        + " | ".join(f"{b['bleu']:.1f}" for b in ref_run["buckets"]) + " |")
    png = tmp_path / "mean.png"
    run([sys.executable, "scripts/length_eval.py", "plot", "--mean", *(o["path"] for o in outs.values()),
         "--out", str(png), "--train-max-len", "19"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    other = tmp_path / "other"
    other.mkdir()
    _corpus(other, seed=5)
    run([sys.executable, "scripts/length_eval.py", "score", "--name", "x", "--src", str(other / "src"),
         "--ref", str(other / "ref"), "--hyp", str(other / "hyp"), "--edges", "1,20,inf", "--out", str(other / "x.json")])
    proc = run([sys.executable, "scripts/length_eval.py", "table", "--mean", seeds[0]["path"], str(other / "x.json")],
               check=False)
    assert proc.returncode != 0 and proc.stdout.strip().splitlines() == [
        "length_eval.py: the inputs were scored on different test sets (their buckets hold different numbers of "
        "sentences)"]
    (other / "summary.json").write_text('{"models": {}}')
    proc = run([sys.executable, "scripts/length_eval.py", "table", str(other / "x.json"), str(other / "summary.json")],
               check=False)
    assert proc.returncode != 0 and proc.stdout.strip().splitlines() == [
        f"length_eval.py: {other / 'summary.json'} is not a result of length_eval.py score "
        "(lacks name, bleu, sentences or buckets)"]
