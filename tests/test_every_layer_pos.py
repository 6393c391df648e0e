"""Every-layer positions (modules/every_layer.py), a scheme of position_transformer under its own architecture
names (transformer_every_layer_pos*): the absolute encoding at every block's input, against a computation written
out by hand with fairseq's own layers; learned tables; incremental decoding; built by position_transformer's stacks
through the face's ``every_block``."""
import argparse
import math

import pytest
import torch
from fairseq import options
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from helpers import tiny_models
from helpers.tiny_models import EOS, PAD, TASK, VOCAB, batch, one_thread  # noqa: F401  (one_thread: autouse fixture)
from fairseq_plugins.flags import FlagError
from fairseq_plugins.models.position_transformer import PositionDecoder, PositionEncoder, PositionTransformerModel
from fairseq_plugins.schemes import SCHEMES, SIZES


def build(arch="transformer_every_layer_pos_tiny", seed=0, **kw):
    return tiny_models.build(arch, seed, **kw).double().eval()


def sinusoid(tokens, dim):
    """fairseq's sinusoidal encoding by hand: the token at position i (counting non-pads from 0) uses angle
    (padding_idx + 1 + i)·ω_k, sin on the first half of the channels, cos on the second; zero for pads."""
    keep = tokens.ne(PAD)
    pos = (torch.cumsum(keep, dim=1) * keep + PAD).double()  # fairseq's make_positions
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000) / (half - 1)))
    angle = pos.unsqueeze(-1) * freq
    return torch.cat([angle.sin(), angle.cos()], dim=-1) * keep.unsqueeze(-1)  # (B, T, C)


def by_hand(model, src, prev):
    """x^(1) = embedding + p; x^(n) = block_{n-1}(x^(n-1)) + p for n ≥ 2; fairseq's own layer maths."""
    enc, dec = model.encoder, model.decoder
    base_layer = lambda layer: layer.forward  # noqa: E731  (the fairseq block itself: no pre-hook, no signal)
    pe = sinusoid(src, enc.embed_tokens.embedding_dim).transpose(0, 1)
    mask = src.eq(PAD)
    x = (enc.embed_scale * enc.embed_tokens(src)).transpose(0, 1) + pe
    x = x * (~mask).t().unsqueeze(-1)
    for n, layer in enumerate(enc.layers):
        x = base_layer(layer)(x + pe if n else x, encoder_padding_mask=mask)
    pe = sinusoid(prev, dec.embed_dim).transpose(0, 1)
    y = (dec.embed_scale * dec.embed_tokens(prev)).transpose(0, 1) + pe
    future = torch.triu(torch.full((prev.size(1), prev.size(1)), float("-inf"), dtype=y.dtype), 1)
    for n, layer in enumerate(dec.layers):
        y = base_layer(layer)(y + pe if n else y, x, mask, self_attn_mask=future,
                              self_attn_padding_mask=prev.eq(PAD))[0]
    return dec.output_layer(y.transpose(0, 1))


def test_sinusoidal_variant_equals_computation_by_hand():
    model = build()
    src, lengths, prev = batch()
    torch.testing.assert_close(model(src, lengths, prev)[0], by_hand(model, src, prev), rtol=0, atol=1e-5)


def test_differs_from_the_input_only_transformer():
    model = build()
    plain = build("transformer_tiny")
    # the same weights; each model keeps its own record of its scheme (fairseq's transformer has none)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k != "position_record"})
    src, lengths, prev = batch()
    assert (model(src, lengths, prev)[0] - plain(src, lengths, prev)[0]).abs().max() > 1e-3
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in plain.parameters())


@pytest.mark.parametrize("learned", [False, True])
def test_incremental_decoding_equals_full_forward(learned):
    model = build(learned_pos=learned)
    src, lengths, prev = batch()
    prev[1, -2:] = 5
    enc = model.encoder(src, lengths)
    full = model.decoder(prev, enc)[0]
    state = {}
    steps = [model.decoder(prev[:, : t + 1], enc, incremental_state=state)[0] for t in range(prev.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-6)


def test_beam_search_scores_equal_teacher_forced_scores():
    model = build(learned_pos=True)
    src, lengths, _ = batch(bsz=2)
    gen = SequenceGenerator([model], TASK.target_dictionary, beam_size=4, max_len_b=10, normalize_scores=False)
    for i, sentence in enumerate(gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})):
        for hypo in sentence:
            tokens = hypo["tokens"]
            prev = torch.cat([tokens.new_tensor([EOS]), tokens[:-1]]).unsqueeze(0)
            lprobs = model.get_normalized_probs((model(src[i: i + 1], lengths[i: i + 1], prev)[0], None),
                                                log_probs=True)[0]
            expected = lprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
            torch.testing.assert_close(hypo["positional_scores"], expected, rtol=0, atol=1e-4)


def test_learned_variant_uses_one_table_per_side_in_every_block():
    model = build(learned_pos=True, max_source_positions=8, max_target_positions=8)
    assert model.encoder.embed_positions.weight.shape == (8 + PAD + 1, 64)
    src, lengths, prev = batch()
    out = model(src, lengths, prev)[0]
    with torch.no_grad():
        model.encoder.embed_positions.weight[PAD + 2].add_(1.0)  # position 1's row
    assert (model(src, lengths, prev)[0] - out).abs().max() > 1e-3


def test_learned_variant_rejects_sentences_longer_than_its_table():
    model = build(learned_pos=True, max_source_positions=8, max_target_positions=8)
    long_src = torch.randint(4, VOCAB, (2, 9))
    with pytest.raises(ValueError, match=r"source sentence of 9 tokens is longer than the learned position "
                                         r"table \(--max-source-positions 8\)"):
        model(long_src, long_src.ne(PAD).sum(1), torch.full((2, 3), EOS))
    padded = torch.full((2, 10), PAD)
    padded[:, 2:] = 5  # wider than the table, but only padding: every sentence fits
    model(padded, padded.ne(PAD).sum(1), torch.full((2, 3), EOS))
    src, lengths, _ = batch()
    with pytest.raises(ValueError, match=r"target sentence of 9 tokens .* \(--max-target-positions 8\)"):
        model(src, lengths, torch.full((3, 9), 5))
    enc, state = model.encoder(src, lengths), {}
    for t in range(8):
        model.decoder(torch.full((3, t + 1), 5), enc, incremental_state=state)
    with pytest.raises(ValueError, match="--max-target-positions 8"):  # step 9 of incremental decoding
        model.decoder(torch.full((3, 9), 5), enc, incremental_state=state)


def test_archs_are_position_transformers_with_fairseq_dims_and_flag_in_help(capsys):
    """The five architecture names of the model this scheme once had are position_transformer's, with fairseq's
    dims at each size; the model ``transformer_every_layer_pos`` is position_transformer with --help listing this
    scheme's flags (fairseq_plugins/models/position_transformer.py, its class TransformerEveryLayerPosModel)."""
    assert MODEL_REGISTRY["transformer_every_layer_pos"].__bases__ == (PositionTransformerModel,)
    for suffix in SIZES.values():
        ours, theirs = argparse.Namespace(), argparse.Namespace()
        ARCH_CONFIG_REGISTRY["transformer_every_layer_pos" + suffix](ours)
        ARCH_CONFIG_REGISTRY["transformer" + suffix](theirs)
        assert vars(ours).items() >= vars(theirs).items(), suffix
        assert (ours.position_scheme, ours.learned_pos) == ("every_layer", False)
        assert issubclass(ARCH_MODEL_REGISTRY["transformer_every_layer_pos" + suffix], PositionTransformerModel)
    argv = ["data-bin", "--user-dir", "fairseq_plugins", "--arch", "transformer_every_layer_pos_tiny"]
    assert options.parse_args_and_arch(options.get_training_parser(), input_args=argv + ["--learned-pos"]).learned_pos
    with pytest.raises(SystemExit):
        options.parse_args_and_arch(options.get_training_parser(), input_args=argv + ["--help"])
    assert "--learned-pos every-layer positions: learned fixed-length" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("learned", [False, True])
def test_built_by_position_transformer_as_any_scheme(learned):
    """--arch transformer_every_layer_pos_tiny is position_transformer --position-scheme every_layer at the tiny
    dims: the same stacks, parameters and outputs from the same seed; the record names the scheme."""
    from fairseq_plugins.models._base import decode_record

    model = build(learned_pos=learned)
    assert isinstance(model, PositionTransformerModel)
    assert (type(model.encoder), type(model.decoder)) == (PositionEncoder, PositionDecoder)
    assert model.encoder.every_block and model.decoder.every_block
    assert decode_record(model.position_record) == "transformer_every_layer_pos_tiny every_layer every_layer"
    args = argparse.Namespace(arch="position_transformer", dropout=0.0, position_scheme="every_layer",
                              learned_pos=learned)
    ARCH_CONFIG_REGISTRY["transformer_tiny"](args)  # the tiny dims, then the family's defaults
    ARCH_CONFIG_REGISTRY["position_transformer"](args)
    torch.manual_seed(0)
    same = PositionTransformerModel.build_model(args, TASK).double().eval()
    assert model.state_dict().keys() == same.state_dict().keys()
    mine, theirs = dict(model.named_parameters()), dict(same.named_parameters())
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    src, lengths, prev = batch()
    assert torch.equal(model(src, lengths, prev)[0], same(src, lengths, prev)[0])


def test_one_stack_every_layer_the_other_another_scheme():
    """A row of the family: the encoder's positions in every block, the decoder's RoPE; only the encoder's blocks
    take the signal."""
    model = tiny_models.build("position_transformer", encoder_position_scheme="every_layer",
                              decoder_position_scheme="rope", encoder_layers=2, decoder_layers=2).double().eval()
    assert model.encoder.every_block and not model.decoder.every_block
    assert model.decoder.embed_positions is None and model.decoder.position_scheme is not None
    src, lengths, prev = batch()
    out = model(src, lengths, prev)[0]
    assert bool(torch.isfinite(out).all())


def test_learned_pos_flags_as_transformer_every_layer_pos_took_them():
    """--learned-pos gives both stacks the learned table; fairseq's per-stack --encoder-learned-pos is superseded by
    it (fairseq's config reads --learned-pos for both stacks), accepted as the old model accepted it, so that its
    checkpoints load; --learned-pos on another scheme's model would do nothing: one line."""
    from fairseq.modules import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding

    for kw, table in (({"encoder_learned_pos": True}, SinusoidalPositionalEmbedding),
                      ({"learned_pos": True, "encoder_learned_pos": True, "decoder_learned_pos": True},
                       LearnedPositionalEmbedding)):  # the second: what the old model stored with --learned-pos
        model = build(**kw)
        assert type(model.encoder.embed_positions) is type(model.decoder.embed_positions) is table, kw
    with pytest.raises(FlagError, match=r"^--learned-pos is an every_layer flag, and this model's position schemes "
                                        r"are rope \(encoder\) and rope \(decoder\): it would do nothing$"):
        tiny_models.build("rope_transformer_tiny", learned_pos=True)
    with pytest.raises(FlagError, match=r"^--learned-pos expected True or False, got 'yes'$"):  # --model-overrides
        build(learned_pos="yes")
