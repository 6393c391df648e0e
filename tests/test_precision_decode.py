"""Trained tiny models decode (beam 4) in bf16 and fp16 as in float32: the same hypotheses on the toy test set,
up to a stated agreement (a low-precision forward can flip a close call between two beam candidates)."""
import pytest
import sacrebleu
import torch

# Measured on the first 200 toy test sentences (docs/mixed_precision.md): 98.0–100% identical, BLEU within 0.3.
MIN_IDENTICAL = 0.95  # share of hypotheses identical to float32's
MAX_BLEU_DROP = 1.0
SENTENCES = 200
FLOAT32 = {}  # checkpoint -> its float32 hypotheses of the SENTENCES (this module's tests share them)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("arch", ["relative_transformer_tiny", "floater_transformer_tiny"])
def test_low_precision_decoding_gives_float32s_hypotheses(toy_data, toy_models, arch, dtype):
    import fairseq_plugins  # noqa: F401  (registers the archs)
    from fairseq.models.transformer import TransformerModel

    ckpt = toy_models.checkpoint(arch)  # the demo models the learning tests train anyway
    model = TransformerModel.from_pretrained(
        str(ckpt.parent), checkpoint_file=ckpt.name, data_name_or_path=str(toy_data / "bin"),
        bpe="sentencepiece", sentencepiece_model=str(toy_data / "spm.model"), source_lang="src", target_lang="tgt")
    model.eval()
    sources = (toy_data / "raw" / "test.src").read_text(encoding="utf-8").splitlines()[:SENTENCES]
    references = (toy_data / "raw" / "test.tgt").read_text(encoding="utf-8").splitlines()[:SENTENCES]
    if ckpt not in FLOAT32:  # float32's hypotheses once per model: both low precisions compare with them
        FLOAT32[ckpt] = model.translate(sources, beam=4, lenpen=0.6)
    fp32 = FLOAT32[ckpt]
    low = model.to(dtype).translate(sources, beam=4, lenpen=0.6)
    assert next(model.parameters()).dtype == dtype
    identical = sum(a == b for a, b in zip(fp32, low)) / len(fp32)
    bleu32 = sacrebleu.corpus_bleu(fp32, [references]).score
    bleu_low = sacrebleu.corpus_bleu(low, [references]).score
    print(f"{arch} {dtype}: {identical:.1%} identical, BLEU {bleu32:.2f} (float32) vs {bleu_low:.2f}")
    assert identical >= MIN_IDENTICAL and bleu_low >= bleu32 - MAX_BLEU_DROP, (identical, bleu32, bleu_low)
