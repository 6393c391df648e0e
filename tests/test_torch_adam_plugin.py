"""`--optimizer torch_adam` (fairseq_plugins/optim/torch_adam.py): fairseq's Adam on torch's multi-tensor kernels
from the user dir, with its gradient norm, clipping and scaling in multi-tensor operations.

- Its step is the source of fairseq's TorchAdam (`--adam-impl torch`, 04-fused-update.patch), which
  tests/test_adam_impl.py holds to fairseq's Adam; the wrapper's norm, clipping and scaling are fairseq's to float
  rounding, in foreach operations.
- fairseq's Trainer with it, in lockstep with `--optimizer adam` (tests/test_adam_impl.py's harness and bound),
  on this project's fairseq and on the stock-equivalent one (the release with 01-compat.patch only), where
  fairseq-train trains with it, and where `--fused-update`/`--adam-impl` are refused in one line naming the part.
- A fairseq-train checkpoint of either optimizer resumes under the other with Adam's exp_avg, exp_avg_sq and step
  bit for bit (fairseq's trainer compares the optimizer's class name on resume).
- A step skipped on the device (found_inf) with weight decay: the values of the step without it when found_inf is 0,
  nothing moved when 1, and no per-parameter copy (counted: the elements of every tensor the step allocates).
"""
import inspect
import re
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from conftest import REPO
from helpers.precision_harness import MODES, build_trainer, cpu_fp16_optimizer, difference, named_master_params
from helpers.small_task import load, run1, small_data, train_cmd
from helpers.tiny_models import one_thread  # noqa: F401  (autouse fixture)
from test_own_fairseq import on, stock  # noqa: F401  (the stock-equivalent fairseq's fixture)

ROUNDING = 1e-6  # tests/test_adam_impl.py's bound: each update's largest difference relative to a tensor's largest
UPDATES = 6
COMMON = ["--update-freq", "2", "--clip-norm", "0.5", "--weight-decay", "0.01"]
PATCH = "third_party/fairseq-0.12.2/04-fused-update.patch"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


def plugin():
    from fairseq_plugins.optim import torch_adam

    return torch_adam


def test_the_step_is_fairseqs_torch_adam_source():
    from fairseq.optim import adam

    assert inspect.getsource(plugin().TorchAdam) == inspect.getsource(adam.TorchAdam)


def test_norm_clipping_and_scaling_are_fairseqs_in_foreach_operations():
    from fairseq import utils

    runs = []
    for own in (False, True):
        g = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(i)))
                  for i, s in enumerate([(64, 32), (32,), (7, 3, 5)])]
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        seen = []
        with OpNames(seen):
            norm = plugin().clip_grad_norm_(params, 0.5) if own else utils.clip_grad_norm_(params, 0.5)
        runs.append((norm, [p.grad.clone() for p in params], seen))
    (want_norm, want, _), (got_norm, got, ops) = runs
    assert float((want_norm - got_norm).abs()) <= ROUNDING * float(want_norm)
    assert all(float((a - b).abs().max()) <= ROUNDING * float(a.abs().max()) for a, b in zip(want, got))
    assert ops.count("_foreach_norm") == 1 and ops.count("_foreach_mul_") == 1 and "linalg_vector_norm" in ops
    assert ops.count("linalg_vector_norm") == 1  # the norm of the stacked norms, not one a gradient


class OpNames(TorchDispatchMode):
    def __init__(self, names):
        super().__init__()
        self.names = names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_the_flags_are_listed_with_what_was_verified_where():
    from fairseq import options

    parser = options.get_training_parser()
    options.parse_args_and_arch(parser, ["data", "--user-dir", "fairseq_plugins", "--arch", "transformer_tiny",
                                         "--optimizer", "torch_adam"])
    text = " ".join(parser.format_help().split())
    kernels = text.split("--torch-adam-kernels {auto,fused,foreach}")[-1].split(" --fused-update ", 1)[0]
    assert "Verified on CPU only" in kernels and "Not yet run on a GPU" in kernels and "01-compat.patch" in kernels
    fused = text.split("--fused-update ")[-1].split("Not yet run on a GPU", 1)[0]  # the last: its help
    assert "off by default" in fused and PATCH in fused and "Verified on CPU only" in fused
    assert parser.get_default("torch_adam_kernels") == "auto" and parser.get_default("fused_update") is False


# ---- fairseq's Trainer, in lockstep with --optimizer adam ---------------------------------------------------------

def lockstep(data, mode, updates=UPDATES):
    """Two Trainers on the same batches, --optimizer adam and --optimizer torch_adam; after each update the second
    takes the first's state (tests/test_adam_impl.py's sync). Returns the largest difference of an update."""
    from test_adam_impl import step_counts, sync, update

    flags, overrides = MODES[mode]
    pair = []
    for optimizer in ("adam", "torch_adam"):
        tr, batches = build_trainer(data, "transformer_tiny", [*flags, *COMMON, "--optimizer", optimizer], overrides)
        pair.append((tr, iter(batches)))
    (want, want_batches), (got, got_batches) = pair
    opt = got.optimizer.optimizer
    assert type(opt).__module__ == "fairseq_plugins.optim.torch_adam" and type(opt).__name__ == "TorchAdam"
    assert type(want.optimizer).__name__ == type(got.optimizer).__name__  # what a resume compares
    largest = 0.0
    for _ in range(updates):
        update(want, want_batches)
        update(got, got_batches)
        largest = max(largest, difference(named_master_params(want), named_master_params(got)))
        assert step_counts(want) == step_counts(got)
        sync(want, got)
    return largest


@pytest.mark.parametrize("mode", ["fp32", "fp16", "bf16", "amp"])
def test_each_update_is_fairseqs_adams_on_this_fairseq(data, mode):
    with cpu_fp16_optimizer():
        off = lockstep(data, mode)
    print(f"{mode}: updates differ by at most {off:.2e} (relative)")
    assert off <= ROUNDING


def stock_python(stock_dir, code):
    """`python -c code` with the stock-equivalent fairseq first on the path (and tests/ for the harness)."""
    proc = on(stock_dir, [sys.executable, "-c", f"import sys; sys.path[:0] = [{str(REPO / 'tests')!r}]\n{code}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_each_update_is_fairseqs_adams_on_the_stock_fairseq(stock, data):
    out = stock_python(stock, (
        "import fairseq, fairseq_plugins\n"
        "from fairseq_plugins import fairseq_check\n"
        "from helpers.precision_harness import cpu_fp16_optimizer\n"
        "from test_torch_adam_plugin import lockstep\n"
        "from pathlib import Path\n"
        "assert not fairseq_check.has_fast_update()\n"
        "print(fairseq.__file__)\n"
        "with cpu_fp16_optimizer():\n"
        f"    print(*(lockstep(Path({str(data)!r}), m) for m in ('fp32', 'fp16')))\n"))
    where, fp32, fp16 = out.split()[-3:]  # (the release's --bf16 means a TPU)
    assert where == str(stock / "fairseq" / "__init__.py")
    print(f"stock fairseq: fp32 {float(fp32):.2e}, fp16 {float(fp16):.2e} (relative)")
    assert float(fp32) <= ROUNDING and float(fp16) <= ROUNDING


def stock_train(stock_dir, data, save, *extra):
    cmd = train_cmd(data, save, "transformer_tiny", "--disable-validation", *extra, max_update=3)
    return on(stock_dir, [sys.executable, "-m", "fairseq_cli.train", *cmd[1:]])


def test_fairseq_train_trains_with_it_on_the_stock_fairseq(stock, data, tmp_path):
    proc = stock_train(stock, data, tmp_path / "ckpt", "--optimizer", "torch_adam", "--weight-decay", "0.01")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "num_updates=3," in log, log[-3000:]
    assert "04-fused-update" not in log and "fairseq_plugins.optim" not in log  # nothing said about it there
    assert load(tmp_path / "ckpt" / "checkpoint_last.pt")["cfg"]["optimizer"]["_name"] == "torch_adam"


@pytest.mark.parametrize("flags,says", [
    (["--optimizer", "torch_adam", "--fused-update"], "--fused-update needs " + PATCH),
    (["--adam-impl", "torch"], "--adam-impl needs " + PATCH),
    (["--fused-update", "--adam-impl", "torch"], "--adam-impl and --fused-update need " + PATCH),
], ids=["torch_adam-fused-update", "adam-impl", "adam-fused-update"])
def test_the_fast_update_flags_are_refused_in_one_line_on_the_stock_fairseq(stock, data, tmp_path, flags, says):
    proc = stock_train(stock, data, tmp_path / "ckpt", *flags)
    last = (proc.stdout + proc.stderr).strip().splitlines()[-1]
    assert proc.returncode != 0 and says in last and "`make setup`" in last, last
    assert "num_updates=" not in proc.stdout + proc.stderr


# ---- resume across --optimizer adam and --optimizer torch_adam ---------------------------------------------------

def optimizer_flags(optimizer):
    return ["--optimizer", optimizer, "--weight-decay", "0.01"]


@pytest.mark.parametrize("saved_as,resumed_as", [("adam", "torch_adam"), ("torch_adam", "adam")])
def test_a_checkpoint_resumes_under_the_other_with_adams_state(data, tmp_path, saved_as, resumed_as):
    save = tmp_path / "ckpt"
    run1(train_cmd(data, save, "transformer_tiny", "--disable-validation", *optimizer_flags(saved_as), max_update=3))
    saved = load(save / "checkpoint_last.pt")
    assert saved["cfg"]["optimizer"]["_name"] == saved_as
    want = saved["last_optimizer_state"]

    trainer, _ = build_trainer(data, "transformer_tiny", optimizer_flags(resumed_as))
    trainer.load_checkpoint(str(save / "checkpoint_last.pt"))
    assert trainer.get_num_updates() == 3
    got = trainer.optimizer.state_dict()
    assert sorted(want["state"]) == sorted(got["state"]) and len(got["state"]) > 10
    for i, entry in want["state"].items():
        assert set(entry) == set(got["state"][i]) == {"step", "exp_avg", "exp_avg_sq"}
        assert type(got["state"][i]["step"]) is int and got["state"][i]["step"] == entry["step"] == 3
        assert all(torch.equal(entry[k], got["state"][i][k]) for k in ("exp_avg", "exp_avg_sq")), i

    # and fairseq-train resumes so: the checkpoint's state, not a reset one (which --reset-optimizer would give)
    log = run1(train_cmd(data, save, "transformer_tiny", "--disable-validation", *optimizer_flags(resumed_as),
                         max_update=5)).stdout
    assert re.search(r"Loaded checkpoint \S*checkpoint_last\.pt \(epoch 1 @ 3 updates\)", log), log[-3000:]
    resumed = load(save / "checkpoint_last.pt")
    assert resumed["cfg"]["optimizer"]["_name"] == resumed_as
    assert {s["step"] for s in resumed["last_optimizer_state"]["state"].values()} == {5}


# ---- the step skipped on the device -------------------------------------------------------------------------------

class FreshElements(TorchDispatchMode):
    """The elements of every tensor an operator allocates (an output sharing no storage with its inputs)."""

    def __init__(self):
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        self.elements += sum(t.numel() for t in tree_leaves(out)
                             if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs)
        return out


def skipping_step(cls, found_inf, count=None, steps=2):
    """Weights and moments after `steps` steps of cls with weight decay, the second given found_inf (and counted)."""
    g = torch.Generator().manual_seed(2)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in [(64, 32), (32,), (7, 3, 5), (100,)]]
    opt = cls(params, lr=1e-2, betas=(0.9, 0.98), weight_decay=0.01)
    for n in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g) * 1e-3
        if n == 1:
            opt.found_inf = found_inf
            assert opt.can_skip_on_device()
            with count or FreshElements():
                opt.step()
        else:
            opt.step()
    state = [(opt.state[p]["exp_avg"].clone(), opt.state[p]["exp_avg_sq"].clone()) for p in params]
    return [p.detach().clone() for p in params], state


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(tree_leaves(a), tree_leaves(b)))


@pytest.mark.parametrize("where", ["plugins", "fairseq"])
def test_a_skipped_step_moves_nothing_and_copies_no_parameter(where):
    from fairseq.optim import adam

    cls = plugin().TorchAdam if where == "plugins" else adam.TorchAdam
    plain = skipping_step(cls, None)
    count = FreshElements()
    kept = skipping_step(cls, torch.tensor(0.0), count=count)
    # found_inf 0: bit for bit the step without found_inf (whose decay is p + alpha · p, as it was with the copy)
    assert same(plain, kept)
    # allocated by that step: the step counts and the 0-dim factor, no copy of the 2,000-odd weights
    print(f"{where}: the step with found_inf allocates {count.elements} elements")
    assert count.elements < 16
    # found_inf 1: the weights and moments of the first step, bit for bit
    first = skipping_step(cls, None, steps=1)
    assert same(first, skipping_step(cls, torch.tensor(1.0))) and not same(first, plain)
