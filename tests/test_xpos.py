"""xPos (fairseq_plugins/modules/xpos.py), in float64: the query's and the key's transforms against Sun et al.'s
equation written pair by pair; q̃_n·k̃_m a function of n − m alone, equal to the paper's sum over pairs and to
the logits of torchscale's centred positions (the authors' code, written out here); incremental decoding with beam
reordering equals the full forward and a sentence alone equals it left-padded (handed its own positions, not the
padded indices), with a scale base small enough that the scale matters; positions a precision cannot hold refused
in one line; the figures' curves from its own transforms, and their titles; --xpos-scale-base reaching both
stacks."""
import math

import pytest
import torch

from helpers import tiny_models
from helpers.scheme_references import xpos_naive
from helpers.tiny_models import one_thread  # noqa: F401  (autouse fixture)
from tooling import position_arrays as pa, position_figures as pf
from fairseq_plugins.modules.positional_attention import PositionalSelfAttention
from fairseq_plugins.modules.xpos import XPos

D, GAMMA = 8, 4.0  # γ = 4: over a few positions ζ_0^(±n/γ) spans orders of magnitude, so each factor shows


def zeta(i, d=D):
    return (i / (d / 2) + 0.4) / 1.4


def logit_naive(q, k, n, m, d=D, gamma=GAMMA, base=10000.0):
    """Σ_i [(q_2i k_2i + q_2i+1 k_2i+1) cos((m−n)θ_i) + (q_2i+1 k_2i − q_2i k_2i+1) sin((m−n)θ_i)]
    · ζ_i^((n−m)/γ)."""
    total = 0.0
    for i in range(d // 2):
        phi = (m - n) * base ** (-2 * i / d)
        a, b, c, e = float(q[2 * i]), float(q[2 * i + 1]), float(k[2 * i]), float(k[2 * i + 1])
        total += ((a * c + b * e) * math.cos(phi) + (b * c - a * e) * math.sin(phi)) * zeta(i, d) ** ((n - m) / gamma)
    return total


def test_query_and_key_are_the_papers_equation_pair_by_pair():
    """q̃_n = R_n (q ⊙ ζ^(n/γ)), k̃_m = R_m (k ⊙ ζ^(−m/γ)), at (T,) positions and at each sentence's (B, T)."""
    torch.manual_seed(0)
    xpos = XPos(D, scale_base=GAMMA)
    x = torch.randn(2, 3, 5, D, dtype=torch.float64)  # (B, H, T, d)
    for pos in (torch.arange(5), torch.tensor([[0, 0, 0, 1, 2], [3, 4, 5, 6, 7]])):
        q, k = xpos.rotate(x, x, pos)
        assert torch.equal(xpos.rotated(x, pos), k)  # a single vector's transform: the key's
        for b in range(2):
            for h in range(3):
                for t in range(5):
                    m = int(pos[t] if pos.dim() == 1 else pos[b, t])
                    for got, query in ((q, True), (k, False)):
                        want = xpos_naive(x[b, h, t], m, query, GAMMA)
                        torch.testing.assert_close(got[b, h, t], want, rtol=1e-13, atol=0)


def test_the_logit_depends_on_n_minus_m_only_and_is_the_papers_sum():
    """q̃_n·k̃_m at offsets either side of 0 (a key after its query: an encoder's), from several origins."""
    torch.manual_seed(1)
    xpos = XPos(D, scale_base=GAMMA)
    q, k = torch.randn(D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)

    def logit(n, m):
        qn, _ = xpos.rotate(q.view(1, 1, 1, D), q.view(1, 1, 1, D), torch.tensor([n]))
        _, km = xpos.rotate(k.view(1, 1, 1, D), k.view(1, 1, 1, D), torch.tensor([m]))
        return float((qn * km).sum())

    by_offset = {}
    for offset in (-5, -1, 0, 2, 7):
        values = [logit(n, n - offset) for n in (7, 9, 12, 20)]
        for value in values:
            assert value == pytest.approx(values[0], rel=1e-12)
            assert value == pytest.approx(logit_naive(q, k, 7, 7 - offset), rel=1e-12)
        by_offset[offset] = values[0]
    assert len({round(v, 9) for v in by_offset.values()}) == len(by_offset)  # the offset matters
    # the scale matters: without it (RoPE) the logit at offset 7 differs
    rope = sum(((q[2 * i] * k[2 * i] + q[2 * i + 1] * k[2 * i + 1]) * math.cos(-7 * 10000 ** (-2 * i / D))
                + (q[2 * i + 1] * k[2 * i] - q[2 * i] * k[2 * i + 1]) * math.sin(-7 * 10000 ** (-2 * i / D)))
               for i in range(D // 2))
    assert abs(by_offset[7] - float(rope)) > 0.1 * abs(float(rope))


def torchscale_logits(q, k, gamma):
    """torchscale's XPOS (the authors' code) on (T, d) q and k, re-written: the rotation at positions 0..T−1, the
    scale ζ^(p/γ) at positions p centred on the middle of the sequence, q times it, k divided by it."""
    T, d = q.shape
    half = d // 2
    theta = 1.0 / 10000 ** (torch.arange(half, dtype=torch.float64) / half)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta
    low = -(T // 2)  # torchscale's min_pos = −(length + offset) // 2
    scale_zeta = (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)
    scale = scale_zeta ** (torch.arange(low, low + T, dtype=torch.float64)[:, None] / gamma)

    def apply(x, s):
        sin, cos = (torch.repeat_interleave(s * f, 2, dim=-1) for f in (angle.sin(), angle.cos()))
        every_two = torch.stack((-x[:, 1::2], x[:, ::2]), dim=-1).flatten(-2)
        return x * cos + every_two * sin

    return apply(q, scale) @ apply(k, 1 / scale).t()


def test_the_logits_are_torchscales():
    """The same q̃·k̃ as the authors' code, whose centred positions change the factors but not their product."""
    torch.manual_seed(2)
    T = 9
    q, k = torch.randn(T, D, dtype=torch.float64), torch.randn(T, D, dtype=torch.float64)
    xpos = XPos(D, scale_base=GAMMA)
    qr, kr = xpos.rotate(q[None, None], k[None, None], torch.arange(T))
    torch.testing.assert_close(qr[0, 0] @ kr[0, 0].t(), torchscale_logits(q, k, GAMMA), rtol=1e-12, atol=1e-12)


def xpos_model(gamma=GAMMA, dtype=torch.float64):
    return tiny_models.build("xpos_transformer_tiny", xpos_scale_base=gamma).eval().to(dtype)


def test_the_flag_reaches_both_stacks():
    model = xpos_model(gamma=64.0)
    for stack in (model.encoder, model.decoder):
        assert isinstance(stack.position_scheme, XPos) and stack.position_scheme.scale_base == 64.0
    assert tiny_models.build("xpos_transformer_tiny").encoder.position_scheme.scale_base == 512.0


def test_incremental_decoding_with_reorder_equals_the_full_forward():
    """Keys are cached scaled by their own position: each step's query meets them as the full forward does."""
    tiny_models.assert_incremental_with_reorder_equals_full(xpos_model(), atol=1e-10)


def test_a_sentence_alone_equals_it_left_padded():
    tiny_models.assert_alone_equals_left_padded(xpos_model())


def test_the_figures_draw_xpos_own_logit_and_scale():
    """The logit curve (a query at 0, the key at j − i) is the vocabulary mean of q̃_i·k̃_j at i = 3 and j = 3 + s;
    the rotation alone is the mean over pairs of ζ_p^(−s/γ)·cos(s·θ_p), and its panel says so. A float32 model,
    as the figures load a checkpoint, against the float64 reference."""
    model = xpos_model(dtype=torch.float32)
    entry, = [e for e in pa.attention_schemes(model) if e["part"] == "encoder"]
    assert entry["kind"] == "xpos"
    x, values = pa.rope_logits_by_distance(model, entry, 12, chunk=7)
    stack = model.encoder
    attn, xpos = stack.layers[0].self_attn, entry["module"]
    heads, dz = attn.num_heads, attn.head_dim
    with torch.no_grad():
        words = stack.embed_tokens.weight.double() * stack.embed_scale
        q = torch.nn.functional.linear(words, attn.q_proj.weight.double(), attn.q_proj.bias.double())
        k = torch.nn.functional.linear(words, attn.k_proj.weight.double(), attn.k_proj.bias.double())
        for s in (-11, -2, 0, 5, 11):
            for h in range(heads):
                qh, kh = q[:, h * dz:(h + 1) * dz], k[:, h * dz:(h + 1) * dz]
                naive = sum(float((xpos_naive(a, 3, True, GAMMA) * xpos_naive(b, 3 + s, False, GAMMA)).sum())
                            for a, b in zip(qh, kh)) / len(qh) / math.sqrt(dz)
                assert float(values[h, x.index(s)]) == pytest.approx(naive, rel=1e-4, abs=1e-5), (h, s)
    shift, alone = pa.rope_rotation_only(entry, 12)
    for s, value in zip(shift, alone.tolist()):
        want = sum(zeta(p, dz) ** (-s / GAMMA) * math.cos(s * 10000 ** (-2 * p / dz)) for p in range(dz // 2))
        assert value == pytest.approx(want / (dz // 2), rel=1e-12), s
    assert xpos.alone.startswith("mean_p ζ_p^(−(j − i)/γ)·cos((j − i)·θ_p)") and "γ = 4" in xpos.alone


def test_the_figure_names_xpos_curves(tmp_path, monkeypatch):
    """Its attention figure: titled with its class's title, no query position (its logit is a function of j − i
    alone, though it reads positions per sentence), the logit axis its equation's, the rotation panel its own."""
    figures = []
    monkeypatch.setattr(pf, "save_figure", lambda fig, path, dpi=100: figures.append(fig) or path)
    with torch.no_grad():
        pf.figures(xpos_model(dtype=torch.float32), "xpos.seed1", 12, None, str(tmp_path))
    fig, = figures
    assert fig._suptitle.get_text().endswith("xPos (Sun et al.), first layer's logit for one word at two positions, "
                                             "vocabulary mean")
    encoder, decoder, rotation = fig.axes
    assert encoder.get_ylabel() == decoder.get_ylabel() == "logit q_i·R_(j−i) k_j·ζ^((i−j)/γ) / √d_z"
    assert rotation.get_title().endswith("mean_p ζ_p^(−(j − i)/γ)·cos((j − i)·θ_p), base 10000, γ = 4")
    assert rotation.get_ylabel() == "logit / |q|²"


def test_left_padding_leaves_a_sentences_numbers_alone(monkeypatch):
    """Positions from each sentence's first real token: a 3-token sentence left-padded beside a 557-token batch-mate
    (the longest float32 holds at γ = 8) gets its numbers alone, xPos being handed its own positions 0, 1, 2, not the
    padded indices 554..556; a 600-token batch-mate, whose own factors would leave float32 (3.5^75 ≈ 1e40), is
    refused in one line."""
    from fairseq_plugins.modules.position_scheme import RangeError

    torch.manual_seed(3)
    C, H = 8, 2
    xpos = XPos(C // H, scale_base=8.0)
    attn = PositionalSelfAttention(C, H, xpos).eval()
    seen = []
    rotate = xpos.rotate
    monkeypatch.setattr(xpos, "rotate", lambda q, k, pos: seen.append(pos) or rotate(q, k, pos))
    for T in (557, 600):
        x = torch.randn(T, 2, C)
        padding = torch.zeros(2, T, dtype=torch.bool)
        padding[0, :-3] = True
        with torch.no_grad():
            if T == 600:
                with pytest.raises(RangeError, match=r"^xPos: position 599 is beyond .* torch.float32 \(positions "
                                                     r"below 558 at --xpos-scale-base 8\)"):
                    attn(x, x, x, key_padding_mask=padding, need_weights=False)
                continue
            batched = attn(x, x, x, key_padding_mask=padding, need_weights=False)[0]
            assert seen[-1][0, -3:].tolist() == [0, 1, 2] and seen[-1][1, -3:].tolist() == [554, 555, 556]
            alone = attn(x[-3:, :1], x[-3:, :1], x[-3:, :1], need_weights=False)[0]
        torch.testing.assert_close(batched[-3:, :1], alone, rtol=1e-5, atol=1e-6)


def test_positions_float16_cannot_hold_are_refused_in_one_line():
    """In float16 the scale ζ_0^(±n/γ) leaves the normal numbers past n ≈ 7.7·γ and a key's factor is inf past
    8.9·γ (then the attention's output is NaN, silently): the decoder refuses the step in one line naming the flag,
    in the full forward and step by step, before any device work; within the range, outputs are finite, and bf16
    takes ~9 times longer inputs."""
    from fairseq_plugins.modules.position_scheme import RangeError

    gamma = 8.0  # float16's range: positions below 7.7·8 = 62
    model = xpos_model(gamma=gamma).half().eval()
    limit = int(gamma * math.log(1 / torch.finfo(torch.float16).tiny) / math.log(1.4 / 0.4)) + 1
    assert limit == 62
    src, lengths, _ = tiny_models.fixed_batch()
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        ok = torch.full((3, limit), 5)
        ok[:, 0] = tiny_models.EOS
        assert torch.isfinite(model.decoder(ok, encoder_out=encoder_out)[0]).all()
        long = torch.full((3, limit + 12), 5)
        long[:, 0] = tiny_models.EOS
        with pytest.raises(RangeError, match=r"^xPos: position 73 is beyond what its scale .* torch.float16 "
                                             r"\(positions below 62 at --xpos-scale-base 8\)"):
            model.decoder(long, encoder_out=encoder_out)
        state = {}
        with pytest.raises(RangeError, match="position 62 is beyond"):
            for t in range(limit + 1):
                model.decoder(long[:, :t + 1], encoder_out=encoder_out, incremental_state=state)
    bf16 = xpos_model(gamma=gamma).to(torch.bfloat16).eval()
    with torch.no_grad():
        out = bf16.decoder(long, encoder_out=bf16.encoder(src, src_lengths=lengths))[0]
    assert torch.isfinite(out).all()
