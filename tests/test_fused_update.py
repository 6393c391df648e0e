"""`--fused-update`: fairseq's update with its bookkeeping in multi-tensor operations and without per-update reads
of device values (third_party/fairseq-0.12.2/04-fused-update.patch: fairseq/utils.py's clip_grad_norm_,
FairseqOptimizer's multiply_grads and clip_grad_norm, FP16Optimizer's master copies and --bf16's flat master weights,
the trainer's metrics), against fairseq's own update on the same batches:

- every update of fairseq's Trainer in every precision mode (fp32, --fp16 flat and not, --bf16, --amp, the
  memory-efficient ones), in lockstep (after each update the fused trainer takes the default one's weights, master
  weights and Adam's moments, mapped between --bf16's per-tensor and flat layouts): the master weights differ by
  that update's rounding alone, with --clip-norm active, --update-freq 2 and weight decay. In fp32 nothing is
  reordered on CPU (torch's CPU foreach kernels run tensor by tensor: the same kernels in the same order), so
  there the updates are bit for bit fairseq's; with flat --bf16 masters the norm is summed in another order;
- 50 free-running fp32 updates: the same losses and weights, bit for bit on CPU (the issue's bound: 1e-4);
- what fairseq-train logs every --log-interval (loss, nll_loss, gnorm, wpb ...) is what it logs without the flag;
- a non-finite gradient still stops fp32 training as it did, and still skips an fp16 update, lowering the loss
  scale;
- the bounds: aten operators and host syncs of one update (tooling/bench/update_ops.py's counter) for the tiny
  Transformer and Shaw's model in each precision, with --adam-impl torch; the counts the flag reaches are the
  limits, and each is below the default's.
"""
import itertools

import pytest
import torch

from helpers.precision_harness import (MODES, build_trainer, cpu_fp16_optimizer, difference, master_params,
                                       named_master_params)
from helpers.small_task import small_data
from helpers.tiny_models import EOS, VOCAB, one_thread  # noqa: F401  (one_thread: an autouse fixture)
from fairseq_plugins.schemes import SCHEMES

COMMON = ["--update-freq", "2", "--clip-norm", "0.5", "--weight-decay", "0.01"]
ROUNDING = 1e-6
# --bf16: the default's master weights are per tensor, --fused-update's flat, so the gradient norm is summed in
# another order (one pass over the flat buffer instead of per tensor, then over the norms) and --clip-norm's
# coefficient differs in its last bits; measured 1.25e-6 (layer-norm biases of about 5e-4 after their first
# steps). Every other mode keeps the default's layout: ROUNDING.
BF16_FLAT_ROUNDING = 2e-6
LOCKSTEP_UPDATES = 6
FREE_UPDATES = 50
LOCKSTEP_MODES = [m for m in MODES if m != "bf16-hydra"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


def trainer(data, mode, fused, arch="transformer_tiny", extra=(), save_dir=None):
    """The Trainer and its batches, epoch after epoch (the same order for both trainers of a comparison)."""
    flags, overrides = MODES[mode]
    save = ["--save-dir", str(save_dir)] if save_dir else []
    tr, batches = build_trainer(data, arch, [*flags, *COMMON, *extra, *save, *(["--fused-update"] if fused else [])],
                                overrides)
    return tr, itertools.cycle(list(batches))


def update(tr, batches):
    number = tr.get_num_updates()
    out = tr.train_step([next(batches), next(batches)])
    assert out is not None and tr.get_num_updates() == number + 1, f"update {number + 1} was skipped"
    return out


def slots(tr):
    """name → [(tensor the optimizer steps, offset, numel)] for the master weights: flat or per tensor."""
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    opt = tr.optimizer
    names = {id(p): n for n, p in tr.model.named_parameters()}
    if isinstance(opt, FP16Optimizer) and opt.has_flat_params:
        (flat,) = opt.fp32_params.values()
        out, offset = {}, 0
        for p in opt.fp16_params:
            out[names[id(p)]] = (flat, offset, p.numel())
            offset += p.numel()
        return out
    if isinstance(opt, FP16Optimizer):
        return {names[id(p)]: (p32, 0, p.numel()) for p, p32 in zip(opt.fp16_params, opt.fp32_params)}
    return {names[id(p)]: (p, 0, p.numel()) for p in opt.params}


def take_state(src, dst):
    """dst takes src's weights, master weights and Adam's moments and step counts, slice by slice (the two may
    lay the master weights out differently: --bf16 per tensor by default, flat with --fused-update)."""
    from fairseq.optim.dynamic_loss_scaler import DynamicLossScaler

    dst.model.load_state_dict(src.model.state_dict())
    s_opt, d_opt = src.optimizer.optimizer, dst.optimizer.optimizer
    s_slots, d_slots = slots(src), slots(dst)
    for name, (s_t, s_off, n) in s_slots.items():
        d_t, d_off, _ = d_slots[name]
        d_t.data.view(-1)[d_off:d_off + n].copy_(s_t.data.view(-1)[s_off:s_off + n])
        s_state = s_opt.state.get(s_t, {})
        d_state = d_opt.state.setdefault(d_t, {})
        for key, value in s_state.items():
            if torch.is_tensor(value) and value.numel() > 1:
                if key not in d_state:
                    d_state[key] = torch.zeros_like(d_t.data)
                d_state[key].view(-1)[d_off:d_off + n].copy_(value.view(-1)[s_off:s_off + n])
            else:
                d_state[key] = value
    if isinstance(getattr(src.optimizer, "scaler", None), DynamicLossScaler):
        dst.optimizer.scaler.__dict__.update(src.optimizer.scaler.__dict__)
    dst.set_num_updates(src.get_num_updates())


@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.slow if m in (
    "fp16-no-flatten-grads", "memory-efficient-bf16") else ()) for m in LOCKSTEP_MODES])
def test_each_update_is_fairseqs_in_every_precision_mode(data, mode):
    """Lockstep (see the docstring): each update's master weights within ROUNDING; fp32 and amp (float32 on
    CPU) bit for bit."""
    with cpu_fp16_optimizer():
        (want, batches), (got, batches_too) = trainer(data, mode, False), trainer(data, mode, True)
        for number in range(1, LOCKSTEP_UPDATES + 1):
            update(want, batches)
            update(got, batches_too)
            off = difference(named_master_params(want), named_master_params(got))
            bound = BF16_FLAT_ROUNDING if mode.startswith("bf16") and "memory" not in mode else ROUNDING
            assert off <= bound, f"{mode} update {number}: the parameters differ by {off:.3g} (relative)"
            if mode in ("fp32", "amp"):
                assert off == 0, f"{mode} update {number}: not bit for bit ({off:.3g})"
            take_state(want, got)
    if mode.startswith("bf16"):
        assert got.optimizer.has_flat_params and not want.optimizer.has_flat_params


def losses_and_weights(data, fused, updates):
    from fairseq.logging import metrics

    tr, batches = trainer(data, "fp32", fused, extra=["--adam-impl", "torch"])
    losses = []
    for _ in range(updates):
        with metrics.aggregate(new_root=True) as agg:
            update(tr, batches)
        losses.append(agg.get_smoothed_value("loss"))
    return losses, named_master_params(tr)


def test_fifty_free_running_updates_are_fairseqs(data):
    (want_losses, want), (got_losses, got) = (losses_and_weights(data, fused, FREE_UPDATES) for fused in (False, True))
    worst = max(abs(a - b) / abs(a) for a, b in zip(want_losses, got_losses))
    assert worst <= 1e-4, f"losses differ by {worst:.3g} (relative)"
    assert worst == 0 and difference(want, got) == 0, "fp32 on CPU reorders nothing: bit for bit"
    assert want_losses[-1] < want_losses[0]


@pytest.mark.parametrize("mode", ["fp32", "fp16"])
def test_what_fairseq_train_logs_is_unchanged(data, mode):
    """The smoothed values of four updates, as fairseq-train's --log-interval 4 would print them."""
    from fairseq.logging import metrics

    logged = []
    with cpu_fp16_optimizer():
        for fused in (False, True):
            tr, batches = trainer(data, mode, fused)
            with metrics.aggregate(new_root=True) as agg:
                outs = [update(tr, batches) for _ in range(4)]
            values = agg.get_smoothed_values()
            logged.append({k: v for k, v in values.items() if k not in ("ups", "wps", "wall", "train_wall")})
            if fused:
                assert all(set(o) == {"sample_size"} for o in outs)  # nothing read from the device per update
    want, got = logged
    assert want.keys() == got.keys() and {"loss", "nll_loss", "gnorm", "wpb", "bsz", "lr"} <= set(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6), key


def test_a_non_finite_gradient_still_stops_fp32_training(data, tmp_path):
    """With fairseq's own Adam, as without the flag: the update is not taken, crash.pt is written, and
    FloatingPointError ends the step (fairseq's NanDetector re-run, which fails on torch 2, no longer replaces it:
    the patch logs its failure instead)."""
    raised = []
    for fused in (False, True):
        (tmp_path / str(fused)).mkdir()
        tr, batches = trainer(data, "fp32", fused, save_dir=tmp_path / str(fused))  # crash.pt goes there
        update(tr, batches)
        with torch.no_grad():
            next(tr.model.parameters()).fill_(float("nan"))
        with pytest.raises(FloatingPointError) as error:
            tr.train_step([next(batches), next(batches)])
        assert tr.get_num_updates() == 1 and (tmp_path / str(fused) / "crash.pt").is_file()
        raised.append(str(error.value))
    assert raised[0] == raised[1] == "gradients are Nan/Inf"


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_with_torchs_adam_a_non_finite_norm_is_skipped_on_the_device_and_read_at_the_log_interval(data, tmp_path,
                                                                                                  mode):
    """--fused-update --adam-impl torch in fp32 and bf16: the trainer does not read the norm's finiteness every
    update; a non-finite norm makes torch's fused Adam skip that step on the device (the master weights stay those
    before it, weight decay included), a finite one after it steps, and the host reads whether one was seen every
    --log-interval updates (here the 4th), where training stops as it would have at once, writing crash.pt."""
    from fairseq.optim.adam import TorchAdam

    from tooling.bench.update_ops import UpdateCounter

    with cpu_fp16_optimizer():
        tr, batches = trainer(data, mode, True, extra=["--adam-impl", "torch", "--log-interval", "4"],
                              save_dir=tmp_path)
        assert isinstance(tr.optimizer.optimizer, TorchAdam) or update(tr, batches) is not None
        if tr.get_num_updates() == 0:
            update(tr, batches)  # update 1
        assert tr._skips_on_device() is not None
        before = master_params(tr)
        hook = tr.model.decoder.register_forward_hook(lambda m, i, out: (out[0] * float("nan"), *out[1:]))
        with UpdateCounter() as counter:
            update(tr, batches)  # update 2: its norm is NaN
        hook.remove()
        assert counter.syncs == {}, counter.syncs  # nothing read
        assert difference(before, master_params(tr)) == 0  # skipped on the device
        update(tr, batches)  # update 3: finite, steps
        assert difference(before, master_params(tr)) > 0
        with pytest.raises(Exception) as error:
            tr.train_step([next(batches), next(batches)])  # update 4: the log interval's read
    assert tr.get_num_updates() == 3 and (tmp_path / "crash.pt").is_file()
    assert isinstance(error.value, FloatingPointError) and "--log-interval" in str(error.value)


def test_without_a_non_finite_norm_the_read_at_the_log_interval_lets_training_go_on(data):
    with cpu_fp16_optimizer():
        tr, batches = trainer(data, "fp32", True, extra=["--adam-impl", "torch", "--log-interval", "2"])
        for _ in range(4):
            update(tr, batches)
    assert tr.get_num_updates() == 4 and tr._nonfinite is None


def test_an_fp16_overflow_still_skips_the_update_and_lowers_the_scale(data, monkeypatch):
    # fairseq's overflow handler makes its zero norm with .cuda(): a CPU tensor stays one here
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    results = []
    with cpu_fp16_optimizer():
        for fused in (False, True):
            tr, batches = trainer(data, "fp16", fused)
            update(tr, batches)
            tr.optimizer.scaler.loss_scale = 2.0 ** 60  # the scaled loss overflows fp16
            before = master_params(tr)
            assert tr.train_step([next(batches), next(batches)]) is None
            results.append((tr.get_num_updates(), tr.optimizer.scaler.loss_scale))
            assert difference(before, master_params(tr)) == 0
    assert results[0] == results[1] and results[0][0] == 1 and results[0][1] < 2.0 ** 60


def test_fairseq_train_logs_and_saves_what_it_does_without_the_flag(data, tmp_path):
    """The user's command: fairseq-train with --log-interval 3 and --fused-update --adam-impl torch prints the same
    train_inner, train and valid lines (timings aside) as with --adam-impl torch alone, and saves the same weights."""
    import re

    from helpers.small_task import load, run1, train_cmd

    logs, weights = [], []
    for fused in (False, True):
        save = tmp_path / str(fused)
        out = run1(train_cmd(data, save, "transformer_tiny", "--log-interval", "3", "--adam-impl", "torch",
                             *(["--fused-update"] if fused else []), max_update=9)).stdout
        lines = [re.sub(r"\b(wps|ups|wall|train_wall|gb_free)[= ][0-9.]+(, | \| )?", "", line.split(" | ", 3)[-1])
                 for line in out.splitlines() if "| INFO | train" in line or "| INFO | valid" in line]
        assert any("loss" in line for line in lines), out[-2000:]
        logs.append(lines)
        weights.append(load(save / "checkpoint_last.pt")["model"])
    assert logs[0] == logs[1]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


# ---- the padding checks: masked as if there were padding, with none -----------------------------------------------

ARCHS = sorted({s.arch("tiny") for s in SCHEMES.values() if s.arch_prefix} | {"transformer_tiny"})


@pytest.mark.parametrize("arch", ARCHS)
def test_a_batch_without_padding_gives_the_same_values_masked(arch):
    """--fused-update's encoders and decoders mask padding without asking whether a batch has any (the read is a host
    sync): on a batch without padding the all-false masks change no value beyond rounding, for every scheme, and the
    gradients alike."""
    from helpers.tiny_models import build

    src = torch.randint(4, VOCAB, (3, 7), generator=torch.Generator().manual_seed(0))
    prev = torch.randint(4, VOCAB, (3, 6), generator=torch.Generator().manual_seed(1))
    prev[:, 0] = EOS
    outputs = []
    for assume in (False, True):
        model = build(arch)
        flags = [m for m in model.modules() if hasattr(m, "assume_padding")]
        assert len(flags) == 2  # the encoder and the decoder
        for m in flags:
            m.assume_padding = assume
        out = model(src, torch.full((3,), 7), prev)[0]
        out.float().pow(2).sum().backward()
        outputs.append((out.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (want, want_grads), (got, got_grads) = outputs
    assert (want - got).abs().max() <= 1e-6 * want.abs().max()
    assert want_grads.keys() == got_grads.keys()
    # against the largest gradient: some are rounding noise around an exact zero (a shift softmax ignores)
    scale = max(float(g.abs().max()) for g in want_grads.values())
    for name in want_grads:
        assert float((want_grads[name] - got_grads[name]).abs().max()) <= 1e-6 * scale, name


# ---- the bounds: operators and host syncs of one update --------------------------------------------------------

# (precision, model) -> (operators, host syncs) of one update of the tiny models with --fused-update
# --adam-impl torch on CPU, counted by tooling/bench/update_ops.py (--count-ops --regime --dims tiny
# --max-tokens 1024 --vocab 1000; fp16 on CPU: --fp16-no-flatten-grads, its flat buffer being a GPU's by default).
# The syncs left: none in fp32 and bf16 (a non-finite norm skips the fused step on the device; the host reads whether
# one was seen every --log-interval updates); in amp and fp16 the trainer's finiteness check and the loss scale's
# overflow test of the same norm (2 reads, 1 drain; on a GPU --amp's GradScaler reads once more, which torch's CPU
# GradScaler, disabled, does not show).
LIMITS = {
    ("fp32", "transformer"): (540, 0), ("fp32", "relative"): (730, 0),
    ("amp", "transformer"): (545, 2), ("amp", "relative"): (710, 2),
    ("bf16", "transformer"): (555, 0), ("bf16", "relative"): (775, 0),
    ("fp16", "transformer"): (560, 2), ("fp16", "relative"): (780, 2),
}


def count(dims, models, max_tokens, extra=()):
    """(fused, precision, model) → update_ops' row of one update, default and fused, in each precision."""
    import argparse

    from tooling.bench.update_ops import count_update_ops

    out = {}
    for fused in (False, True):
        args = argparse.Namespace(threads=1, silent=True, vocab=1000, dims=dims, models=models, floater_every=4,
                                  max_tokens=max_tokens, precision="fp32,amp,bf16,fp16", seed=1, device="cpu",
                                  update_flags=[*extra, *(["--fused-update", "--adam-impl", "torch"] if fused else [])],
                                  command="test")
        for r in count_update_ops(args)["rows"]:
            out[fused, r["precision"], r["model"]] = r
    return out


@pytest.fixture(scope="module")
def counts():
    return count("tiny", "relative", "1024")


@pytest.mark.parametrize("precision,model", list(LIMITS))
def test_an_update_stays_within_its_operator_and_sync_bounds(counts, precision, model):
    fused, default = counts[True, precision, model], counts[False, precision, model]
    ops, syncs = LIMITS[precision, model]
    assert fused["ops"] <= ops and fused["syncs"] <= syncs, (fused["ops"], fused["sync_sites"])
    assert fused["ops"] < 0.6 * default["ops"] and fused["syncs"] < default["syncs"]
    # what is left is the norm's finiteness (the trainer) and overflow test (the precision's wrapper), no other read
    left = {site.split(" @ ")[1].split(":")[0] for site in fused["sync_sites"]}
    assert left <= {"fairseq/trainer.py", "fairseq/optim/amp_optimizer.py", "fairseq/optim/fp16_optimizer.py"}, left


def test_the_option_is_listed_with_what_was_verified_where():
    from fairseq import options

    parser = options.get_training_parser()
    options.parse_args_and_arch(parser, ["data", "--arch", "transformer_tiny", "--optimizer", "adam"])
    text = " ".join(parser.format_help().split())
    assert "--fused-update" in text
    help_text = text.split("--fused-update", 1)[1]
    assert "Verified on CPU" in help_text and "Not yet run on a GPU" in help_text


# The same bounds at base dims (fairseq's Transformer, 512 tokens: the operators do not depend on the batch's size)
# and for the study's tiny recipe (transformer_tiny with scripts/study/multi30k_study.sh's MODEL_ARGS, 1,024 tokens),
# the Transformer in each precision: (operators, syncs) with --fused-update --adam-impl torch; measured 1,287/0,
# 1,291/2, 1,314/0, 1,321/2 at base (the default: 3,575/8, 3,581/9, 4,360/8, 4,368/11) and 913/0, 917/2, 932/0,
# 939/2 for the recipe (the default: 2,445/8, 2,451/9, 2,970/8, 2,978/11).
SIZE_LIMITS = {
    "base": {"fp32": (1290, 0), "amp": (1295, 2), "bf16": (1320, 0), "fp16": (1325, 2)},
    "recipe": {"fp32": (915, 0), "amp": (920, 2), "bf16": (935, 0), "fp16": (940, 2)},
}


@pytest.mark.parametrize("size", [pytest.param("base", marks=pytest.mark.slow), "recipe"])
def test_base_dims_and_the_study_recipe_stay_within_their_bounds(size):
    from tooling.gpu.campaign_jobs import study_model_args

    if size == "base":
        counted = count("base", "", "512")
    else:
        counted = count("tiny", "", "1024", study_model_args().split())
    assert {model for _, _, model in counted} == {"transformer"}
    for precision, (ops, syncs) in SIZE_LIMITS[size].items():
        got, default = counted[True, precision, "transformer"], counted[False, precision, "transformer"]
        assert got["ops"] <= ops and got["syncs"] <= syncs, (precision, got["ops"], got["sync_sites"])
        assert got["ops"] < 0.4 * default["ops"] and got["syncs"] < default["syncs"], precision
