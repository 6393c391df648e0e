"""RoPE's inference-time scaling for inputs longer than training (fairseq_plugins/modules/rope.py): the rotation
of each kind (position interpolation, NTK-aware, YaRN with its temperature) against a float64 reference written
from its paper's equation; ``none`` bit for bit the rotation before the flags; logits still a function of n − m
alone; the flags set at decode time on a trained checkpoint through fairseq's --model-overrides; and the flags'
refusals (bad values, missing companions, a flag that would do nothing, a model without RoPE), each one line."""
import math
import subprocess

import pytest
import torch
from fairseq import checkpoint_utils, options

from conftest import BIN, REPO
from helpers import tiny_models
from helpers.small_task import run_split, small_data, tiny_checkpoint
from helpers.tiny_models import one_thread  # noqa: F401  (autouse fixture)
from fairseq_plugins.modules.rope import RoPE

D, BASE, S, L = 16, 10000.0, 4.0, 512  # L = 512: YaRN's r_i = L/λ_i spans > β (i = 0), the ramp and < α (i ≥ 4)


# -- float64 references, from the papers' equations -------------------------------------------------------------

def theta_naive(i, d=D, base=BASE):
    return base ** (-2 * i / d)


def yarn_gamma_naive(i, length=L, alpha=1.0, beta=32.0):
    r = length / (2 * math.pi / theta_naive(i))  # r = L/λ_i, λ_i = 2π/θ_i
    return 0.0 if r < alpha else 1.0 if r > beta else (r - alpha) / (beta - alpha)


def angle_naive(kind, m, i, s=S):
    """The angle of pair i at position m: f(x, g(m), h(θ)) of each method (YaRN paper §3 notation)."""
    if kind == "none":
        return m * theta_naive(i)
    if kind == "linear":  # Chen et al.: g(m) = m/s
        return (m / s) * theta_naive(i)
    if kind == "ntk":  # bloc97: b' = b·s^(d/(d−2))
        return m * theta_naive(i, base=BASE * s ** (D / (D - 2)))
    gamma = yarn_gamma_naive(i)  # Peng et al.: h(θ) = (1 − γ)·θ/s + γ·θ
    return m * ((1 - gamma) * theta_naive(i) / s + gamma * theta_naive(i))


def rotate_naive(kind, vec, m, s=S):
    scale = 0.1 * math.log(s) + 1 if kind == "yarn" else 1.0  # YaRN: √(1/t) = 0.1·ln s + 1 on q and k
    out = vec.clone()
    for i in range(D // 2):
        a, b, angle = vec[2 * i], vec[2 * i + 1], angle_naive(kind, m, i, s)
        out[2 * i] = scale * (a * math.cos(angle) - b * math.sin(angle))
        out[2 * i + 1] = scale * (a * math.sin(angle) + b * math.cos(angle))
    return out


def scaled(kind, s=S):
    return RoPE(D, BASE, scaling=kind, factor=s, original_length=L)


KINDS = ["linear", "ntk", "yarn"]


def test_yarn_case_spans_the_whole_ramp():
    gammas = [yarn_gamma_naive(i) for i in range(D // 2)]
    assert gammas[0] == 1.0 and gammas[-1] == 0.0 and any(0 < g < 1 for g in gammas), gammas


@pytest.mark.parametrize("kind", ["none", *KINDS])
def test_rotation_is_the_papers_equation(kind):
    torch.manual_seed(0)
    positions = [0, 1, 7, 100, 2047]
    x = torch.randn(2, 1, len(positions), D, dtype=torch.float64)
    got = scaled(kind).rotated(x, torch.tensor(positions))
    for b in range(2):
        for t, m in enumerate(positions):
            torch.testing.assert_close(got[b, 0, t], rotate_naive(kind, x[b, 0, t], m), rtol=1e-12, atol=1e-12)


def test_yarn_temperature_scales_the_logits_by_1_over_t():
    """At the same position q·k is unchanged by a rotation: YaRN's logit is q·k/t, (1/t) = (0.1·ln s + 1)²."""
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, D, dtype=torch.float64), torch.randn(1, 1, 1, D, dtype=torch.float64)
    rope, pos = scaled("yarn", s=8.0), torch.tensor([5])
    logit = (rope.rotated(q, pos) * rope.rotated(k, pos)).sum()
    torch.testing.assert_close(logit, (q * k).sum() * (0.1 * math.log(8.0) + 1) ** 2, rtol=1e-12, atol=0)
    assert scaled("yarn", s=1.0).temperature == scaled("yarn", s=0.5).temperature == 1.0  # s ≤ 1: none


def rotate_before_scaling(rope, x, pos):
    """RoPE.rotate as it was before the scaling flags (commit 94cfbc3), operation for operation."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    exponent = torch.arange(0, rope.head_dim, 2, dtype=torch.float64) / rope.head_dim
    theta = (rope.base ** -exponent).to(device=x.device, dtype=dtype)
    angle = pos.to(dtype)[:, None] * theta[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    pairs = x.unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_none_is_the_rotation_before_the_flags_bit_for_bit(dtype):
    torch.manual_seed(0)
    x, pos = torch.randn(2, 3, 50, 64).to(dtype), torch.arange(1000, 1050)
    want = rotate_before_scaling(RoPE(64), x, pos)
    for rope in (RoPE(64), RoPE(64, scaling="none"), RoPE(64, scaling="none", factor=1.0)):
        assert torch.equal(rope.rotated(x, pos), want)


def test_a_model_without_the_flags_is_the_model_with_none():
    src, lengths, prev = tiny_models.fixed_batch()
    outs = [tiny_models.build("rope_transformer_tiny", **kw).eval()(src, lengths, prev)[0]
            for kw in ({}, {"rope_scaling": "none"})]
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("kind", KINDS)
def test_logits_still_depend_on_the_offset_only(kind):
    torch.manual_seed(0)
    rope = scaled(kind)
    q, k = torch.randn(1, 1, 1, D, dtype=torch.float64), torch.randn(1, 1, 1, D, dtype=torch.float64)

    def logit(m, n):
        return (rope.rotated(q, torch.tensor([m])) * rope.rotated(k, torch.tensor([n]))).sum()

    for m, n in ((3, 7), (7, 3), (0, 600)):
        for shift in (1, 100, 1500):
            torch.testing.assert_close(logit(m + shift, n + shift), logit(m, n), rtol=1e-9, atol=1e-9)
    assert not torch.allclose(logit(3, 7), logit(3, 8))


# -- the flags ---------------------------------------------------------------------------------------------------

def test_flags_reach_both_stacks():
    model = tiny_models.build("rope_transformer_tiny", rope_scaling="yarn", rope_scaling_factor=2.0,
                              rope_original_length=64)
    for stack in (model.encoder, model.decoder):
        rope = stack.position_scheme
        assert (rope.scaling, rope.factor, rope.original_length) == ("yarn", 2.0, 64)


def test_the_flags_are_documented():
    proc = subprocess.run([str(BIN / "fairseq-train"), "--user-dir", "fairseq_plugins", "--arch",
                           "rope_transformer_tiny", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    text = " ".join(proc.stdout.split())
    for flag in ("--rope-scaling KIND", "--rope-scaling-factor S", "--rope-original-length L"):
        help_text = text.rsplit(flag, 1)[1].split(" --", 1)[0]  # the options section, after the usage
        assert "for decoding longer inputs than training" in help_text, (flag, help_text)


@pytest.mark.parametrize("flags,message", [
    (("--rope-scaling", "cubic"), "argument --rope-scaling: invalid choice: 'cubic' (choose from none, linear, ntk, "
                                  "yarn)"),
    (("--rope-scaling-factor", "0"), "argument --rope-scaling-factor: must be > 0, got 0"),
    (("--rope-scaling-factor", "-2"), "argument --rope-scaling-factor: must be > 0, got -2"),
    (("--rope-original-length", "x"), "argument --rope-original-length: expected a number, got 'x'"),
])
def test_a_bad_value_is_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        options.parse_args_and_arch(options.get_training_parser(),
                                    ["data-bin", "--user-dir", str(REPO / "fairseq_plugins"),
                                     "--arch", "rope_transformer_tiny", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("setting,message", [
    ({"rope_scaling": "cubic"}, r"--rope-scaling invalid choice: 'cubic' \(choose from none, linear, ntk, yarn\)"),
    ({"rope_scaling": "linear", "rope_scaling_factor": 0.0}, r"--rope-scaling-factor must be > 0, got 0.0"),
    ({"rope_scaling": "linear", "rope_scaling_factor": "4"},  # an override's string: no parser turned it into 4.0
     r"--rope-scaling-factor must be a float, got '4'"),
    ({"rope_scaling": "linear"}, r"--rope-scaling linear needs --rope-scaling-factor S"),
    ({"rope_scaling": "yarn", "rope_scaling_factor": 2.0}, r"--rope-scaling yarn needs --rope-original-length L"),
    ({"rope_scaling_factor": 2.0}, r"--rope-scaling-factor does nothing without --rope-scaling linear, ntk or yarn"),
    ({"rope_scaling": "ntk", "rope_scaling_factor": 2.0, "rope_original_length": 64},
     r"--rope-original-length does nothing with --rope-scaling ntk: only yarn uses it"),
])
def test_a_bad_setting_is_refused_at_build_in_one_line(setting, message):
    """--model-overrides sets the flags on a checkpoint's arguments without parsing them: the build checks."""
    from fairseq_plugins.models.position_transformer import FlagError

    with pytest.raises(FlagError, match=f"^{message}") as err:
        tiny_models.build("rope_transformer_tiny", **setting)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("setting", [{"rope_scaling": "linear", "rope_scaling_factor": 2.0},
                                     {"rope_scaling_factor": 2.0}, {"rope_original_length": 64}])
def test_the_flags_are_refused_without_rope(setting):
    from fairseq_plugins.models.position_transformer import FlagError

    flag = "--" + next(iter(setting)).replace("_", "-")
    with pytest.raises(FlagError, match=f"^{flag} is a rope flag, and this model's position schemes are alibi "
                                        r"\(encoder\) and alibi \(decoder\): it would do nothing$"):
        tiny_models.build("alibi_transformer_tiny", **setting)


# -- at decode time, on a trained checkpoint ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def rope_ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory, "rope_transformer_tiny")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


@pytest.mark.slow
def test_the_override_at_decode_time_is_position_interpolation(data, rope_ckpt):
    """fairseq-generate's --model-overrides path (checkpoint_utils with arg_overrides): the checkpoint's record
    (arch and schemes) accepts the load, the logits change, and they are the trained model's with positions m/s."""
    def load(**overrides):
        (model,), _ = checkpoint_utils.load_model_ensemble([str(rope_ckpt)],
                                                           arg_overrides={"data": str(data / "bin"), **overrides})
        return model.eval().double()

    plain, stretched = load(), load(rope_scaling="linear", rope_scaling_factor=S)
    assert stretched.encoder.position_scheme.scaling == "linear"
    for stack in (plain.encoder, plain.decoder):  # the trained model, its positions divided by s by hand
        rope, rotated = stack.position_scheme, stack.position_scheme.rotated
        rope.rotated = lambda x, pos, rotated=rotated: rotated(x, pos.double() / S)
    src, lengths, prev = tiny_models.fixed_batch()
    with torch.no_grad():
        by_hand, got = plain(src, lengths, prev)[0], stretched(src, lengths, prev)[0]
        unscaled = load()(src, lengths, prev)[0]
    torch.testing.assert_close(got, by_hand, rtol=1e-12, atol=1e-12)
    assert (got - unscaled).abs().max() > 1e-3


@pytest.mark.slow
def test_fairseq_generate_takes_the_overrides_and_refuses_a_bad_one_in_one_line(data, rope_ckpt):
    def generate(overrides):
        return run_split([str(BIN / "fairseq-generate"), str(data / "bin"), "--user-dir", "fairseq_plugins",
                          "--path", str(rope_ckpt), "--cpu", "--beam", "2", "--max-sentences", "8",
                          "--model-overrides", overrides])

    good = generate("{'rope_scaling': 'yarn', 'rope_scaling_factor': 4.0, 'rope_original_length': 64}")
    assert good.returncode == 0 and "H-" in good.stdout, good.stderr[-2000:]
    bad = generate("{'rope_scaling': 'yarn', 'rope_scaling_factor': 4.0}")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1] == ("FlagError: --rope-scaling yarn needs --rope-original-length L "
                                                   "(the training length, in tokens)")
