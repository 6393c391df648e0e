"""The Multi30k study recipe's test corpus and call, shared by the study's test files (one file a worker), and the
study's first run (transformer, seed 1), trained once per test run and copied into each test that starts from it."""
import shutil
import sys

import pytest

from conftest import built_once, run

TINY = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
        "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 --decoder-attention-heads 2")
MODELS = ("transformer", "floater_warm")
SEEDS = (1, 2)
# what a study folder holds (study() below): the prepared data, the checkpoints, the results
PARTS = ("data", "ckpt", "results")
TEXT = {".json", ".md", ".txt", ".log", ".hyp"}  # files that may record a path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The toy SVO -> SOV task in Multi30k's file layout (train / val / test_2016_flickr, .en / .de), made once per
    test run (the workers share it: it is the same for every test)."""
    def build(root):
        run([sys.executable, "scripts/make_toy_data.py", "--out", str(root / "toy"), "--train", "400", "--valid",
             "40", "--test", "60", "--test-long", "4", "--seed", "3"])
        for split, name in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
            for side, lang in (("src", "en"), ("tgt", "de")):
                (root / f"{name}.{lang}").write_bytes((root / "toy" / f"{split}.{side}").read_bytes())
    return built_once(tmp_path_factory, "study_corpus", build)


@pytest.fixture(scope="module")
def first_run(corpus, tmp_path_factory):
    """A study folder where `study(corpus, folder, MODELS="transformer", SEEDS="1", JOBS="1")` has run (data prepared,
    transformer seed 1 trained, averaged, decoded, probed, tabulated), made once per test run: several tests start
    from it, and training it again in each would only repeat the same deterministic run (one thread, one seed)."""
    return built_once(tmp_path_factory, "study_first_run",
                      lambda folder: study(corpus, folder, MODELS="transformer", SEEDS="1", JOBS="1"))


def start_from(first_run, work):
    """Copy first_run's study folder into work, as if the study had run there: the paths its results and logs
    record (checkpoint, reference, hypotheses) are rewritten to work's, so that nothing a test reads or changes
    leads back to the shared folder."""
    for part in PARTS:
        shutil.copytree(first_run / part, work / part, symlinks=True)
        for f in (work / part).rglob("*"):
            if f.suffix in TEXT and f.is_file():
                text = f.read_text(encoding="utf-8")
                if str(first_run) in text:
                    f.write_text(text.replace(str(first_run), str(work)), encoding="utf-8")


def study(corpus, work, check=True, **overrides):
    env = {"MULTI30K_DIR": str(corpus), "DATA_DIR": str(work / "data"), "CKPT_ROOT": str(work / "ckpt"),
           "OUT_DIR": str(work / "results"), "MODELS": " ".join(MODELS), "SEEDS": " ".join(map(str, SEEDS)),
           "EPOCHS": "1", "WARMUP": "10", "FT_EPOCHS": "1", "FT_WARMUP": "5", "AVG": "1", "FT_AVG": "1",
           "VOCAB": "200", "MAX_TOKENS": "1024", "MODEL_ARGS": TINY, "JOBS": "2",
           # the probe from 5 starting points, not the recipe's 20: a model of one epoch writes to the length cap,
           # so the probe's decoding was most of a run's cost
           "PROBE_PER_K": "5"}
    env.update(overrides)
    return run(["bash", "scripts/study/multi30k_study.sh"], check=check, env_extra=env)
