"""relative_transformer through fairseq's own argument parsing, task and model-building path."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.modules import MultiheadAttention, SinusoidalPositionalEmbedding
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationTask

from helpers.tiny_models import assert_incremental_with_reorder_equals_full, fixed_batch

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "fairseq_plugins"
FAIRSEQ_TRAIN = Path(sys.executable).parent / "fairseq-train"


def parse(arch, *flags):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["unused-data-dir", "--user-dir", str(PLUGINS), "--task", "translation", "--arch", arch, *flags]
    )
    return args, parser


def build(arch, *flags, vocab=12):
    args, _ = parse(arch, *flags)
    dictionary = Dictionary()
    for i in range(vocab):
        dictionary.add_symbol(f"w{i}")
    task = TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(0)
    return task.build_model(args), task


def shaw_classes():
    from fairseq_plugins.modules.positional_attention import PositionalSelfAttention
    from fairseq_plugins.modules.relative_attention import ShawRelative

    return PositionalSelfAttention, ShawRelative


def test_tiny_arch_has_fairseqs_transformer_tiny_dims():
    args, _ = parse("relative_transformer_tiny")
    tiny, _ = parse("transformer_tiny")
    for name in ("encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_layers", "encoder_attention_heads",
                 "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_layers", "decoder_attention_heads", "dropout"):
        assert getattr(args, name) == getattr(tiny, name), name
    assert (args.max_relative_positions, args.relative_keys, args.relative_values, args.relative_per_head) == (
        4, True, True, True)


def test_self_attention_is_relative_cross_attention_is_fairseqs():
    """The family's one self-attention with the stack's Shaw scheme; the tables are each layer's own (as in the
    paper, and under the state-dict keys relative_transformer always wrote)."""
    model, _ = build("relative_transformer_tiny")
    attention, shaw = shaw_classes()
    assert "PositionTransformerModel" in [c.__name__ for c in type(model).__mro__]
    assert model.position_schemes() == ("shaw", "shaw")
    tables = []
    for stack in (model.encoder, model.decoder):
        assert isinstance(stack.position_scheme, shaw)
        for layer in stack.layers:
            assert type(layer.self_attn) is attention and layer.self_attn.scheme is stack.position_scheme
            assert layer.self_attn.relative_keys.shape == (2, 9, 32)  # (heads, 2k+1, d_z)
            tables += [layer.self_attn.relative_keys, layer.self_attn.relative_values]
    assert len({id(t) for t in tables}) == len(tables) == 8
    assert {k for k in model.state_dict() if "relative" in k} == {
        f"{side}.layers.{i}.self_attn.relative_{t}" for side in ("encoder", "decoder") for i in (0, 1)
        for t in ("keys", "values")}
    for layer in model.decoder.layers:
        assert type(layer.encoder_attn) is MultiheadAttention


def test_absolute_positions_only_with_the_flag():
    model, _ = build("relative_transformer_tiny")
    assert model.encoder.embed_positions is None and model.decoder.embed_positions is None
    model, _ = build("relative_transformer_tiny", "--relative-add-absolute-positions")
    assert isinstance(model.encoder.embed_positions, SinusoidalPositionalEmbedding)
    assert isinstance(model.decoder.embed_positions, SinusoidalPositionalEmbedding)


@pytest.mark.parametrize("flags,key_shape,value_shape", [
    (("--relative-shared-heads", "--max-relative-positions", "2"), (5, 32), (5, 32)),
    (("--no-relative-values",), (2, 9, 32), None),
    (("--no-relative-keys", "--relative-per-head"), None, (2, 9, 32)),
    (("--max-relative-positions", "0"), (2, 1, 32), (2, 1, 32)),
])
def test_flags_shape_the_tables(flags, key_shape, value_shape):
    model, _ = build("relative_transformer_tiny", *flags)
    attn = model.decoder.layers[1].self_attn
    assert (None if attn.relative_keys is None else tuple(attn.relative_keys.shape)) == key_shape
    assert (None if attn.relative_values is None else tuple(attn.relative_values.shape)) == value_shape


def test_paper_architectures():
    base, _ = parse("relative_transformer_wmt_en_de")
    assert (base.encoder_embed_dim, base.encoder_attention_heads, base.encoder_ffn_embed_dim,
            base.decoder_ffn_embed_dim, base.encoder_layers, base.decoder_layers, base.dropout) == (
        512, 8, 1024, 1024, 6, 6, 0.1)
    assert (base.max_relative_positions, base.relative_per_head, base.relative_add_absolute_positions) == (
        16, True, False)
    for arch, dropout in (("relative_transformer_vaswani_wmt_en_de_big", 0.3),
                          ("relative_transformer_vaswani_wmt_en_fr_big", 0.1)):
        big, _ = parse(arch)
        assert (big.encoder_embed_dim, big.encoder_attention_heads, big.encoder_ffn_embed_dim, big.dropout) == (
            1024, 16, 4096, dropout)
        assert (big.max_relative_positions, big.relative_per_head, big.relative_keys, big.relative_values) == (
            8, False, True, True)


def test_base_parameter_count_is_the_transformers_plus_the_tables():
    relative, _ = build("relative_transformer_wmt_en_de")
    plain, _ = build("transformer_wmt_en_de", "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024")
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    layers, k, d_z, heads, tables = 6 + 6, 16, 512 // 8, 8, 2
    assert count(relative) - count(plain) == layers * (2 * k + 1) * d_z * heads * tables == 405_504


def test_every_flag_has_help():
    _, parser = parse("relative_transformer")
    ours = [a for a in parser._actions if any(s.startswith(("--relative", "--no-relative", "--max-relative"))
                                               for s in a.option_strings)]
    assert {s for a in ours for s in a.option_strings} == {
        "--max-relative-positions", "--relative-keys", "--no-relative-keys", "--relative-values",
        "--no-relative-values", "--relative-per-head", "--relative-shared-heads", "--relative-add-absolute-positions"}
    assert all(a.help for a in ours)


def test_incremental_decoding_with_reorder_equals_full_forward():
    model, task = build("relative_transformer_tiny")
    model.eval().double()
    assert_incremental_with_reorder_equals_full(model, atol=1e-5)


def test_beam_search_scores_match_teacher_forcing():
    model, task = build("relative_transformer_tiny")
    model.eval()
    src, lengths, _ = fixed_batch()
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=8)
    hypos = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    eos = task.target_dictionary.eos()
    for b, sentence in enumerate(hypos):
        for hypo in sentence:
            tokens = hypo["tokens"]
            prev = torch.cat([tokens.new_tensor([eos]), tokens[:-1]])[None]
            net = model(src[b : b + 1], lengths[b : b + 1], prev)
            lprobs = model.get_normalized_probs(net, log_probs=True)[0]
            teacher = lprobs.gather(1, tokens[:, None])[:, 0]
            torch.testing.assert_close(hypo["positional_scores"], teacher, rtol=0, atol=1e-4)


def test_negative_clipping_distance_fails_at_build():
    args, _ = parse("relative_transformer_tiny")
    args.max_relative_positions = -3
    with pytest.raises(ValueError, match=r"^--max-relative-positions must be >= 0 \(got -3\)"):
        TranslationTask.build_model(TranslationTask(args, Dictionary(), Dictionary()), args)


@pytest.mark.parametrize("flags,message", [
    (("--relative-add-absolute-positions", "--no-token-positional-embeddings"),
     "--no-token-positional-embeddings contradicts the encoder's position scheme shaw, which adds position "
     "embeddings"),
    (("--cross-self-attention",), "does not support --cross-self-attention"),
])
def test_contradictory_flags_fail_at_build(flags, message):
    with pytest.raises(ValueError, match=message):
        build("relative_transformer_tiny", *flags)


def test_negative_clipping_distance_is_one_cli_line(tmp_path):
    save_dir = tmp_path / "checkpoints"
    proc = subprocess.run(
        [str(FAIRSEQ_TRAIN), str(tmp_path / "no-data"), "--user-dir", str(PLUGINS),
         "--arch", "relative_transformer_tiny", "--max-relative-positions", "-1", "--save-dir", str(save_dir)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "fairseq-train: error: argument --max-relative-positions: must be >= 0 (got -1); 0 is the paper's "
        "no-position ablation"
    ]
    assert not save_dir.exists()


def test_shaw_is_a_scheme_of_the_family_per_stack():
    """Shaw's positions in one stack and another scheme in the other, through --encoder/decoder-position-scheme:
    only the Shaw stack's attentions have tables, and step-by-step decoding equals the full forward."""
    model, _ = build("position_transformer", "--encoder-position-scheme", "shaw", "--decoder-position-scheme", "rope",
                     "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16",
                     "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16",
                     "--encoder-attention-heads", "2", "--decoder-attention-heads", "2")
    assert model.position_schemes() == ("shaw", "rope")
    assert model.encoder.layers[0].self_attn.relative_keys.shape == (2, 33, 8)  # k = 16 off the tiny archs
    assert not hasattr(model.decoder.layers[0].self_attn, "relative_keys")
    assert model.encoder.embed_positions is None and model.decoder.embed_positions is None
    model.eval().double()
    assert_incremental_with_reorder_equals_full(model, atol=1e-5)


def test_a_shaw_flag_on_another_scheme_is_refused():
    with pytest.raises(ValueError, match="--max-relative-positions is a shaw flag"):
        build("rope_transformer_tiny", "--max-relative-positions", "3")
