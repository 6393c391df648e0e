"""fairseq's own Trainer, in this process, on CPU, in each of fairseq's precision modes, with a float32 reference
that recomputes every update's gradient from the very weights the update used.

fairseq's FP16Optimizer asks ``torch.cuda.current_device()`` for the device of its flat buffer; on CPU that
answer must be ``None`` (the ``device.index`` of a CPU tensor), which ``cpu_fp16_optimizer`` arranges. With
that, every fairseq optimizer wrapper runs on CPU tensors exactly as on a GPU (fp16 and bf16 arithmetic on
CPU included); only ``--amp`` differs: torch's CUDA autocast and GradScaler do nothing on CPU, so an ``--amp``
run here checks fairseq's AMPOptimizer wrapper in float32 arithmetic.
"""
import copy
from contextlib import contextmanager
from typing import Dict, List, Optional

import torch

from fairseq_plugins.schemes import SCHEMES, by_model
# the optimizer's float32 master weights and their comparison: the speed check's exactness step uses them too
from tooling.bench.exactness import difference, master_params, named_master_params  # noqa: F401

# (mode name, fairseq-train flags, settings that fairseq-hydra-train would give and the flags cannot)
MODES = {
    "fp32": ([], {}),
    "fp16": (["--fp16", "--fp16-init-scale", "16"], {}),
    "fp16-no-flatten-grads": (["--fp16", "--fp16-init-scale", "16", "--fp16-no-flatten-grads"], {}),
    "memory-efficient-fp16": (["--memory-efficient-fp16", "--fp16-init-scale", "16"], {}),
    "bf16": (["--bf16"], {}),
    "bf16-hydra": ([], {"bf16": True}),  # what `fairseq-hydra-train common.bf16=true` builds
    "memory-efficient-bf16": (["--bf16", "--memory-efficient-bf16"], {}),
    "amp": (["--amp"], {}),
}
# every scheme of the table (by its model name: its tiny architecture and flags); FLOATER with its flow solved
# on every update (N=1) and on every third (N=3, cached in between)
MODELS = {
    **{s.model: (s.arch("tiny"), list(s.flags)) for s in SCHEMES.values() if s.model != "floater"},
    "floater-N1": (by_model("floater").arch("tiny"), []),
    "floater-N3": (by_model("floater").arch("tiny"), ["--floater-update-every", "3"]),
}


@contextmanager
def cpu_fp16_optimizer():
    """FP16Optimizer's flat buffer lives on ``torch.cuda.current_device()``: on CPU, device index None."""
    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: None
    try:
        yield
    finally:
        torch.cuda.current_device = saved


def build_trainer(data, arch, flags, common_overrides=None, seed=1, max_tokens=256):
    """fairseq's Trainer for the small toy corpus (as fairseq_cli/train.py builds it) and its batches."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    argv = [str(data / "bin"), "--user-dir", "fairseq_plugins", "--arch", arch, "--share-all-embeddings",
            "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "2e-3", "--lr-scheduler",
            "inverse_sqrt", "--warmup-updates", "4", "--criterion", "label_smoothed_cross_entropy",
            "--label-smoothing", "0.1", "--dropout", "0", "--max-tokens", str(max_tokens), "--seed", str(seed),
            "--cpu", "--num-workers", "0", *flags]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    for key, value in (common_overrides or {}).items():
        cfg.common[key] = value
    utils.import_user_module(cfg.common)
    utils.set_torch_seed(seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=max_tokens, seed=seed,
                                      required_batch_size_multiple=1).next_epoch_itr(shuffle=False)
    return trainer, batches


def master_grads(trainer) -> Dict[int, Optional[torch.Tensor]]:
    """id(model parameter) → the float32 gradient the optimizer stepped it with (None: no gradient)."""
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    opt = trainer.optimizer
    params = list(trainer.model.parameters())
    if isinstance(opt, FP16Optimizer):
        if opt.has_flat_params:  # one buffer; fairseq lays the parameters out in fp16_params order
            (flat,) = opt.fp32_params.values()
            grads, offset = {}, 0
            for p in opt.fp16_params:
                grads[id(p)] = flat.grad[offset: offset + p.numel()].view(p.shape)
                offset += p.numel()
            return grads
        return {id(p): p32.grad for p, p32 in zip(opt.fp16_params, opt.fp32_params)}
    return {id(p): None if p.grad is None else p.grad.float() for p in params}


def reference_grads(trainer, sample) -> Dict[int, Optional[torch.Tensor]]:
    """The float32 gradient of this update, from a float32 copy of the model holding exactly the weights (and
    buffers, caches) the update is about to use, normalised as fairseq's trainer does (÷ sample size)."""
    from fairseq import utils

    model = trainer.model
    ref = copy.deepcopy(model).float()
    ref.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in model.state_dict().items()})
    for p_ref in ref.parameters():
        p_ref.requires_grad_(True)
        p_ref.grad = None
    ref.train()
    ref.set_num_updates(trainer.get_num_updates())
    criterion = trainer.task.build_criterion(trainer.cfg.criterion)
    fp32_sample = trainer._prepare_sample(copy.deepcopy(sample))[0]
    fp32_sample = _to_float(fp32_sample)
    # the update's own random draws (SHAPE's offsets, dropout): Trainer.train_step seeds seed + num_updates
    with utils.set_torch_seed(trainer.cfg.common.seed + trainer.get_num_updates()):
        loss, sample_size, _ = criterion(ref, fp32_sample)
    loss.backward()
    return {id(p): None if p_ref.grad is None else p_ref.grad / sample_size
            for p_ref, p in zip(ref.parameters(), model.parameters())}


def _to_float(sample):
    if torch.is_tensor(sample):
        return sample.float() if sample.is_floating_point() else sample
    if isinstance(sample, dict):
        return {k: _to_float(v) for k, v in sample.items()}
    if isinstance(sample, list):
        return [_to_float(v) for v in sample]
    return sample


def gradient_errors(got: Dict[int, Optional[torch.Tensor]], ref: Dict[int, Optional[torch.Tensor]]):
    """id → ‖g − g_ref‖ / max(‖g_ref‖, 1e-3·‖whole model's g_ref‖) for the parameters both have a gradient for.

    The floor: some gradients are zero in exact arithmetic (a key projection's bias: softmax ignores a shift
    shared by every key), so their float32 reference is rounding noise and only an absolute bound makes sense."""
    total = torch.cat([r.flatten() for r in ref.values() if r is not None]).norm()
    return {k: float((got[k].float() - r).norm() / torch.maximum(r.norm(), 1e-3 * total))
            for k, r in ref.items() if r is not None and got.get(k) is not None}


def theta_parameters(model) -> List[torch.nn.Parameter]:
    """The FLOATER flows' θ (every dynamics parameter); empty for other models."""
    return [p for name, p in model.named_parameters() if ".dynamics." in name]
