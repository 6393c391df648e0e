"""The position prior in cross-attention (fairseq_plugins/modules/cross_prior.py, ``--cross-position-prior
alibi_sync``): its bias and the attention against the equation written loop by loop in float64 (left padding,
decoding steps past the source's end, learned slopes' gradients); with several self-attention schemes, incremental
decoding with beam reordering == the full forward and a sentence alone == it left-padded in a batch; its flags
(owned, in --help, bad values and flags that would do nothing refused in one line); its record; fairseq-train
with it. The contract tests (tests/test_position_schemes.py) run on its architecture too."""
import math

import pytest
import torch
from fairseq import options
from fairseq.modules import MultiheadAttention

from conftest import REPO
from helpers import tiny_models
from helpers.small_task import load, run_split, small_data, train_cmd
from helpers.tiny_models import fixed_batch, one_thread  # noqa: F401  (one_thread: an autouse fixture)
from fairseq_plugins.flags import FlagError
from fairseq_plugins.models._base import SchemeMismatch, decode_record
from fairseq_plugins.models.position_transformer import PositionTransformerModel
from fairseq_plugins.modules.alibi import alibi_slopes
from fairseq_plugins.modules.cross_prior import AlibiSync
from fairseq_plugins.modules.positional_attention import PositionalCrossAttention

ARCH = "alibi_sync_transformer_tiny"


def prior_naive(slopes, ratio, padding, q_pos):
    """b_h(i, j) = −m_h·|j − min(i/ρ, S − 1)|, j the key's rank among its sentence's real tokens and S their number,
    one entry at a time in float64 (a slope may be a tensor: its gradient flows); nan at pads (masked)."""
    B, width = padding.shape
    out = [[[[math.nan] * width for _ in q_pos] for _ in slopes] for _ in range(B)]
    for b in range(B):
        S = int((~padding[b]).sum())
        j = 0
        for col in range(width):
            if padding[b, col]:
                continue
            for h, m in enumerate(slopes):
                for a, i in enumerate(q_pos):
                    out[b][h][a][col] = -m * abs(j - min(i / ratio, S - 1))
            j += 1
    return out


def left_padding():
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[1, :3] = True  # S = 4
    padding[2, :6] = True  # S = 1: the EOS alone
    return padding


@pytest.mark.parametrize("ratio", [1.0, 1.7, 0.6])
@pytest.mark.parametrize("q_pos", [list(range(9)), [13]])  # a full forward; one step of incremental decoding
def test_bias_is_the_equation(ratio, q_pos):
    """From fairseq's left-padded key mask, as the attention computes it: every real key's bias, beyond the source's
    expected end (i/ρ > S − 1: clipped to the last token) included."""
    H = 4
    attn = PositionalCrossAttention(8, H, AlibiSync(H, ratio), kdim=8, vdim=8)
    padding = left_padding()
    got = attn._bias(torch.tensor(q_pos), padding, padding.size(1), torch.float64)
    assert got.dtype == torch.float64 and got.shape == (3, H, len(q_pos), 7)
    want = torch.tensor(prior_naive(alibi_slopes(H), ratio, padding, q_pos), dtype=torch.float64)
    real = ~padding[:, None, None, :].expand_as(want)
    torch.testing.assert_close(got[real], want[real], rtol=1e-13, atol=1e-13)
    # no padding mask (fairseq passes none where no sentence is padded): every key real, S the width
    unpadded = attn._bias(torch.tensor(q_pos), None, 7, torch.float64)
    want = torch.tensor(prior_naive(alibi_slopes(H), ratio, torch.zeros(1, 7, dtype=torch.bool), q_pos),
                        dtype=torch.float64)
    torch.testing.assert_close(unpadded, want, rtol=1e-13, atol=1e-13)
    # a half-precision module: fixed slopes stay exact, the bias comes in the dtype asked for
    assert attn.scheme.half().cross_bias(torch.tensor([9]), torch.tensor([[0]]), torch.tensor([1]),
                                         torch.float32)[0, :, 0, 0].tolist() == [0.0] * H


def naive_cross_attention(attn, x, enc, padding, bias_fn):
    """out_i = Σ_j softmax_j(q_i·k_j/sqrt(d) + bias(b, h, i, j)) v_j over the real keys, loop by loop."""
    T, B, C = x.shape
    H, d = attn.num_heads, attn.head_dim
    q, k, v = attn.q_proj(x), attn.k_proj(enc), attn.v_proj(enc)
    rows = {}
    for b in range(B):
        for h in range(H):
            sl = slice(h * d, (h + 1) * d)
            for i in range(T):
                real = [j for j in range(enc.size(0)) if not padding[b, j]]
                logits = torch.stack([(q[i, b, sl] * k[j, b, sl]).sum() / math.sqrt(d) + bias_fn(b, h, i, j)
                                      for j in real])
                p = torch.softmax(logits, 0)
                rows[b, h, i] = (p[:, None] * v[real, b, sl]).sum(0)
    out = torch.stack([torch.stack([torch.cat([rows[b, h, i] for h in range(H)]) for b in range(B)])
                       for i in range(T)])
    return attn.out_proj(out)


@pytest.mark.parametrize("learned", [False, True])
def test_attention_equals_the_equation(learned):
    """Outputs and gradients (the slopes' too, when learned) of the fused path against the naive attention; the
    explicit path (attention weights asked for) gives the same output."""
    torch.manual_seed(0)
    T, B, C, H, ratio = 9, 3, 8, 2, 1.5
    prior = AlibiSync(H, ratio, learned=learned).double()
    attn = PositionalCrossAttention(C, H, prior, kdim=6, vdim=6).double()
    if learned:
        with torch.no_grad():
            prior.learned_slopes.mul_(torch.tensor([3.0, -20.0], dtype=torch.float64))  # one head turned round
    x = torch.randn(T, B, C, dtype=torch.float64, requires_grad=True)
    enc = torch.randn(7, B, 6, dtype=torch.float64, requires_grad=True)
    padding = left_padding()
    out, _ = attn(x, enc, enc, key_padding_mask=padding, static_kv=True, need_weights=False)
    slopes = prior.learned_slopes if learned else alibi_slopes(H)
    bias = prior_naive(slopes, ratio, padding, range(T))
    want = naive_cross_attention(attn, x, enc, padding, lambda b, h, i, j: bias[b][h][i][j])
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    params = [x, enc] + list(attn.parameters()) + list(prior.parameters())
    assert len(params) == 10 + learned
    for a, b in zip(torch.autograd.grad(out.pow(2).sum(), params), torch.autograd.grad(want.pow(2).sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    again, weights = attn(x, enc, enc, key_padding_mask=padding, static_kv=True, need_weights=True)
    torch.testing.assert_close(again, out, rtol=1e-10, atol=1e-12)
    assert weights.shape == (B, T, 7) and float(weights[2, :, :6].detach().abs().max()) == 0  # pads get nothing


def test_before_softmax_gives_the_logits_of_the_weights():
    """fairseq's before_softmax from the cross-attention: (B·H, T, S) logits with the prior and the padding, whose
    softmax is the attention's head weights, and v (B·H, S, d)."""
    torch.manual_seed(0)
    T, B, C, H = 9, 3, 8, 2
    attn = PositionalCrossAttention(C, H, AlibiSync(H, 1.5), kdim=6, vdim=6).double()
    x, enc = torch.randn(T, B, C, dtype=torch.float64), torch.randn(7, B, 6, dtype=torch.float64)
    padding = left_padding()
    logits, v = attn(x, enc, enc, key_padding_mask=padding, static_kv=True, before_softmax=True)
    _, weights = attn(x, enc, enc, key_padding_mask=padding, static_kv=True, need_head_weights=True)  # (H, B, T, S)
    assert logits.shape == (B * H, T, 7) and v.shape == (B * H, 7, C // H)
    assert bool(torch.isinf(logits.view(B, H, T, 7)[2, :, :, :6]).all())  # its pads
    torch.testing.assert_close(logits.softmax(-1).view(B, H, T, 7).transpose(0, 1), weights, rtol=0, atol=1e-12)


def build(arch=ARCH, **kw):
    return tiny_models.build(arch, **kw).double().eval()


# the prior with fairseq's own self-attention, a rotation, a score bias; learned slopes far from their start
COMBINATIONS = {
    "sinusoidal": (ARCH, {}),
    "rope_learned": ("rope_transformer_tiny", {"cross_position_prior": "alibi_sync", "cross_prior_slopes": "learned",
                                               "cross_prior_ratio": 1.3}),
    "alibi": (ARCH, {"position_scheme": "alibi", "cross_prior_ratio": 0.7}),
}


def strong(model):
    """Slopes large enough that the prior decides most of the attention (ALiBi's tiny 2-head slopes are 1/16 and
    1/256)."""
    prior = model.decoder.cross_position_prior
    if prior.learned_slopes is not None:
        with torch.no_grad():
            prior.learned_slopes.copy_(torch.tensor([2.0, -0.5]))
    return model


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_incremental_decoding_with_reorder_equals_full_forward(name):
    arch, kw = COMBINATIONS[name]
    model = strong(build(arch, **kw))
    assert all(isinstance(layer.encoder_attn, PositionalCrossAttention)
               and layer.encoder_attn.scheme is model.decoder.cross_position_prior for layer in model.decoder.layers)
    # fairseq's own self-attention (sinusoidal) takes its softmax in float32 on the incremental path
    tiny_models.assert_incremental_with_reorder_equals_full(model, atol=1e-6 if name == "sinusoidal" else 1e-10)


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_a_sentence_alone_equals_it_left_padded_in_a_batch(name):
    arch, kw = COMBINATIONS[name]
    model = strong(build(arch, **kw))
    tiny_models.assert_alone_equals_left_padded(model)


def test_the_prior_is_fairseqs_cross_attention_plus_its_bias():
    """fairseq's Transformer's parameters (same names) in the prior's model: the encoder gives the same states, the
    decoder other outputs; with the slopes at 0 the prior's cross-attention is fairseq's own."""
    plain, prior = build("transformer_tiny"), build(cross_prior_slopes="learned")
    assert type(plain.decoder.layers[0].encoder_attn) is MultiheadAttention
    state = plain.state_dict()
    extra = {"position_record", "decoder.cross_position_prior.learned_slopes"}
    assert set(prior.state_dict()) - extra == set(state)
    prior.load_state_dict({**state, **{k: v for k, v in prior.state_dict().items() if k in extra}}, strict=True)
    src, lengths, prev = fixed_batch()
    torch.testing.assert_close(prior.encoder(src, lengths)["encoder_out"][0],
                               plain.encoder(src, lengths)["encoder_out"][0], rtol=0, atol=0)
    assert (prior(src, lengths, prev)[0] - plain(src, lengths, prev)[0]).abs().max() > 1e-4
    with torch.no_grad():
        prior.decoder.cross_position_prior.learned_slopes.zero_()
    # fairseq's cross-attention takes its softmax in float32 where it returns the weights (a decoder in eval mode)
    torch.testing.assert_close(prior(src, lengths, prev)[0], plain(src, lengths, prev)[0], rtol=0, atol=1e-6)


def test_learned_slopes_train_and_fixed_ones_are_no_parameter():
    model = tiny_models.build(ARCH, cross_prior_slopes="learned").double().train()
    names = [n for n, _ in model.named_parameters() if "cross_position_prior" in n]
    assert names == ["decoder.cross_position_prior.learned_slopes"]
    slopes = model.decoder.cross_position_prior.learned_slopes
    assert slopes.tolist() == alibi_slopes(2)
    src, lengths, prev = fixed_batch()
    model(src, lengths, prev)[0].pow(2).mean().backward()
    assert slopes.grad is not None and bool((slopes.grad != 0).all())
    assert not [n for n, _ in build().named_parameters() if "prior" in n]


# -- flags ---------------------------------------------------------------------------------------------------------

def parse(*argv):
    return options.parse_args_and_arch(options.get_training_parser(), [
        "data-bin", "--user-dir", str(REPO / "fairseq_plugins"), *argv])


def test_the_flags_are_in_help(capsys):
    with pytest.raises(SystemExit):
        parse("--arch", ARCH, "--help")
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--cross-position-prior PRIOR", "--cross-prior-ratio R", "--cross-prior-slopes KIND"):
        assert flag in out, flag


@pytest.mark.parametrize("flags,message", [
    (("--cross-position-prior", "wavy"), "argument --cross-position-prior: invalid choice: 'wavy' (choose from "
                                         "none, alibi_sync)"),
    (("--cross-prior-ratio", "0"), "argument --cross-prior-ratio: must be > 0, got 0"),
    (("--cross-prior-ratio", "x"), "argument --cross-prior-ratio: expected a number, got 'x'"),
    (("--cross-prior-slopes", "free"), "argument --cross-prior-slopes: invalid choice: 'free' (choose from fixed, "
                                       "learned)"),
])
def test_a_bad_flag_is_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse("--arch", ARCH, *flags)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("argv,message", [
    (("--arch", "rope_transformer_tiny", "--cross-prior-ratio", "1.5"),
     "--cross-prior-ratio is an alibi_sync flag, and this model's cross-attention prior is none: it would do nothing"),
    (("--arch", ARCH, "--no-cross-attention"),
     "--cross-position-prior alibi_sync needs cross-attention, and --no-cross-attention removes it"),
    (("--arch", ARCH, "--cross-position-prior", "none"),
     "--cross-position-prior none contradicts --arch alibi_sync_transformer*: use position_transformer "
     "--cross-position-prior none"),
])
def test_a_flag_that_would_do_nothing_is_refused_in_one_line(argv, message):
    with pytest.raises(FlagError) as err:
        PositionTransformerModel.prepare_args(parse(*argv))
    assert str(err.value) == message


def test_values_set_unparsed_are_checked():
    """--model-overrides sets a checkpoint's arguments without the parser: each flag's own parse function checks the
    value (Flag.check) and says it in one line."""
    args = parse("--arch", ARCH)
    PositionTransformerModel.prepare_args(args)
    for name, value, message in (("cross_prior_ratio", -1.0, "--cross-prior-ratio must be > 0, got -1.0"),
                                 ("cross_prior_ratio", "2", "--cross-prior-ratio must be a float, got '2'"),
                                 ("cross_prior_slopes", "free", "--cross-prior-slopes invalid choice: 'free' (choose "
                                                                "from fixed, learned)"),
                                 ("cross_position_prior", "wavy", "--cross-position-prior must be one of none, "
                                                                  "alibi_sync (got 'wavy')")):
        bad = parse("--arch", ARCH)
        PositionTransformerModel.prepare_args(bad)
        setattr(bad, name, value)
        with pytest.raises(FlagError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
            PositionTransformerModel.prepare_args(bad)


def test_the_record_tells_a_fixed_prior_from_none():
    """A fixed prior has no parameter: only the record stops its checkpoint loading into a decoder without it."""
    prior = build()
    assert decode_record(prior.position_record) == "alibi_sync_transformer_tiny sinusoidal sinusoidal+alibi_sync"
    rope = tiny_models.build("rope_transformer_tiny", cross_position_prior="alibi_sync")
    assert rope.position_schemes() == ("rope", "rope+alibi_sync")
    # transformer_tiny is fairseq's own model: the plugins' sinusoidal model of the same dims is position_transformer's
    sinusoidal = tiny_models.build("position_transformer", encoder_layers=2, decoder_layers=2, encoder_embed_dim=64,
                                   decoder_embed_dim=64, encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64,
                                   encoder_attention_heads=2, decoder_attention_heads=2)
    with pytest.raises(SchemeMismatch, match="position schemes: encoder sinusoidal, decoder sinusoidal\\+alibi_sync"):
        sinusoidal.load_state_dict(prior.state_dict())
    assert set(prior.state_dict()) == set(sinusoidal.state_dict())


# -- fairseq-train ---------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_fairseq_train_with_the_prior(tmp_path_factory, tmp_path):
    """A few updates of fairseq-train on the small toy corpus, RoPE self-attention with the prior's learned slopes:
    the checkpoint records both and its slopes moved from ALiBi's."""
    data = small_data(tmp_path_factory)
    save = tmp_path / "save"
    proc = run_split(train_cmd(data, save, ARCH, "--position-scheme", "rope", "--cross-prior-slopes", "learned",
                               "--cross-prior-ratio", "1.1", max_update=4))
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = load(save / "checkpoint_last.pt")
    assert decode_record(state["model"]["position_record"]) == "alibi_sync_transformer_tiny rope rope+alibi_sync"
    slopes = state["model"]["decoder.cross_position_prior.learned_slopes"]
    assert slopes.shape == (2,) and not torch.allclose(slopes, torch.tensor(alibi_slopes(2)))
    assert state["args"] is None or state["args"].cross_prior_ratio == 1.1
