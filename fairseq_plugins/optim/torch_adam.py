"""``--optimizer torch_adam``: fairseq's Adam on torch's multi-tensor kernels, for any fairseq 0.12.2 (the release
with ``01-compat.patch`` only as well as this project's).

The step is ``TorchAdam`` (below): fairseq's Adam arithmetic and state layout on torch's fused/foreach AdamW
kernels. The same class is what this project's fairseq builds for ``--optimizer adam --adam-impl torch``
(``04-fused-update.patch``, fairseq/optim/adam.py), kept there for fairseq-train runs without ``--user-dir``;
tests/test_torch_adam_plugin.py holds the two to the same source. The optimizer's gradient norm, clipping and
gradient scaling are one multi-tensor operation each (fairseq's FairseqOptimizer: one kernel per tensor).

Checkpoints: fairseq's trainer resumes an optimizer state only under the class name that wrote it (a float32 run
records its FairseqOptimizer's; --fp16/--bf16/--amp runs their wrapper's), so the optimizer built here is named
``FairseqAdam`` as fairseq's Adam is: the state layout is Adam's, and a checkpoint of either resumes under the
other with its moments and step counts (an unrelated name would make fairseq demand --reset-optimizer).
``--fused-update`` (the trainer's part of the fast update) needs ``04-fused-update.patch`` and is refused in one
line on a fairseq without it.
"""
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from fairseq.optim import adam as fairseq_adam
from fairseq.optim.adam import Adam
from omegaconf import II
from torch.optim.adamw import adamw as torch_adamw  # the kernels TorchAdam steps with

from ..fairseq_check import FAST_UPDATE_PATCH, has_fast_update

KERNELS = {"auto": None, "fused": True, "foreach": False}  # --torch-adam-kernels -> TorchAdam's fused


@dataclass
class TorchAdamConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam optimizer"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for Adam optimizer"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    torch_adam_kernels: ChoiceEnum(list(KERNELS)) = field(
        default="auto",
        metadata={
            "help": "--optimizer torch_adam (fairseq_plugins): fairseq's Adam (its eps, decoupled weight decay and "
            "checkpoint state) stepped by torch's multi-tensor AdamW kernels, its gradient norm, clipping and "
            "scaling one multi-tensor operation each; auto: the fused kernels on CPU and CUDA, foreach "
            "elsewhere. Verified on CPU only (fused and foreach): each update equal to --optimizer adam's to "
            "float rounding in fp32, fp16, bf16 and amp, on this project's fairseq and on the release with "
            "01-compat.patch only; checkpoints resume across the two, Adam's moments bit for bit. Not yet run "
            "on a GPU"
        },
    )
    fused_update: bool = field(
        default=False,
        metadata={
            "help": "as --optimizer adam --fused-update (off by default): the trainer's work around the step in "
            f"multi-tensor operations and without reads of the device; needs {FAST_UPDATE_PATCH} (refused "
            "in one line on a fairseq without it). Verified on CPU only; not yet run on a GPU"
        },
    )
    tpu: bool = II("common.tpu")
    lr: List[float] = II("optimization.lr")


class FairseqAdam(fairseq_adam.FairseqAdam):
    """The optimizer ``--optimizer torch_adam`` builds, under the name of fairseq's Adam (the module's docstring:
    the trainer's resume compares class names); fairseq's FairseqAdam for its lr/betas/eps/weight decay, its
    BMUF averaging and its flat-parameter support."""

    def __init__(self, cfg, params):
        FairseqOptimizer.__init__(self, cfg)  # not FairseqAdam's: it would build its own Adam first
        if getattr(cfg, "tpu", False):
            raise ValueError("--optimizer torch_adam does not run with --tpu (torch's kernels on CPUs and GPUs): "
                             "use --optimizer adam")
        if getattr(cfg, "fused_update", False) and not has_fast_update():
            error = ValueError(f"--fused-update needs {FAST_UPDATE_PATCH} in fairseq, which this one lacks: train "
                               "without it (`make setup` installs the patched fairseq, docs/setup.md)")
            error.one_line = True  # fairseq_plugins' excepthook prints the message alone
            raise error
        self._optimizer = TorchAdam(params, fused=KERNELS[getattr(cfg, "torch_adam_kernels", "auto")],
                                    **self.optimizer_config)

    @property
    def optimizer_config(self):
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        betas = self.cfg.adam_betas
        betas = eval(betas) if isinstance(betas, str) else tuple(betas)
        return {"lr": lr, "betas": betas, "eps": self.cfg.adam_eps, "weight_decay": self.cfg.weight_decay}

    def multiply_grads(self, c):
        """Multiplies grads by a constant *c*: one multi-tensor multiplication (half gradients, of
        --memory-efficient-fp16/bf16, one by one as fairseq does: torch's foreach kernels would round a Python
        number to half first)."""
        grads = [p.grad.data for p in self.params if p.grad is not None]
        if not all(g.dtype == torch.float32 for g in grads):
            return super().multiply_grads(c)
        if grads:
            torch._foreach_mul_(grads, c.to(grads[0].device) if torch.is_tensor(c) else c)

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        """fairseq.utils.clip_grad_norm_ in multi-tensor operations: the same norms, summed as fairseq does."""
        return clip_grad_norm_(self.params, max_norm, aggregate_norm_fn)


@torch.no_grad()
def clip_grad_norm_(params, max_norm, aggregate_norm_fn=None):
    """fairseq.utils.clip_grad_norm_ with its per-tensor norms and its clipping one multi-tensor operation each."""
    params = [params] if torch.is_tensor(params) else list(params)
    with_grad = [p for p in params if p is not None and getattr(p, "grad", None) is not None]
    grads = [p.grad.detach() for p in with_grad if not hasattr(p, "expert")]
    expert_grads = [p.grad.detach() for p in with_grad if hasattr(p, "expert")]
    if not grads:
        return params[0].new_tensor(0.0) if params else torch.tensor(0.0)
    if len(grads) == 1:
        total_norm = torch.norm(grads[0], p=2, dtype=torch.float32)
    else:
        total_norm = torch.norm(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)))
    if aggregate_norm_fn is not None:
        total_norm = aggregate_norm_fn(total_norm)
    if max_norm > 0:
        clip_coef = (float(max_norm) / (total_norm + 1e-6)).clamp_(max=1)
        torch._foreach_mul_(grads + expert_grads, clip_coef)
    return total_norm


@register_optimizer("torch_adam", dataclass=TorchAdamConfig)
class TorchAdamOptimizer(FairseqOptimizer):
    """Registered as ``torch_adam``; builds FairseqAdam above (fairseq's registry wants a class name of its own)."""

    @classmethod
    def build_optimizer(cls, cfg, params):
        return FairseqAdam(cfg, params)


# The step. The same source as fairseq/optim/adam.py's TorchAdam in this project's fairseq (04-fused-update.patch,
# --adam-impl torch), which fairseq-train without --user-dir reaches; tests/test_torch_adam_plugin.py compares them.
class TorchAdam(Adam):
    r"""fairseq's Adam (fairseq.optim.adam.Adam), stepped by torch's multi-tensor AdamW kernels: the fused ones on CPU and CUDA
    (on CPU about 3 times faster than Adam.step for a base Transformer, foreach 1.5 times slower), foreach
    elsewhere; ``fused`` forces one or the other.

    The same arithmetic as Adam.step to float rounding. fairseq divides by :math:`\sqrt{v_t} + \epsilon` and
    steps :math:`lr \sqrt{1-\beta_2^t} / (1-\beta_1^t)`; torch divides by
    :math:`\sqrt{v_t} / \sqrt{1-\beta_2^t} + \epsilon'` and steps :math:`lr / (1-\beta_1^t)`: equal for
    :math:`\epsilon' = \epsilon / \sqrt{1-\beta_2^t}`. That depends on the step count t, so each update steps
    the parameters in sets of equal t (a parameter without a gradient in some updates has a smaller one).
    Weight decay is decoupled in both (``p -= wd * lr * p`` before the update); amsgrad as in Adam.

    The state keeps Adam's layout (``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq`` with amsgrad, ``step`` a
    Python int), so a checkpoint written under one implementation resumes under the other. Parameters or
    gradients not in float32 (--memory-efficient-fp16/bf16: the moments stay float32 for half weights) are
    stepped by Adam.step itself.
    """

    def __init__(
        self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, fused=None
    ):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        self.fused = fused  # None: the fused kernels for CPU and CUDA tensors, foreach for the others
        # --fused-update (trainer.py): a 0-dim float tensor on the device, 1.0 to skip the next step there
        # (a non-finite gradient norm), decided without the host reading it; consumed by step()
        self.found_inf = None

    def can_skip_on_device(self):
        """Whether step() can skip on the device: every parameter float32 on a CPU or CUDA device, stepped by
        torch's fused kernels (which take found_inf)."""
        return self.fused is not False and all(
            p.dtype == torch.float32 and p.device.type in ("cpu", "cuda")
            for group in self.param_groups for p in group["params"]
        )

    @torch.no_grad()
    def step(self, closure=None):
        """Performs a single optimization step.

        Args:
            closure (callable, optional): A closure that reevaluates the model
                and returns the loss.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        found_inf, self.found_inf = self.found_inf, None
        per_param = []  # groups holding the parameters Adam.step updates
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            amsgrad = group.get("amsgrad", False)
            sets = {}  # (step count after this update, fused, device) -> the kernels' lists
            others = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError(
                        "Adam does not support sparse gradients, please consider SparseAdam instead"
                    )
                if p.dtype != torch.float32 or grad.dtype != torch.float32:
                    others.append(p)
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if amsgrad else ("exp_avg", "exp_avg_sq")
                if amsgrad and "max_exp_avg_sq" not in state:
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                for key in keys:  # as Adam.step: the state on the parameter's device and dtype
                    if state[key].dtype != p.dtype or state[key].device != p.device:
                        state[key] = state[key].to(p)
                fused = p.device.type in ("cpu", "cuda") if self.fused is None else self.fused
                t = int(state["step"]) + 1
                lists = sets.setdefault((t, fused, p.device), ([], [], [], [], []))
                for i, x in enumerate((p, grad, *(state[key] for key in keys))):
                    lists[i].append(x)
            for (t, fused, device), (ps, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs) in sets.items():
                # torch's kernels count steps in float32 tensors (on the device for the fused ones), adding 1
                steps = torch.full((len(ps),), t - 1, dtype=torch.float32, device=device if fused else "cpu")
                if found_inf is not None and not fused:
                    raise RuntimeError("TorchAdam: found_inf needs the fused kernels (can_skip_on_device)")
                if group["weight_decay"] != 0:
                    # Adam.step's decay, as it computes it (torch's kernels multiply by 1 - lr * wd rounded to
                    # float32: a relative bias of up to 3e-8 per update, of one sign while the lr stays)
                    alpha = -group["weight_decay"] * group["lr"]
                    if found_inf is None:
                        torch._foreach_add_(ps, ps, alpha=alpha)
                    else:
                        # in place, p + p · alpha (1 - found_inf) with one 0-dim factor: p + alpha · p's values
                        # when found_inf is 0 (the factor is alpha in float32, as add_'s), p itself when 1
                        torch._foreach_addcmul_(ps, ps, [(1.0 - found_inf) * alpha] * len(ps))
                torch_adamw(
                    ps, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, list(steps.unbind()),
                    foreach=not fused, fused=fused, amsgrad=amsgrad, beta1=beta1, beta2=beta2, lr=group["lr"],
                    weight_decay=0.0, eps=group["eps"] / math.sqrt(1 - beta2 ** t), maximize=False,
                    found_inf=found_inf,
                )
                for p in ps:
                    self.state[p]["step"] = t
            if others:
                per_param.append({**group, "params": others})

        if per_param:
            groups, self.param_groups = self.param_groups, per_param
            try:
                Adam.step(self)
            finally:
                self.param_groups = groups
        return loss
