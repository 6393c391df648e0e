"""The Multi30k study recipe's test corpus and call, shared by the study's test files (one file a worker)."""
import sys

import pytest

from conftest import run

TINY = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
        "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 --decoder-attention-heads 2")
MODELS = ("transformer", "floater_warm")
SEEDS = (1, 2)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The toy SVO -> SOV task in Multi30k's file layout (train / val / test_2016_flickr, .en / .de)."""
    root = tmp_path_factory.mktemp("study_corpus")
    run([sys.executable, "scripts/make_toy_data.py", "--out", str(root / "toy"), "--train", "400", "--valid", "40",
         "--test", "60", "--test-long", "4", "--seed", "3"])
    for split, name in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
        for side, lang in (("src", "en"), ("tgt", "de")):
            (root / f"{name}.{lang}").write_bytes((root / "toy" / f"{split}.{side}").read_bytes())
    return root


def study(corpus, work, check=True, **overrides):
    env = {"MULTI30K_DIR": str(corpus), "DATA_DIR": str(work / "data"), "CKPT_ROOT": str(work / "ckpt"),
           "OUT_DIR": str(work / "results"), "MODELS": " ".join(MODELS), "SEEDS": " ".join(map(str, SEEDS)),
           "EPOCHS": "1", "WARMUP": "10", "FT_EPOCHS": "1", "FT_WARMUP": "5", "AVG": "1", "FT_AVG": "1",
           "VOCAB": "200", "MAX_TOKENS": "1024", "MODEL_ARGS": TINY, "JOBS": "2"}
    env.update(overrides)
    return run(["bash", "scripts/recipes/multi30k_study.sh"], check=check, env_extra=env)
