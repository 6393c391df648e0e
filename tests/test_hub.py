"""Python API: any of our trained checkpoints loads through fairseq's hub interface and translates exactly as
fairseq-generate does (same beam, same length penalty)."""
import pytest

from fairseq_plugins.schemes import POSITION_TRANSFORMER, SCHEMES, by_model

DEMO = {by_model(m).arch("tiny") for m in ("transformer", "relative", "floater")}  # test_learning.py trains them
# Every scheme with architectures of its own family, and the demo models (Shaw's is position_transformer's);
# position_transformer's others (T5, RoPE, ...): in test_position_schemes.py, from checkpoints of a few updates
# (a trained one costs minutes per scheme).
ARCHS = [s.arch("tiny") for s in SCHEMES.values()
         if s.arch_prefix and (s.family != POSITION_TRANSFORMER or s.arch("tiny") in DEMO)]


@pytest.mark.parametrize("arch", ARCHS)
def test_hub_translate_equals_generate(toy_data, toy_models, arch):
    import fairseq_plugins  # noqa: F401  (registers the archs)
    from fairseq.models.transformer import TransformerModel

    # the trained demo models where the learning tests train them anyway; 2 epochs suffice for the others
    ckpt = toy_models.checkpoint(arch) if arch in DEMO else toy_models.checkpoint(arch, epochs=2)
    _, generated = toy_models.evaluate(ckpt)
    model = TransformerModel.from_pretrained(
        str(ckpt.parent), checkpoint_file=ckpt.name, data_name_or_path=str(toy_data / "bin"),
        bpe="sentencepiece", sentencepiece_model=str(toy_data / "spm.model"), source_lang="src", target_lang="tgt")
    model.eval()
    assert model.models[0].__class__.__name__ != "TransformerModel" or arch == "transformer_tiny"
    sources = (toy_data / "raw" / "test.src").read_text(encoding="utf-8").splitlines()[:12]
    assert model.translate(sources, beam=4, lenpen=0.6) == generated[:12]
    assert model.translate(sources[0], beam=4, lenpen=0.6) == generated[0]
