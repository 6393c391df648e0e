"""Real-text smoke run: scripts/demos/multi30k_demo.sh end to end on a slice of Multi30k (../shared/data/multi30k).

Checks the mechanics on text no one here made (Unicode, real tokenization, the train-short filter, every test
sentence translated and bucketed, table and plot); one epoch of tiny models, so no BLEU level is asserted here.
"""
import json
import math

import pytest

from conftest import SHARED_DATA, run

MULTI30K = SHARED_DATA / "multi30k"
SLICE = {"train": 3000, "val": 200, "test_2016_flickr": 120}
MODELS = ("transformer_tiny", "relative_transformer_tiny", "floater_transformer_tiny")
MAX_TRAIN_LEN = 12


@pytest.fixture(scope="module")
def multi30k_slice(tmp_path_factory):
    if not all((MULTI30K / f"{split}.{lang}").is_file() for split in SLICE for lang in ("en", "de")):
        pytest.skip(f"real text absent: {MULTI30K} lacks train/val/test_2016_flickr.{{en,de}}")
    out = tmp_path_factory.mktemp("multi30k_slice")
    for split, n in SLICE.items():
        for lang in ("en", "de"):
            with open(MULTI30K / f"{split}.{lang}", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (out / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return out


def recipe(slice_dir, work):
    return run(["bash", "scripts/demos/multi30k_demo.sh"], env_extra={
        "MULTI30K_DIR": str(slice_dir), "DATA_DIR": str(work / "data"), "CKPT_ROOT": str(work / "ckpt"),
        "OUT_DIR": str(work / "results"), "EPOCHS": "1", "VOCAB": "800", "MAX_TRAIN_LEN": str(MAX_TRAIN_LEN),
        "MODELS": " ".join(MODELS), "SMALL_MODEL_ARGS": "--encoder-layers 1 --decoder-layers 1"})


def test_multi30k_recipe_runs_end_to_end(multi30k_slice, tmp_path):
    out = recipe(multi30k_slice, tmp_path).stdout
    src = (multi30k_slice / "train.en").read_text(encoding="utf-8").splitlines()
    tgt = (multi30k_slice / "train.de").read_text(encoding="utf-8").splitlines()
    kept = [i for i, s in enumerate(src) if len(s.split()) <= MAX_TRAIN_LEN]
    assert 0 < len(kept) < len(src), "the slice must exercise the filter"
    assert f"kept {len(kept)} of {len(src)} pairs" in out
    # the train-short split is exactly the short pairs, aligned, byte for byte
    raw = tmp_path / "data" / "raw"
    assert (raw / "train.en").read_text(encoding="utf-8").splitlines() == [src[i] for i in kept]
    assert (raw / "train.de").read_text(encoding="utf-8").splitlines() == [tgt[i] for i in kept]

    test_src = (multi30k_slice / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    longest = max(len(s.split()) for s in test_src)
    assert longest > MAX_TRAIN_LEN, "the test slice must hold sentences longer than any trained on"
    results = tmp_path / "results"
    for arch in MODELS:
        exp = f"multi30k_ende_{arch[:-len('_tiny')]}"
        hyps = (results / f"{exp}.test.hyp").read_text(encoding="utf-8").splitlines()
        assert len(hyps) == len(test_src), f"{arch}: every test sentence gets a hypothesis"
        assert sum(bool(h.strip()) for h in hyps) > len(hyps) // 2, f"{arch}: mostly empty output"
        length = json.loads((results / f"{exp}.length.json").read_text())
        assert sum(b["sentences"] for b in length["buckets"]) == len(test_src)
        assert length["buckets"][-1]["hi"] is None and length["buckets"][-1]["sentences"] > 0
        assert math.isfinite(length["bleu"])
        assert json.loads((results / f"{exp}.test.json").read_text())["sentences"] == len(test_src)

    table = (results / "table.md").read_text(encoding="utf-8").splitlines()
    assert [row.split("|")[1].strip() for row in table[3:]] == [a[:-len("_tiny")] for a in MODELS]
    assert "\n".join(table) in out
    assert (results / "length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a rerun reuses the data, the finished checkpoints and their translations, and reproduces the table
    ckpts = sorted((tmp_path / "ckpt").glob("*/checkpoint_best.pt"))
    assert len(ckpts) == len(MODELS)
    stamps = [p.stat().st_mtime_ns for p in ckpts]
    again = recipe(multi30k_slice, tmp_path).stdout
    assert [p.stat().st_mtime_ns for p in ckpts] == stamps
    assert (results / "table.md").read_text(encoding="utf-8").splitlines() == table
    assert "kept" not in again, "prepared data is reused"
    assert again.count("reusing") == len(MODELS)


def test_multi30k_recipe_names_a_missing_file(tmp_path):
    (tmp_path / "train.en").write_text("a dog runs\n", encoding="utf-8")
    proc = run(["bash", "scripts/demos/multi30k_demo.sh"], check=False, env_extra={
        "MULTI30K_DIR": str(tmp_path), "DATA_DIR": str(tmp_path / "data"), "OUT_DIR": str(tmp_path / "results"),
        "CKPT_ROOT": str(tmp_path / "ckpt")})
    assert proc.returncode != 0
    assert proc.stdout.strip().splitlines() == [
        f"multi30k_demo.sh: MULTI30K_DIR={tmp_path} lacks train.de (expected train, val, test_2016_flickr .en/.de)"]
    assert not (tmp_path / "data").exists(), "nothing is written before the input is checked"
