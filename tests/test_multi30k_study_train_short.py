"""scripts/study/multi30k_study.sh's train-short condition (MAX_TRAIN_LEN, MAX_TRAIN_TOKENS, JOIN_TRAIN) and its
length probe beyond the training lengths."""
import json
import sys

from conftest import run
from helpers.study_corpus import corpus, first_run, start_from, study  # noqa: F401  (fixtures)


def test_train_short_test_long_protocol(corpus, first_run, tmp_path):
    """MAX_TRAIN_LEN: training pairs with at most that many source words, BLEU by source length for each run
    and, beside it, for the same model and seed trained on all lengths with the same recipe (the study without
    MAX_TRAIN_LEN); the study table reads only the run results (not the by-length files)."""
    start_from(first_run, tmp_path)  # study(corpus, tmp_path, MODELS="transformer", SEEDS="1", JOBS="1"), shared
    results = tmp_path / "results"
    # PROBE=0: the probe of a train-short run is test_train_short_in_tokens's
    short = {"MODELS": "transformer", "SEEDS": "1", "JOBS": "1", "MAX_TRAIN_LEN": "10", "EDGES": "1,11,21",
             "PROBE": "0",
             "DATA_DIR": str(tmp_path / "data10"), "CKPT_ROOT": str(tmp_path / "ckpt10"),
             "OUT_DIR": str(results / "len10")}
    out = study(corpus, tmp_path, **short).stdout
    train = (tmp_path / "data10" / "raw" / "train.en").read_text(encoding="utf-8").splitlines()
    assert train and max(len(line.split()) for line in train) == 10
    by_length = json.loads((results / "len10" / "runs" / "transformer.seed1.length.json").read_text())
    assert [b["sentences"] for b in by_length["buckets"]] == [26, 34]  # the test set's 1-10 and 11-20 words
    assert by_length["model"] == "transformer" and by_length["note"] is None
    reference = json.loads((results / "len10" / "all_lengths" / "transformer.seed1.length.json").read_text())
    assert reference["note"] == "trained on all lengths" and reference["hyp"] == [
        str(results / "runs" / "transformer.seed1.hyp")]
    assert [b["sentences"] for b in reference["buckets"]] == [26, 34]
    length_table = (results / "len10" / "length_table.md").read_text(encoding="utf-8").splitlines()
    assert [row.split(" | ")[0] for row in length_table[3:]] == [
        "| transformer (1 run)", "| transformer (1 run), trained on all lengths"]
    table = (results / "len10" / "table.md").read_text(encoding="utf-8")
    assert "| transformer | 1/1 |" in table and "The 34 test sentences whose source has more than 10 words (longer " \
        "than any training sentence): " in table
    assert (results / "len10" / "length.png").is_file() and "results:" in out
    # the references' own table, split at the same length, from the test references of this data directory
    reference_table = (results / "len10" / "all_lengths" / "table.md").read_text(encoding="utf-8")
    assert "| transformer | 1/1 |" in reference_table and "The 34 test sentences whose source has more than " \
        "10 words (seen in training): " in reference_table

    # a reference trained with another recipe is named and left out, never compared silently
    recorded = results / "runs" / "transformer.seed1.json"
    recorded.write_text(recorded.read_text().replace("beam=5", "beam=4"))
    out = study(corpus, tmp_path, **short).stdout
    assert ": training " not in out  # nothing retrained
    assert "== transformer.seed1 trained on all lengths: " in out and "has another recipe; not compared" in out
    assert not (results / "len10" / "all_lengths" / "transformer.seed1.length.json").exists()
    assert not (results / "len10" / "all_lengths" / "table.md").exists()
    assert len((results / "len10" / "length_table.md").read_text(encoding="utf-8").splitlines()) == 4


def test_train_short_in_tokens(corpus, tmp_path):
    """MAX_TRAIN_TOKENS: the training pairs whose source and target each have at most that many pieces of the run's
    own sentencepiece model, which is the full training set's (so the cap is exact); the probe measures from the
    longest source kept. SHAPE runs with --shape-max-shift SHAPE_K, recorded in its result."""
    cap = 14
    out = study(corpus, tmp_path, MODELS="transformer shape", SEEDS="1", JOBS="1", MAX_TRAIN_TOKENS=str(cap),
                SHAPE_K="7").stdout
    import sentencepiece as spm

    data = tmp_path / "data"
    full = tmp_path / "full_spm"
    full.mkdir()
    run([sys.executable, "scripts/spm_train.py", "--input", str(corpus / "train.en"), str(corpus / "train.de"),
         "--model-prefix", str(full / "spm"), "--vocab-size", "200"])
    assert (full / "spm.vocab").read_text(encoding="utf-8") == (data / "spm.vocab").read_text(encoding="utf-8")
    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    pairs = list(zip(*((corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de"))))
    keep = [(s, t) for s, t in pairs if len(sp.encode(s)) <= cap and len(sp.encode(t)) <= cap]
    assert 0 < len(keep) < len(pairs)
    assert list(zip(*((data / "raw" / f"train.{lang}").read_text(encoding="utf-8").splitlines()
                      for lang in ("en", "de")))) == keep
    assert f"kept {len(keep)} of {len(pairs)} pairs with <= {cap} sentencepiece pieces on both sides" in out
    runs = tmp_path / "results" / "runs"
    result = json.loads((runs / "transformer.seed1.json").read_text())
    assert f"max_train_len=none max_train_tokens={cap} model_args=" in result["recipe"]
    probe = json.loads((runs / "transformer.seed1.probe.json").read_text())
    assert probe["train_longest_source"] == max(len(sp.encode(s)) for s, _ in keep) + 1 <= cap + 1
    shape = json.loads((runs / "shape.seed1.json").read_text())
    assert shape["shape_max_shift"] == "7" and "shape_max_shift" not in result
    log = (tmp_path / "ckpt" / "shape.seed1" / "train.log").read_text(encoding="utf-8")
    assert "shape_max_shift=7" in log.replace("'shape_max_shift': 7", "shape_max_shift=7")


def test_train_short_with_joined_pairs(corpus, tmp_path):
    """JOIN_TRAIN=1: the single pairs within MAX_TRAIN_TOKENS, then consecutive training pairs joined within the same
    cap (filter_by_length.py --join), in the recipe; the probe measures from the longest source, joins included."""
    import filter_by_length
    import sentencepiece as spm

    cap = 30  # the toy sentences are 11-40 pieces: some pairs of short ones fit
    out = study(corpus, tmp_path, MODELS="transformer", SEEDS="1", JOBS="1", MAX_TRAIN_TOKENS=str(cap),
                JOIN_TRAIN="1").stdout
    data = tmp_path / "data"
    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    pairs = list(zip(*((corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de"))))
    lengths = [(len(sp.encode(s)), len(sp.encode(t))) for s, t in pairs]
    singles = [p for p, (a, b) in zip(pairs, lengths) if a <= cap and b <= cap]
    runs = filter_by_length.packs([a for a, _ in lengths], [b for _, b in lengths], cap)
    joins = [tuple(" ".join(side) for side in zip(*pairs[a:b + 1])) for a, b in runs]
    written = list(zip(*((data / "raw" / f"train.{lang}").read_text(encoding="utf-8").splitlines()
                         for lang in ("en", "de"))))
    assert joins and written == singles + joins
    assert all(len(sp.encode(s)) <= cap and len(sp.encode(t)) <= cap for s, t in joins)  # the cap holds joined
    assert f"added {len(joins)} joins of 2-" in out
    result = json.loads((tmp_path / "results" / "runs" / "transformer.seed1.json").read_text())
    assert f"max_train_len=none max_train_tokens={cap} join_train=1 model_args=" in result["recipe"]
    probe = json.loads((tmp_path / "results" / "runs" / "transformer.seed1.probe.json").read_text())
    assert probe["train_longest_source"] == max(len(sp.encode(s)) for s, _ in written) + 1 <= cap + 1
