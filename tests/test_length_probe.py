"""scripts/study/length_probe.py: probes made of joined test sentences reach the asked multiple of the longest training
source (measured on the run's binarized data), every probe falls into exactly one bucket, each bucket's (and each
k's) score is the tokenized lowercased BLEU of exactly its probes, with the ratio of hypothesis to reference
sentences that shows an output stopping after its first sentence, and the share of multi-sentence training targets
that says whether joined probes are in the training distribution; decoding is scripts/generate.sh's, results are
atomic and portable, bad input is one line; the table is mean ± std over seeds and says when the models were
trained on single sentences; with the runs' data, it adds the repeated 4-grams that show an output looping and each
model's difference to the transformer."""
import json
import subprocess
import sys
from collections import Counter

import pytest

from conftest import REPO, env, load_script, run
from helpers.small_task import run1, small_data, train_cmd

from tooling.study import probe as probe_lib
from tooling.bleu import prepare, tokenized_bleu

length_probe = load_script("study/length_probe.py")


def naive_repeats(lines, n=4):
    """(repeated, all) n-grams: each n-gram occurring c times in one line repeats c - 1 times."""
    grams = [Counter(zip(*(words[i:] for i in range(n)))) for words in
             (prepare(line, lowercase=True, compounds=False).split() for line in lines)]
    return sum(c - 1 for g in grams for c in g.values()), sum(sum(g.values()) for g in grams)


def probe_cmd(data, checkpoint, out, *extra):
    return [sys.executable, "scripts/study/length_probe.py", "score", "--data", str(data), "--checkpoint", str(checkpoint),
            "--name", "transformer.seed1", "--src", "src", "--tgt", "tgt", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The small toy corpus and a transformer trained on it for a few updates."""
    data = small_data(tmp_path_factory)
    save = tmp_path_factory.mktemp("probe_model")
    run1(train_cmd(data, save, "transformer_tiny", "--encoder-layers", "1", "--decoder-layers", "1",
                   max_update=8))
    return data, save / "checkpoint_last.pt"


def test_probes_grow_until_enough_are_beyond_the_multiple():
    src = [f"s{i}" for i in range(10)]
    ref = [f"r{i}" for i in range(10)]
    probes = probe_lib.make_probes(src, ref, lambda text: len(text.split()) + 1, longest=3, per_k=4, beyond=2,
                                   max_k=20)
    # one word per sentence: k sentences are k + 1 tokens; > 2 × 3 = 6 tokens from k = 6 on: 4 probes at k = 6
    assert max(p[0] for p in probes) == 6 and len(probes) == 6 * 4
    k3 = [p for p in probes if p[0] == 3]
    assert [p[1] for p in k3] == [0, 2, 4, 6]  # the same starting points for every k (stride 10 // 4)
    assert k3[3][2] == "s6 s7 s8" and k3[3][3] == "r6 r7 r8"
    wrap = [p for p in probes if p[0] == 6][3]
    assert wrap[2] == "s6 s7 s8 s9 s0 s1"  # round the test set
    with pytest.raises(SystemExit, match="--max-k 5|k = 5"):
        probe_lib.make_probes(src, ref, lambda text: len(text.split()) + 1, 3, 4, 2, max_k=5)


def test_buckets_are_relative_to_the_longest_training_source():
    edges = probe_lib.parse_edges("1,1.5,2,3")
    assert probe_lib.bucket_labels(edges) == ["≤ 1×", "1–1.5×", "1.5–2×", "2–3×", "> 3×"]
    assert [probe_lib.bucket_of(r, edges) for r in (0.2, 1.0, 1.01, 1.5, 2.0, 2.5, 3.0, 3.01)] == \
        [0, 0, 1, 1, 2, 3, 3, 4]


def test_sentences_are_counted_by_their_ends():
    assert probe_lib.sentences("Ein Mann läuft. Eine Frau sitzt!") == 2
    assert probe_lib.sentences('Er ruft "Hallo!" Dann geht er.') == 2
    assert probe_lib.sentences("Zwei Männer mit 2.5 Hunden") == 0  # no end punctuation: no sentence
    assert probe_lib.sentences("Wer? Ich...") == 2
    assert probe_lib.multi_sentence_share(["A. B.", "C.", "D", "E. F. G."]) == 0.5
    assert probe_lib.multi_sentence_share([]) == 0.0


def test_an_output_that_stops_after_its_first_sentence_shows_in_the_sentence_ratio():
    """What the full-data models do on joined probes: one sentence, then EOS. BLEU and the length ratio fall with
    k whatever the cause; the sentence ratio names this one."""
    refs = ["Ein Hund rennt. Eine Katze schläft.", "Ein Mann isst. Ein Kind lacht. Eine Frau liest."]
    first = ["Ein Hund rennt.", "Ein Mann isst."]
    stopped = probe_lib.scores(first, refs)
    assert stopped["hyp_ref_sentences"] == round(2 / 5, 3) and stopped["hyp_ref_ratio"] == round(8 / 20, 3)
    assert probe_lib.scores(refs, refs) == {"bleu_tok_lc": 100.0, "hyp_ref_ratio": 1.0, "hyp_ref_sentences": 1.0}
    assert probe_lib.scores(["a b"], ["c d"])["hyp_ref_sentences"] is None  # references without sentence ends


@pytest.mark.slow  # decodes the probe with fairseq-preprocess and scripts/generate.sh (processes)
def test_score_a_finished_run(trained, tmp_path):
    data, checkpoint = trained
    out = tmp_path / "runs" / "transformer.seed1.probe.json"
    printed = run1(probe_cmd(data, checkpoint, out, "--per-k", "8")).stdout
    result = json.loads(out.read_text())
    # the longest training source as the encoder sees it: the most pieces of a training source + EOS
    pieces = [len(line.split()) for line in (data / "spm" / "train.src").read_text(encoding="utf-8").splitlines()]
    longest = max(pieces) + 1
    assert result["train_longest_source"] == longest
    buckets = result["buckets"]
    assert sum(b["probes"] for b in buckets) == result["probes"] == 8 * len(result["ks"])
    assert result["ks"] == list(range(1, max(result["ks"]) + 1))
    assert buckets[-1]["probes"] >= 8 and buckets[-1]["source_tokens"][0] > 3 * longest
    assert result["longest_probe_source"] == max(b["source_tokens"][1] for b in buckets if b["probes"])
    assert result["decoding"] == {"beam": 5, "lenpen": 1.0, "max_len_a": 2, "max_len_b": 10,
                                  "max_source_positions": 1024, "max_target_positions": 1024}
    # each bucket's BLEU is tok-lc BLEU on exactly its probes, rebuilt here from the test set and the hypotheses
    src = (data / "raw" / "test.src").read_text(encoding="utf-8").splitlines()
    ref = (data / "raw" / "test.tgt").read_text(encoding="utf-8").splitlines()
    hyps = (tmp_path / "runs" / "transformer.seed1.probe.hyp").read_text(encoding="utf-8").splitlines()
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    probes = probe_lib.make_probes(src, ref, lambda text: len(sp.encode(text)) + 1, longest, 8, 3.0, 60)
    assert len(hyps) == len(probes)
    edges = result["edges"]
    for i, b in enumerate(buckets):
        idx = [j for j, p in enumerate(probes) if probe_lib.bucket_of(p[4] / longest, edges) == i]
        assert len(idx) == b["probes"]
        if idx:
            bleu = tokenized_bleu([hyps[j] for j in idx], [probes[j][3] for j in idx], lowercase=True,
                                  compounds=False)
            assert b["bleu_tok_lc"] == round(bleu.score, 2) and b["hyp_ref_ratio"] == round(bleu.sys_len / bleu.ref_len, 3)
            assert b["hyp_ref_sentences"] == probe_lib.scores([hyps[j] for j in idx],
                                                              [probes[j][3] for j in idx])["hyp_ref_sentences"]
    # the same per k: every probe of a k, in the order the probes were made
    assert [r["k"] for r in result["by_k"]] == result["ks"]
    for row in result["by_k"]:
        idx = [j for j, p in enumerate(probes) if p[0] == row["k"]]
        assert row["probes"] == len(idx) == 8
        assert row["source_tokens"] == [min(probes[j][4] for j in idx), max(probes[j][4] for j in idx)]
        assert {key: row[key] for key in ("bleu_tok_lc", "hyp_ref_ratio", "hyp_ref_sentences")} == \
            probe_lib.scores([hyps[j] for j in idx], [probes[j][3] for j in idx])
    train_targets = (data / "raw" / "train.tgt").read_text(encoding="utf-8").splitlines()
    assert result["train_multi_sentence_targets"] == round(probe_lib.multi_sentence_share(train_targets), 4)
    assert "transformer.seed1: longest training source" in printed
    assert not list(tmp_path.rglob("*.tmp")) and not list((tmp_path / "runs").glob(".*"))


def generate_sh_test(data, checkpoint, folder, *extra):
    """The test set's hypotheses from scripts/generate.sh with the probe's decoding settings (and extra args)."""
    run(["bash", "scripts/generate.sh", str(data), str(checkpoint), "test", str(folder / "test.json"),
         "--max-len-a", "2", "--max-len-b", "10", *extra],
        env_extra={"SRC": "src", "TGT": "tgt", "BEAM": "5", "LENPEN": "1", "OMP_NUM_THREADS": "1"})
    return (folder / "test.hyp").read_text(encoding="utf-8").splitlines()


@pytest.mark.slow  # the probe and generate.sh, each decoding in its own processes
def test_the_decoding_is_generate_sh_s(trained, tmp_path):
    """The k = 1 probes are test sentences: their hypotheses are what scripts/generate.sh gives on test."""
    data, checkpoint = trained
    out = tmp_path / "p.probe.json"
    run1(probe_cmd(data, checkpoint, out, "--per-k", "4", "--beyond", "1"))
    hyps = (tmp_path / "p.probe.hyp").read_text(encoding="utf-8").splitlines()
    test = generate_sh_test(data, checkpoint, tmp_path)
    stride = len(test) // 4
    assert hyps[:4] == [test[j * stride] for j in range(4)]


@pytest.mark.slow  # a RoPE model trained, then the probe and generate.sh
def test_model_overrides_reach_the_decoding(trained, tmp_path):
    """--model-overrides (a RoPE scaled at decode time) is fairseq-generate's: the k = 1 probes are what generate.sh
    gives on test with the same overrides, the result records them, and a bad value is the model's own refusal."""
    data, _ = trained
    run1(train_cmd(data, tmp_path / "rope", "rope_transformer_tiny", "--encoder-layers", "1", "--decoder-layers",
                   "1", max_update=8))
    checkpoint = tmp_path / "rope" / "checkpoint_last.pt"
    overrides = "{'rope_scaling': 'linear', 'rope_scaling_factor': 4.0}"
    out = tmp_path / "rope_linear.seed1.probe.json"
    # one probe per test sentence (k = 1 only): the test set itself, in the same batches as generate.sh's, so
    # that the outputs' length cap (from the batch's longest source) is the same too
    sentences = len((data / "raw" / "test.src").read_text(encoding="utf-8").splitlines())
    one_each = ("--per-k", str(sentences), "--beyond", "0.01")
    run1(probe_cmd(data, checkpoint, out, *one_each, "--model-overrides", overrides))
    assert json.loads(out.read_text())["decoding"]["model_overrides"] == overrides
    hyps = (tmp_path / "rope_linear.seed1.probe.hyp").read_text(encoding="utf-8").splitlines()
    assert hyps == generate_sh_test(data, checkpoint, tmp_path, "--model-overrides", overrides)
    bad = run1(probe_cmd(data, checkpoint, tmp_path / "bad.probe.json", *one_each,
                         "--model-overrides", "{'rope_scaling': 'cubic'}"), check=False)
    assert bad.returncode != 0 and bad.stdout.strip().splitlines()[-1].startswith(
        "length_probe.py: decoding failed: ") and "--rope-scaling invalid choice: 'cubic'" in bad.stdout
    assert not (tmp_path / "bad.probe.json").exists()


@pytest.mark.parametrize("change, message", [
    ({"checkpoint": "missing.pt"}, "length_probe.py: --checkpoint: missing.pt not found"),
    ({"data": "nowhere"}, "length_probe.py: --data: nowhere/spm.model not found"),
    ({"extra": ["--edges", "2,1"]}, "length_probe.py: --edges must be positive and strictly increasing, got '2,1'"),
    ({"extra": ["--per-k", "5000"]}, "length_probe.py: the test set has 40 sentences: fewer than --per-k 5000"),
])
def test_bad_input_is_one_line(trained, tmp_path, change, message):
    data, checkpoint = trained
    cmd = probe_cmd(change.get("data", data), change.get("checkpoint", checkpoint), tmp_path / "x.probe.json",
                    *change.get("extra", []))
    proc = subprocess.run(cmd, cwd=REPO, env={**env(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [message]
    assert not list(tmp_path.iterdir())


def fake_result(name, model, bleus, ratios, longest=20, sentences=(1.0, 0.5, 0.3), multi=0.003):
    return {"name": name, "model": model, "train_longest_source": longest, "edges": [1, 2], "ks": [1, 2, 3],
            "per_k": 4, "test_sentences": 40, "probes": 12, "seconds": 3.0, "train_multi_sentence_targets": multi,
            "decoding": {"beam": 5, "lenpen": 1.0},
            "buckets": [{"bucket": label, "probes": 4, "source_tokens": [lo, lo + 9], "bleu_tok_lc": b,
                         "hyp_ref_ratio": r, "hyp_ref_sentences": n, "at_max_len": 0}
                        for label, lo, b, r, n in zip(["≤ 1×", "1–2×", "> 2×"], [5, 21, 41], bleus, ratios,
                                                      sentences)]}


def test_repeated_ngrams_are_those_seen_earlier_in_the_same_line():
    lines = ["Ein Mann im Park.", "im im im im im im", "Ein Hund , ein Hund , ein Hund , ein Hund .", "kurz"]
    assert probe_lib.repeated_ngrams(lines) == naive_repeats(lines) == (0 + 2 + 5, 2 + 3 + 9 + 0)
    # the same 4-gram in two lines is no repeat: each line is one output
    assert probe_lib.repeated_ngrams(["a b c d", "a b c d"]) == (0, 2)


def test_table_mean_and_std_over_seeds(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for name, model, bleus, ratios in (("t5.seed1", "t5", [30, 20, 10], [1.0, 0.9, 0.8]),
                                       ("t5.seed2", "t5", [32, 22, None], [1.0, 0.9, None]),
                                       ("rope.seed1", "rope", [31, 25, 18], [1.0, 1.0, 0.95]),
                                       ("rope.seed9", "rope", [0, 0, 0], [0, 0, 0])):  # a seed not asked for
        (runs / f"{name}.probe.json").write_text(json.dumps(fake_result(name, model, bleus, ratios)))
    (runs / "t5.seed1.retrained.probe.json").write_text("not read")
    out = run([sys.executable, "scripts/study/length_probe.py", "table", "--runs", str(runs), "--models", "t5 rope",
               "--seeds", "1 2", "--out", str(tmp_path / "probe_table.md")]).stdout
    assert out == (tmp_path / "probe_table.md").read_text(encoding="utf-8")
    assert "| model | runs | ≤ 1× (5–14) | 1–2× (21–30) | > 2× (41–50) |" in out
    assert "| t5 | 2 | 31.00 ± 1.41 | 21.00 ± 1.41 | 10.00 |" in out
    assert "| rope | 1 | 31.00 | 25.00 | 18.00 |" in out
    assert "| t5 | 2 | 1.00 ± 0.00 | 0.90 ± 0.00 | 0.80 |" in out
    sentences = out.split("**hypothesis / reference sentences (sentence ends)**")[1]
    assert "| rope | 1 | 1.00 | 0.50 | 0.30 |" in sentences
    # every run trained on single sentences (0.3% multi-sentence targets): the table says what that means
    assert "**Trained on single sentences** (0.3% or less of the training targets hold more than one)" in out
    assert "do not measure unseen positions" in out
    # trained with joined pairs: several sentences per input were in training, the buckets past 1× are unseen
    for name, model in (("t5.seed1", "t5"), ("t5.seed2", "t5"), ("rope.seed1", "rope")):
        (runs / f"{name}.probe.json").write_text(json.dumps(fake_result(name, model, [30, 20, 10], [1, 1, 1],
                                                                        multi=0.275)))
    joined = run([sys.executable, "scripts/study/length_probe.py", "table", "--runs", str(runs), "--models", "t5 rope",
                  "--seeds", "1 2"]).stdout
    assert "Trained on single sentences" not in joined
    assert "--model-overrides" not in joined  # every run decoded as it was trained
    scaled = fake_result("rope.seed1", "rope", [30, 20, 10], [1, 1, 1], multi=0.275)
    scaled["decoding"]["model_overrides"] = "{'rope_scaling': 'ntk', 'rope_scaling_factor': 4.0}"
    (runs / "rope.seed1.probe.json").write_text(json.dumps(scaled))
    noted = run([sys.executable, "scripts/study/length_probe.py", "table", "--runs", str(runs), "--models", "t5 rope",
                 "--seeds", "1 2"]).stdout
    assert "Decoded with --model-overrides: rope: {'rope_scaling': 'ntk', 'rope_scaling_factor': 4.0}." in noted
    assert "Training targets with more than one sentence: 27.5% (joined pairs up to the cap)" in joined
    (runs / "rope.seed1.probe.json").write_text(json.dumps(fake_result("rope.seed1", "rope", [1, 1, 1], [1, 1, 1],
                                                                       longest=30)))
    bad = run([sys.executable, "scripts/study/length_probe.py", "table", "--runs", str(runs), "--models", "t5 rope",
               "--seeds", "1 2"], check=False)
    assert bad.returncode != 0 and bad.stdout.strip().splitlines() == [
        "length_probe.py: rope.seed1 and t5.seed1 were probed differently (train_longest_source, edges, ks, per_k, "
        "test_sentences must agree): score them with the same data and settings"]


def test_table_differences_to_the_transformer_per_bucket(trained, tmp_path, monkeypatch, capsys):
    """With the runs' data, the table adds each model's mean per-seed BLEU difference to the transformer per bucket,
    from the hypotheses and the probes rebuilt from the data, with its interval over seeds and probes, and each
    model's share of repeated 4-grams per bucket (an output that loops) below the references' own."""
    data, checkpoint = trained
    runs = tmp_path / "runs"
    run1(probe_cmd(data, checkpoint, runs / "transformer.seed1.probe.json", "--per-k", "8"))
    first = json.loads((runs / "transformer.seed1.probe.json").read_text())
    src = (data / "raw" / "test.src").read_text(encoding="utf-8").splitlines()
    ref = (data / "raw" / "test.tgt").read_text(encoding="utf-8").splitlines()
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    longest = first["train_longest_source"]
    probes = probe_lib.make_probes(src, ref, lambda text: len(sp.encode(text)) + 1, longest, 8, 3.0, 60)
    refs = [p[3] for p in probes]
    hyps = {"transformer.seed1": (runs / "transformer.seed1.probe.hyp").read_text(encoding="utf-8").splitlines(),
            "transformer.seed2": [" ".join(r.split()[:-2]) for r in refs],
            "relative.seed1": refs, "relative.seed2": [" ".join(r.split()[1:] + r.split()[1:5] * 6) for r in refs]}
    for name, lines in hyps.items():
        (runs / f"{name}.probe.hyp").write_text("".join(h + "\n" for h in lines), encoding="utf-8")
        (runs / f"{name}.probe.json").write_text(json.dumps({**first, "name": name, "hypotheses": f"{name}.probe.hyp"}))

    def table(seeds):
        """The table's output, or its refusal; in this process, not a new one: the data's probes are rebuilt with
        fairseq's reader, whose import is most of a table's cost."""
        monkeypatch.setattr(sys, "argv", ["length_probe.py", "table", "--runs", str(runs), "--models",
                                          "transformer relative", "--seeds", seeds, "--data", str(data),
                                          "--src", "src", "--tgt", "tgt"])
        try:
            length_probe.main()
        except SystemExit as refusal:
            assert capsys.readouterr().out == ""  # the refusal alone, no part of a table
            return refusal.code
        return capsys.readouterr().out

    out = table("1 2").split("**Δ BLEU tok-lc against transformer**")[1]
    row = next(line for line in out.splitlines() if line.startswith("| relative | 2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")][2:]
    assert len(cells) == len(first["buckets"])
    for b, cell in enumerate(cells):
        idx = [j for j, p in enumerate(probes) if probe_lib.bucket_of(p[4] / longest, first["edges"]) == b]
        if not idx:
            assert cell == "–"
            continue
        bleu = {name: tokenized_bleu([lines[j] for j in idx], [refs[j] for j in idx], lowercase=True,
                                     compounds=False).score for name, lines in hyps.items()}
        effect = (bleu["relative.seed1"] - bleu["transformer.seed1"] + bleu["relative.seed2"]
                  - bleu["transformer.seed2"]) / 2
        value, interval = cell.split(" ", 1)
        low, high = (float(x) for x in interval.strip("[]").split(","))
        assert float(value) == pytest.approx(effect, abs=0.006) and low <= float(value) <= high
    repeats = table("1 2").split("**Repeated 4-grams**")[1].split("**Δ BLEU")[0].splitlines()

    def cells(head):
        return [c.strip() for c in next(line for line in repeats if line.startswith(head)).strip("|").split("|")][2:]

    checked = 0
    for b, (ref_cell, cell) in enumerate(zip(cells("| references |"), cells("| relative | 2 |"))):
        idx = [j for j, p in enumerate(probes) if probe_lib.bucket_of(p[4] / longest, first["edges"]) == b]
        share = {name: naive_repeats([hyps[name][j] for j in idx]) for name in ("relative.seed1", "relative.seed2")}
        if not idx or not share["relative.seed1"][1]:  # no probe, or references shorter than 4 tokens
            assert ref_cell == "–"
            continue
        share = {name: repeated / total for name, (repeated, total) in share.items()}
        assert float(ref_cell) == pytest.approx(share["relative.seed1"], abs=0.006)  # relative.seed1 is the references
        mean, std = (float(x) for x in cell.split(" ± "))
        assert mean == pytest.approx((share["relative.seed1"] + share["relative.seed2"]) / 2, abs=0.006)
        assert std == pytest.approx(abs(share["relative.seed1"] - share["relative.seed2"]) / 2 ** 0.5, abs=0.006)
        assert share["relative.seed2"] > share["relative.seed1"]  # the looping outputs
        checked += 1
    assert checked
    one = table("1").split("**Δ BLEU tok-lc against transformer**")[1]
    assert "| relative | 1 | " in one and "(one seed)" in one
    # data the runs were not probed on: one line, not a table
    for name in hyps:
        path = runs / f"{name}.probe.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "train_longest_source": longest + 1}))
    assert table("1 2") == (
        f"length_probe.py: --data {data}: its probes (k = 1..{max(first['ks'])}, longest training source {longest}) "
        f"are not the runs' (k = 1..{max(first['ks'])}, {longest + 1}): give the runs' data")
