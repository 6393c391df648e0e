"""Every model trains with its own, correct gradients in every precision mode fairseq offers.

Each case runs fairseq's own Trainer (tests/helpers/precision_harness.py: on CPU, fp16/bf16 arithmetic included) for a
few updates and checks after every update:
- each parameter was stepped with its own gradient: the optimizer's float32 gradient equals the gradient a
  float32 copy of the model computes from the very weights that update used, within the mode's rounding
  (TOLERANCE; relative to the parameter's gradient norm, floored at 1e-3 of the model's);
- a parameter without a gradient in float32 has none in the optimizer either, so it is not stepped: FLOATER's
  flow θ on cached updates (``--floater-update-every 3``: updates 1, 2 and 4 here), whose float32 master copy
  and model copy must then stay bit for bit the same (Adam's momentum moves a parameter given a zero gradient);
- at the end the run's parameters are those of a float32 run on the same batches, within the mode's rounding
  amplified by Adam over the updates (RUN_TOLERANCE, relative to how far the float32 run moved them).
"""
import pytest
import torch

from helpers.precision_harness import (MODELS, MODES, build_trainer, cpu_fp16_optimizer, gradient_errors, master_grads,
                               master_params, reference_grads, theta_parameters)
from helpers.small_task import small_data

UPDATES = 5
# Per-update gradient error bound: float32 arithmetic (amp runs in float32 on CPU), fp16 (11-bit significand),
# bf16 (8-bit); measured worst cases over the five models: 8e-8, 2.6e-2, 5.3e-2.
TOLERANCE = {"fp32": 1e-6, "amp": 1e-6, "fp16": 0.06, "fp16-no-flatten-grads": 0.06, "memory-efficient-fp16": 0.06,
             "bf16": 0.15, "bf16-hydra": 0.15, "memory-efficient-bf16": 0.15}
RUN_TOLERANCE = {"fp32": 1e-6, "amp": 1e-6, "fp16": 0.1, "fp16-no-flatten-grads": 0.1, "memory-efficient-fp16": 0.1,
                 "bf16": 0.25, "bf16-hydra": 0.25, "memory-efficient-bf16": 0.25}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


def flat_params(trainer):
    """The optimizer's float32 parameters, in the model's parameter order, as one vector."""
    values = master_params(trainer)
    return torch.cat([values[id(p)].flatten() for p in trainer.model.parameters()])


FP32_RUNS = {}  # model name -> (parameters before, after UPDATES updates) of its float32 run


def fp32_run(data, model_name):
    """The float32 run on the same batches, which every mode of a model compares with: the same for all its modes
    (fairseq's trainer seeds each update: seed + number of updates), so it is trained once per model."""
    if model_name not in FP32_RUNS:
        arch, extra = MODELS[model_name]
        reference, batches = build_trainer(data, arch, extra)
        start = flat_params(reference)
        for _, sample in zip(range(UPDATES), batches):
            reference.train_step([sample])
        FP32_RUNS[model_name] = start, flat_params(reference)
    return FP32_RUNS[model_name]


def cached_update(model_name, num_updates):
    return model_name == "floater-N3" and num_updates % 3 != 0


@pytest.mark.matrix
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_each_parameter_steps_with_its_own_gradient(data, model_name, mode, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    arch, extra = MODELS[model_name]
    flags, overrides = MODES[mode]
    with cpu_fp16_optimizer():
        fp32_start, fp32_end = fp32_run(data, model_name)
        trainer, batches = build_trainer(data, arch, [*flags, *extra], overrides)
        start = flat_params(trainer)
        names = {id(p): name for name, p in trainer.model.named_parameters()}
        theta = {id(p) for p in theta_parameters(trainer.model)}
        largest = 0.0
        for update, sample in zip(range(UPDATES), batches):
            expected = reference_grads(trainer, sample)
            before = master_params(trainer)
            model_before = {id(p): p.detach().clone() for p in trainer.model.parameters()}
            assert trainer.train_step([sample]) is not None and trainer.get_num_updates() == update + 1, \
                f"update {update} was skipped (loss-scale overflow?)"
            got, after = master_grads(trainer), master_params(trainer)

            cached = cached_update(model_name, update)
            for p in trainer.model.parameters():
                name, g, r = names[id(p)], got[id(p)], expected[id(p)]
                assert (r is None) == (id(p) in theta and cached), f"update {update}: {name} float32 gradient"
                if r is None:  # sits out this update: no gradient, not stepped, not moved by momentum
                    assert g is None, f"update {update}: {name} was given a gradient"
                    assert torch.equal(after[id(p)], before[id(p)]), f"update {update}: {name} moved"
                    assert torch.equal(p.detach(), model_before[id(p)]), f"update {update}: {name} moved"
            errors = gradient_errors(got, expected)
            worst = max(errors, key=errors.get)
            largest = max(largest, errors[worst])
            assert errors[worst] <= TOLERANCE[mode], \
                f"update {update}: {names[worst]} gradient off by {errors[worst]:.3g} (relative)"

        # what each run's updates did to the parameters (the low-precision run starts from rounded weights)
        moved, fp32_moved = flat_params(trainer) - start, fp32_end - fp32_start
        off = float((moved - fp32_moved).norm() / fp32_moved.norm())
        print(f"{model_name} {mode}: worst gradient error {largest:.2e}, run off float32 by {off:.2e}")
        assert off <= RUN_TOLERANCE[mode], f"the updates moved the parameters {off:.3g} (relative) off the float32 run"
