"""Every position scheme learns the toy task with the demo's training budget (word order decides the task)."""
import pytest

from test_pipeline import MIN_TOY_BLEU

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
