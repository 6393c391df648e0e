"""Every position scheme learns the toy task with the demo's training budget (word order decides the task)."""
import pytest
import sacrebleu

import make_toy_data

# Measured: transformer_tiny, 12 epochs of the toy recipe -> BLEU ~90 on the toy test set, while copying
# the source scores ~0 and word-by-word lexicon translation (no reordering) ~2.4.
MIN_TOY_BLEU = 70.0

# Measured with the demo recipe (12 epochs): transformer ~90, relative ~9x, FLOATER ~9x BLEU on the toy test set.
RELATIVE_MAX_DEFICIT = 2.0  # relative must learn at least as well as the transformer, up to run-to-run noise


def test_relative_transformer_learns_at_least_as_well_as_transformer(toy_models):
    transformer = toy_models.evaluate(toy_models.checkpoint("transformer_tiny"))[0]["bleu"]
    relative = toy_models.evaluate(toy_models.checkpoint("relative_transformer_tiny"))[0]["bleu"]
    assert relative >= MIN_TOY_BLEU
    assert relative >= transformer - RELATIVE_MAX_DEFICIT, (relative, transformer)


@pytest.mark.parametrize("arch", ["floater_transformer_tiny"])
def test_floater_learns(toy_models, arch):
    assert toy_models.evaluate(toy_models.checkpoint(arch))[0]["bleu"] >= MIN_TOY_BLEU


def test_tiny_transformer_learns_toy_task(toy_data, toy_models):
    bleu = toy_models.evaluate(toy_models.checkpoint("transformer_tiny"))[0]["bleu"]

    src = (toy_data / "raw" / "test.src").read_text().splitlines()
    ref = (toy_data / "raw" / "test.tgt").read_text().splitlines()
    copy_bleu = sacrebleu.corpus_bleu(src, [ref]).score
    word_by_word_bleu = sacrebleu.corpus_bleu([make_toy_data.word_by_word(s) for s in src], [ref]).score
    assert copy_bleu < 1.0 and word_by_word_bleu < 10.0
    assert bleu >= MIN_TOY_BLEU, f"transformer_tiny reached BLEU {bleu}"
