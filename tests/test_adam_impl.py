"""`--optimizer adam --adam-impl torch`: fairseq's Adam stepped by torch's multi-tensor kernels (the fused ones on
CPU and CUDA, foreach elsewhere: TorchAdam in fairseq/optim/adam.py, third_party/fairseq-0.12.2/04-fused-update.patch)
gives the parameters of fairseq's own Adam (`--adam-impl fairseq`, the default) to float rounding:

- the optimizer alone, 20 steps: tensors of several shapes in two groups, two of them without a gradient in 2 steps
  of 3 (so that step counts differ within a group), weight decay, amsgrad, torch's foreach and fused kernels,
  gradients of 1e-3 and near eps;
- fairseq's Trainer (torch's fused CPU kernel) with --update-freq 2, --clip-norm and --weight-decay, 20 updates
  in lockstep (after each, the torch run takes the fairseq run's state, so that each update is compared from the
  same start): fp32, --fp16 (float32 master weights, flat and not), --memory-efficient-fp16/bf16 (half weights:
  TorchAdam hands them to Adam.step, bit for bit), --bf16 and --amp (which on CPU runs fairseq's AMPOptimizer in
  float32: torch's CUDA autocast and GradScaler do nothing here); FLOATER with its flow solved every third
  update, whose θ sits out the other updates (fewer steps); and 20 free-running float32 updates;
- a checkpoint written under one implementation resumes under the other bit for bit as an in-memory hand-over
  (the state keeps fairseq's layout: exp_avg, exp_avg_sq and step as an int).

The bound, ROUNDING: each tensor's largest difference relative to its largest value. Measured: 6e-8 to 1.2e-7 (the
optimizer alone), 3.1e-7 (each Trainer update, every mode), 4.1e-7 (20 free-running fp32 updates). With torch's eps
left as is instead of eps / sqrt(1 - beta2^t) each of these fails (but the half-weight modes), by 7.5e-4 to 1e-2;
with one eps for all step counts, the near-eps and FLOATER ones fail.
"""

import pytest
import torch

from helpers.precision_harness import (MODELS, MODES, build_trainer, cpu_fp16_optimizer, difference,
                                       named_master_params)
from helpers.small_task import small_data
from helpers.tiny_models import one_thread  # noqa: F401  (autouse fixture)

UPDATES = 20
COMMON = ["--update-freq", "2", "--clip-norm", "0.5", "--weight-decay", "0.01"]
ROUNDING = 1e-6


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


# ---- the optimizer alone -------------------------------------------------------------------------------------

SHAPES = [(64, 32), (32,), (7, 3, 5), (1,), (100,)]


def optimizer_run(impl, steps=UPDATES, scale=1e-3, **kwargs):
    """Two groups (the second with its own lr); tensors 1 and 3 get no gradient in 2 steps of 3."""
    from fairseq.optim.adam import Adam, TorchAdam

    g = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]
    cls = Adam if impl == "fairseq" else TorchAdam
    opt = cls([{"params": params[:3]}, {"params": params[3:], "lr": 5e-3}], lr=1e-2, betas=(0.9, 0.98), eps=1e-8,
              **kwargs)
    for t in range(steps):
        for i, p in enumerate(params):
            grad = torch.randn(p.shape, generator=g) * scale
            p.grad = None if i in (1, 3) and t % 3 else grad
        opt.step()
    return {i: p.detach().clone() for i, p in enumerate(params)}, opt


def kernel_calls(monkeypatch):
    """Counts TorchAdam's calls of torch's kernels, by kind: {'foreach': n, 'fused': n}."""
    import fairseq.optim.adam as adam

    calls = {"foreach": 0, "fused": 0}
    real = adam.torch_adamw

    def counted(*args, foreach, fused, **kwargs):
        calls["fused" if fused else "foreach"] += 1
        return real(*args, foreach=foreach, fused=fused, **kwargs)

    monkeypatch.setattr(adam, "torch_adamw", counted)
    return calls


@pytest.mark.parametrize("fused", [False, None], ids=["foreach", "fused"])  # None: TorchAdam's choice on CPU
@pytest.mark.parametrize("amsgrad", [False, True], ids=["adam", "amsgrad"])
@pytest.mark.parametrize("scale", [1e-3, 1e-8], ids=["grads-1e-3", "grads-near-eps"])
def test_the_optimizer_alone_steps_as_fairseqs(monkeypatch, fused, amsgrad, scale):
    calls = kernel_calls(monkeypatch)
    want, fairseq_opt = optimizer_run("fairseq", scale=scale, weight_decay=0.01, amsgrad=amsgrad)
    got, torch_opt = optimizer_run("torch", scale=scale, weight_decay=0.01, amsgrad=amsgrad, fused=fused)
    # each update calls one kind of kernel: once per group and step count (1 to 3 per group here)
    kind, other = ("foreach", "fused") if fused is False else ("fused", "foreach")
    assert calls[kind] >= 2 * UPDATES and calls[other] == 0
    off = difference(want, got)
    print(f"fused={fused} amsgrad={amsgrad} grads {scale:g}: parameters differ by {off:.2e} (relative)")
    assert off <= ROUNDING
    # the same state, in fairseq's layout: the step an int, counted per tensor
    a, b = fairseq_opt.state_dict(), torch_opt.state_dict()
    assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        assert a["state"][i].keys() == b["state"][i].keys()
        assert type(b["state"][i]["step"]) is int and b["state"][i]["step"] == a["state"][i]["step"]
        for key in a["state"][i]:
            if key != "step":
                x, y = a["state"][i][key], b["state"][i][key]
                assert float((x - y).abs().max()) <= ROUNDING * float(x.abs().max()), key
    assert [a["state"][i]["step"] for i in sorted(a["state"])] == [20, 7, 20, 7, 20]


def test_half_parameters_take_fairseqs_own_step(monkeypatch):
    """--memory-efficient-fp16/bf16 give the optimizer half weights with half gradients: Adam.step keeps their
    moments in float32; TorchAdam hands them to it (the float32 ones of the same group still go to torch)."""
    from fairseq.optim.adam import Adam, TorchAdam

    calls = kernel_calls(monkeypatch)
    results = []
    for cls in (Adam, TorchAdam):
        g = torch.Generator().manual_seed(3)
        params = [torch.nn.Parameter(torch.randn(8, 4, generator=g).to(dtype))
                  for dtype in (torch.float16, torch.bfloat16, torch.float32)]
        opt = cls(params, lr=1e-2, weight_decay=0.01)
        for _ in range(5):
            for p in params:
                p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
            opt.step()
        assert all(opt.state[p]["exp_avg"].dtype == torch.float32 for p in params)
        results.append({i: p.detach().float().clone() for i, p in enumerate(params)})
    assert calls["fused"] == 5
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert difference(results[0], results[1]) <= ROUNDING


def test_the_default_stays_fairseqs_own_adam():
    from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig, TorchAdam

    cfg = FairseqAdamConfig(lr=[1e-3], adam_betas="(0.9, 0.98)", tpu=False)
    assert cfg.adam_impl == "fairseq"
    assert not isinstance(FairseqAdam(cfg, [torch.nn.Parameter(torch.zeros(3))]).optimizer, TorchAdam)


def test_what_torch_cannot_do_is_refused_in_one_line():
    from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig

    params = [torch.nn.Parameter(torch.zeros(3))]
    for setting in ({"fp16_adam_stats": True}, {"tpu": True}):
        cfg = FairseqAdamConfig(lr=[1e-3], adam_impl="torch", **{"tpu": False, **setting})
        with pytest.raises(ValueError) as error:
            FairseqAdam(cfg, params)
        assert "\n" not in str(error.value) and str(error.value).startswith("--adam-impl torch ")


def test_the_option_is_listed_with_what_was_verified_where():
    from fairseq import options

    parser = options.get_training_parser()
    options.parse_args_and_arch(parser, ["data", "--arch", "transformer_tiny", "--optimizer", "adam"])
    text = parser.format_help()
    assert "--adam-impl {fairseq,torch}" in text
    help_text = " ".join(text.split("--adam-impl {fairseq,torch}", 1)[1].split())
    assert "Verified on CPU" in help_text and "Not yet run on a GPU" in help_text


# ---- fairseq's Trainer ---------------------------------------------------------------------------------------

KEY_BIAS = ".k_proj.bias"  # see free_running_difference


def trainer(data, model, mode, impl):
    arch, extra = MODELS[model]
    flags, overrides = MODES[mode]
    tr, batches = build_trainer(data, arch, [*flags, *extra, *COMMON, "--adam-impl", impl], overrides)
    from fairseq.optim.adam import TorchAdam

    assert isinstance(tr.optimizer.optimizer, TorchAdam) == (impl == "torch")
    return tr, iter(batches)


def update(tr, batches):
    number = tr.get_num_updates()
    assert tr.train_step([next(batches), next(batches)]) is not None and tr.get_num_updates() == number + 1, \
        f"update {number + 1} was skipped (loss-scale overflow?)"


def step_counts(tr):
    opt = tr.optimizer.optimizer
    return [opt.state[p]["step"] if p in opt.state else 0 for p in tr.optimizer.params]


def sync(src, dst):
    """dst takes src's training state: model and master weights, Adam's state, the fp16 loss scaler."""
    from fairseq.optim.dynamic_loss_scaler import DynamicLossScaler

    dst.model.load_state_dict(src.model.state_dict())
    for p_src, p_dst in zip(src.optimizer.params, dst.optimizer.params):  # the optimizer's own (float32 masters)
        p_dst.data.copy_(p_src.data)
        state = src.optimizer.optimizer.state.get(p_src)
        dst.optimizer.optimizer.state.pop(p_dst, None)
        if state:
            dst.optimizer.optimizer.state[p_dst] = {k: v.clone() if torch.is_tensor(v) else v
                                                    for k, v in state.items()}
    if isinstance(getattr(src.optimizer, "scaler", None), DynamicLossScaler):
        dst.optimizer.scaler.__dict__.update(src.optimizer.scaler.__dict__)
    dst.set_num_updates(src.get_num_updates())  # and with it the lr


# every mode but bf16-hydra (the optimizer wrappers of --bf16); FLOATER's θ sits out 2 updates of 3: fewer steps
# (the fast loop: one of each wrapper; fp16 without flat masters and memory-efficient bf16 in the slow tier)
LOCKSTEP_CASES = [pytest.param("transformer", mode, marks=pytest.mark.slow if mode in (
    "fp16-no-flatten-grads", "memory-efficient-bf16") else ()) for mode in MODES if mode != "bf16-hydra"]
LOCKSTEP_CASES += [("floater-N3", "fp32")]


@pytest.mark.parametrize("model,mode", LOCKSTEP_CASES)
def test_each_update_steps_as_fairseqs_in_every_precision_mode(data, model, mode):
    """Two Trainers on the same batches, one per implementation; after each update the torch one takes the fairseq
    one's state, so that every update starts from the same weights, gradients and moments: the optimizer's float32
    weights then differ by that update's rounding alone (half weights: Adam.step itself, bit for bit)."""
    with cpu_fp16_optimizer():
        (want, batches), (got, batches_too) = trainer(data, model, mode, "fairseq"), trainer(data, model, mode, "torch")
        largest = 0.0
        for number in range(1, UPDATES + 1):
            update(want, batches)
            update(got, batches_too)
            off = difference(named_master_params(want), named_master_params(got))
            assert off <= ROUNDING, f"update {number}: the parameters differ by {off:.3g} (relative)"
            if mode.startswith("memory-efficient"):
                assert off == 0, f"update {number}: half weights are not stepped by Adam.step"
            assert step_counts(want) == step_counts(got)
            largest = max(largest, off)
            sync(want, got)
    if model.startswith("floater"):
        assert min(step_counts(got)) < UPDATES == max(step_counts(got))
    print(f"{model} {mode}: updates differ by at most {largest:.2e} (relative)")


def free_running_difference(want, got):
    """difference() over all but the attention key biases: their gradient is zero in exact arithmetic (softmax
    ignores a shift shared by all keys), so what the optimizer gets is rounding noise that Adam normalises into
    steps of about lr: two runs whose weights differ by rounding move them differently (here by 3e-4 of
    their size in fp32). The lockstep test above holds them to rounding as well."""
    return difference(*({k: v for k, v in d.items() if KEY_BIAS not in k} for d in (want, got)))


@pytest.mark.parametrize("mode", ["fp32", pytest.param("amp", marks=pytest.mark.slow)])
def test_twenty_updates_give_fairseqs_parameters(data, mode):
    """Free-running float32 runs (--amp: float32 on CPU). In fp16 and bf16 the half weights turn a rounding
    difference into a gradient difference of the half precision's size, and FLOATER's flow amplifies one in θ
    (about 1e-4 after 20 updates, while each update differs by 3.1e-7): there the lockstep test above is the check."""
    results = []
    for impl in ("fairseq", "torch"):
        with cpu_fp16_optimizer():
            tr, batches = trainer(data, "transformer", mode, impl)
            for _ in range(UPDATES):
                update(tr, batches)
        results.append((named_master_params(tr), step_counts(tr)))
    (want, want_steps), (got, got_steps) = results
    assert want_steps == got_steps == [UPDATES] * len(got_steps)
    off = free_running_difference(want, got)
    print(f"transformer {mode}: after {UPDATES} updates the parameters differ by {off:.2e} (relative; the key "
          f"biases by {difference(want, got):.2e})")
    assert off <= ROUNDING


@pytest.mark.parametrize("saved,resumed", [("fairseq", "torch"), ("torch", "fairseq"), ("torch", "torch")])
def test_a_checkpoint_resumes_under_either_implementation(data, tmp_path, saved, resumed):
    """Saved after 10 updates under one implementation (FLOATER: θ has stepped fewer times than the rest), loaded
    by a Trainer under the other, 10 more updates: bit for bit those of a Trainer of the other implementation that
    took the saving one's state in memory (or, with the same implementation, of the saving Trainer itself).
    In float32: a --fp16 checkpoint holds no float32 master weights (a resume starts from the half ones), which
    the in-memory hand-over would keep; FP16Optimizer's state_dict is Adam's, whichever implementation."""
    model, mode = "floater-N3", "fp32"
    from fairseq import checkpoint_utils

    half, path = UPDATES // 2, str(tmp_path / "checkpoint.pt")
    with cpu_fp16_optimizer():
        first, batches = trainer(data, model, mode, saved)
        for _ in range(half):
            update(first, batches)
        first.consolidate_optimizer()  # as checkpoint_utils.save_checkpoint does first
        first.save_checkpoint(path, {})
        steps = [s["step"] for s in checkpoint_utils.load_checkpoint_to_cpu(path)["last_optimizer_state"]["state"]
                 .values()]
        assert all(type(s) is int for s in steps) and max(steps) == half  # fairseq's layout, whoever wrote it
        assert min(steps) < half

        loaded, loaded_batches = trainer(data, model, mode, resumed)
        loaded.load_checkpoint(path)
        assert loaded.get_num_updates() == half
        if resumed == saved:
            reference, reference_batches = first, batches
        else:
            reference, reference_batches = trainer(data, model, mode, resumed)
            sync(first, reference)
            for _ in range(2 * half):
                next(reference_batches)
        for _ in range(2 * half):
            next(loaded_batches)
        for _ in range(half):
            update(loaded, loaded_batches)
            update(reference, reference_batches)
    want, got = named_master_params(reference), named_master_params(loaded)
    assert step_counts(reference) == step_counts(loaded)
    assert all(torch.equal(want[k], got[k]) for k in want), \
        f"resumed run off by {difference(want, got):.3g} (relative)"
