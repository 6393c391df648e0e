"""A --bf16 checkpoint resumes with or without --fused-update, under either --adam-impl, Adam's moments kept.

fairseq's --bf16 keeps a float32 master copy per parameter tensor; with --fused-update they are one flat buffer, as
--fp16's are (and --fp16-no-flatten-grads' per tensor). FP16Optimizer.load_state_dict
(third_party/fairseq-0.12.2/04-fused-update.patch) brings a checkpoint's optimizer state into the resuming run's
layout, the moments joined or split in the parameters' order; before, torch refused the other layout ("loaded state
dict contains a parameter group that doesn't match the size of optimizer's group").

- Checkpoints written by fairseq-train (3 updates, --bf16, each of --fused-update on/off x --adam-impl
  fairseq/torch), loaded by fairseq's Trainer under each of the four: every parameter's exp_avg, exp_avg_sq and step
  bit for bit the saved ones. --fp16: flat with or without --fused-update, per tensor with --fp16-no-flatten-grads;
  each loads into the other.
- fairseq-train resumed with the other flag continues bit for bit as when resumed with the checkpoint's own flags:
  every update's logged loss, nll_loss and gnorm, the final weights, Adam's final moments. Bit for bit because without
  --clip-norm the flat and per-tensor updates do the same float32 arithmetic element by element (the gradient norm,
  summed in another order, enters the update only through --clip-norm's coefficient: with it, each update differs
  by rounding, tests/test_fused_update.py).
  Neither resume is bit for bit the uninterrupted run, with either flag: a checkpoint holds the bf16 weights, not
  the float32 master weights, and fairseq restarts the masters from them, losing what the updates moved a weight by
  less than a bf16 rounding step (here the uninterrupted run's weights differ by up to 2.6e-2 of a tensor's largest
  three updates later, its second loss after the resume by 0.05). What the resume does keep, it keeps exactly: the
  first update after it, which reads only the bf16 weights, logs the uninterrupted run's loss, nll_loss and gnorm.
- A per-tensor state that one flat buffer cannot hold (parameters at different step counts) is refused in one line
  naming the flag to resume with.
"""
import re
import shutil

import pytest
import torch

from helpers.precision_harness import build_trainer, cpu_fp16_optimizer
from helpers.small_task import assert_same_model, load, run1, small_data, train_cmd
from helpers.tiny_models import one_thread  # noqa: F401  (autouse fixture)

SAVED_AT, RESUMED_TO = 3, 6
ARCH = "transformer_tiny"
# the --bf16 settings: --fused-update on/off x --adam-impl
BF16 = {f"{'fused' if fused else 'plain'}-{impl}": ["--bf16", *(["--fused-update"] if fused else []),
                                                   "--adam-impl", impl]
        for fused in (True, False) for impl in ("fairseq", "torch")}
FP16 = {"fp16-fused": ["--fp16", "--fused-update"], "fp16-no-flatten": ["--fp16", "--fp16-no-flatten-grads"],
        "fp16": ["--fp16"]}  # the last flat on a GPU: on CPU only in this process (cpu_fp16_optimizer)
FP16_INIT = ["--fp16-init-scale", "16"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


@pytest.fixture(scope="module")
def saved(data, tmp_path_factory):
    """setting -> the save dir of a fairseq-train run of SAVED_AT updates under it (checkpoint_last.pt)."""
    runs = {}

    def get(setting):
        if setting not in runs:
            save = tmp_path_factory.mktemp(setting)
            run1(train_cmd(data, save, ARCH, *flags(setting), "--disable-validation", max_update=SAVED_AT))
            runs[setting] = save
        return runs[setting]
    return get


def flags(setting):
    return BF16[setting] if setting in BF16 else [*FP16[setting], *FP16_INIT]


def per_parameter(state, shapes):
    """An optimizer state dict's state as one {key: value} per parameter tensor, whichever its layout: flat (one
    entry for all, in the parameters' order) or per tensor."""
    (group,) = state["param_groups"]
    entries = [state["state"][i] for i in group["params"]]
    if len(entries) == len(shapes):
        return entries
    (flat,) = entries
    sizes = [s.numel() for s in shapes]
    out = [{} for _ in shapes]
    for key, value in flat.items():
        parts = value.split(sizes) if torch.is_tensor(value) and value.dim() == 1 else [value] * len(shapes)
        for entry, part, shape in zip(out, parts, shapes):
            entry[key] = part.view(shape) if torch.is_tensor(part) else part
    return out


def is_flat(state):
    return len(state["param_groups"][0]["params"]) == 1


def assert_same_state(want, got, shapes, names):
    want, got = per_parameter(want, shapes), per_parameter(got, shapes)
    for name, a, b in zip(names, want, got):
        assert a.keys() == b.keys() and {"exp_avg", "exp_avg_sq", "step"} <= set(a), name
        for key in a:
            same = torch.equal(a[key], b[key]) if torch.is_tensor(a[key]) else a[key] == b[key]
            assert same, f"{name}: {key} differs"


def resumed_trainer(data, setting, checkpoint):
    trainer, _ = build_trainer(data, ARCH, flags(setting))
    trainer.load_checkpoint(str(checkpoint))
    assert trainer.get_num_updates() == SAVED_AT
    return trainer


def shapes_and_names(trainer):
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    return [p.shape for p in trainer.optimizer.fp16_params], [names[id(p)] for p in trainer.optimizer.fp16_params]


@pytest.mark.parametrize("saved_as", list(BF16))
def test_a_bf16_checkpoint_loads_with_its_moments_under_every_setting(data, saved, saved_as):
    checkpoint = saved(saved_as) / "checkpoint_last.pt"
    want = load(checkpoint)["last_optimizer_state"]
    assert is_flat(want) == ("--fused-update" in BF16[saved_as])
    for setting in BF16:
        trainer = resumed_trainer(data, setting, checkpoint)
        got = trainer.optimizer.state_dict()
        assert is_flat(got) == trainer.optimizer.has_flat_params == ("--fused-update" in BF16[setting])
        shapes, names = shapes_and_names(trainer)
        assert_same_state(want, got, shapes, names)
        assert per_parameter(got, shapes)[0]["step"] == SAVED_AT


@pytest.mark.parametrize("saved_as,resumed_as", [("fp16-fused", "fp16-no-flatten"), ("fp16-no-flatten", "fp16-fused"),
                                                 ("fp16-fused", "fp16"), ("fp16-no-flatten", "fp16")])
def test_an_fp16_checkpoint_loads_with_its_moments_flat_or_not(data, saved, saved_as, resumed_as):
    checkpoint = saved(saved_as) / "checkpoint_last.pt"
    want = load(checkpoint)
    with cpu_fp16_optimizer():
        trainer = resumed_trainer(data, resumed_as, checkpoint)
    got = trainer.optimizer.state_dict()
    assert is_flat(got) == (resumed_as != "fp16-no-flatten") and is_flat(want["last_optimizer_state"]) == (
        saved_as == "fp16-fused")
    assert got["loss_scale"] == want["last_optimizer_state"]["loss_scale"]
    assert_same_state(want["last_optimizer_state"], got, *shapes_and_names(trainer))


def test_a_state_one_buffer_cannot_hold_is_refused_in_one_line(data, saved):
    """Per-tensor moments at different step counts (as FLOATER's θ has, which keeps per-tensor masters for that)
    would need one step count per element of the flat buffer."""
    state = load(saved("plain-fairseq") / "checkpoint_last.pt")["last_optimizer_state"]
    state["state"][3]["step"] = SAVED_AT - 1
    trainer, _ = build_trainer(data, ARCH, flags("fused-fairseq"))
    with pytest.raises(ValueError) as error:
        trainer.optimizer.load_state_dict(state)
    message = str(error.value)
    assert "\n" not in message and getattr(error.value, "one_line", False)
    assert "resume without --fused-update" in message and "--reset-optimizer" in message, message


def updates(log):
    """{update: (loss, nll_loss, gnorm) as logged} from the --log-interval 1 train_inner lines."""
    lines = re.findall(r"train_inner \| epoch \d+:.*? loss=([-0-9.]+), nll_loss=([-0-9.]+),.*?num_updates=(\d+),"
                       r".*?gnorm=([-0-9.]+),", log)
    return {int(n): (loss, nll, gnorm) for loss, nll, n, gnorm in lines}


def resume(data, saved_dir, save, setting):
    shutil.copytree(saved_dir, save)
    log = run1(train_cmd(data, save, ARCH, *flags(setting), "--disable-validation", max_update=RESUMED_TO)).stdout
    assert re.search(rf"Loaded checkpoint \S*checkpoint_last\.pt \(epoch 1 @ {SAVED_AT} updates\)", log), log[-3000:]
    return updates(log), load(save / "checkpoint_last.pt")


@pytest.mark.parametrize("saved_as,resumed_as", [
    ("fused-fairseq", "plain-fairseq"), ("plain-fairseq", "fused-fairseq"),
    pytest.param("fused-torch", "plain-torch", marks=pytest.mark.slow),
    pytest.param("plain-torch", "fused-torch", marks=pytest.mark.slow)])
def test_resumed_with_the_other_flag_training_continues_as_with_its_own(data, saved, tmp_path, saved_as, resumed_as):
    saved_dir = saved(saved_as)
    other, other_ckpt = resume(data, saved_dir, tmp_path / "other", resumed_as)
    own, own_ckpt = resume(data, saved_dir, tmp_path / "own", saved_as)
    assert sorted(other) == sorted(own) == list(range(SAVED_AT + 1, RESUMED_TO + 1))
    assert other == own
    assert_same_model(tmp_path / "own" / "checkpoint_last.pt", tmp_path / "other" / "checkpoint_last.pt")
    trainer, _ = build_trainer(data, ARCH, flags(resumed_as))
    assert_same_state(own_ckpt["last_optimizer_state"], other_ckpt["last_optimizer_state"], *shapes_and_names(trainer))
    assert is_flat(own_ckpt["last_optimizer_state"]) != is_flat(other_ckpt["last_optimizer_state"])

    # the uninterrupted run with the resumed flags: the first update after the resume reads only the bf16 weights
    save = tmp_path / "uninterrupted"
    uninterrupted = updates(run1(train_cmd(data, save, ARCH, *flags(resumed_as), "--disable-validation",
                                           max_update=RESUMED_TO)).stdout)
    assert uninterrupted[SAVED_AT + 1] == other[SAVED_AT + 1]
    # from there on the masters restarted from the bf16 weights tell (the module's docstring): shown, not bounded
    whole, model = load(save / "checkpoint_last.pt")["model"], other_ckpt["model"]
    off = max(float((whole[k].float() - model[k].float()).abs().max() / whole[k].float().abs().max().clamp_min(1e-30))
              for k in whole if whole[k].is_floating_point() and not k.endswith("._float_tensor"))
    loss_off = abs(float(uninterrupted[SAVED_AT + 2][0]) - float(other[SAVED_AT + 2][0]))
    print(f"{saved_as} -> {resumed_as}: the uninterrupted run's weights {off:.2g} off (of a tensor's largest), "
          f"its loss at update {SAVED_AT + 2} {loss_off:.3f}")
