"""Which fairseq the plugins run on, and what they refuse on one without this project's patch.

``third_party/fairseq-0.12.2/03-plugin-hooks.patch`` adds ``fairseq.plugins_patch`` (its ``VERSION``), and applies only
after ``02-fixes.patch``, whose FP16Optimizer hunks the marker vouches for too; the PyPI release, fairseq's GitHub main
and their forks lack it, and all of them report version 0.12.2. Without those parts fairseq trains these silently
wrong, so ``unpatched_refusal`` names them and the model refuses its first training forward:
- FP16Optimizer (``--fp16``/``--bf16`` without ``--amp`` or ``--memory-efficient-*``) with parameters that sit out
  updates (``may_skip_update``: FLOATER's ``--floater-update-every N > 1``, ``--floater-cache-whole-bias``): its
  flat gradients skip them without advancing the offset, so every later parameter's gradient lands in another's
  slice; without flat gradients they get a zero gradient that Adam's momentum still acts on;
- ``--floater-shared-solve`` under ``--ddp-backend legacy_ddp`` on several processes: stock legacy_ddp never calls
  the model's ``all_reduce_grads``, so θ and b(0) never get their gradient.
The refusal waits for training because decoding builds the same model from a checkpoint's training flags, and it
judges what that forward runs on, not only the flags the model was built with: FP16Optimizer is in use only where
the trainer made the model half (a checkpoint trained with ``--fp16``, loaded into one's own fp32 loop, is not), and
the processes are ``torch.distributed``'s (torchrun and Slurm start one per GPU, which the parsed arguments of
fairseq-train do not count).
Stock 0.12.2's BetterTransformer fast path, which bypasses the plugins' attention after a checkpoint load, is kept
off by the plugins' own encoder layers, patched or not (``models/position_transformer.py``)."""
import logging

import torch
from omegaconf import OmegaConf

logger = logging.getLogger(__name__)

PATCH_VERSION = 1  # the VERSION of fairseq/plugins_patch.py that this code relies on
FAST_UPDATE_PATCH = "third_party/fairseq-0.12.2/04-fused-update.patch"
FAST_UPDATE_FLAGS = ("--fused-update", "--adam-impl")  # what only that part adds to fairseq


def patch_version():
    """The patch's VERSION in the fairseq imported here, or None for a fairseq without it."""
    try:
        from fairseq import plugins_patch
    except ImportError:
        return None
    return getattr(plugins_patch, "VERSION", None)


def patched():
    return (patch_version() or 0) >= PATCH_VERSION


def has_fast_update():
    """Whether the fairseq imported here has 04-fused-update.patch (its flags are fields of Adam's config)."""
    from fairseq.optim.adam import FairseqAdamConfig

    return "fused_update" in getattr(FairseqAdamConfig, "__dataclass_fields__", {})


def refuse_fast_update_flags(argv):
    """On a fairseq without 04-fused-update.patch, a command line with its flags: one line naming the part (fairseq's
    parser, which runs after the plugins' import, would only call them unrecognized arguments)."""
    if has_fast_update():
        return
    given = sorted({a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in FAST_UPDATE_FLAGS})
    if given:
        error = UnpatchedFairseq(f"{' and '.join(given)} {'need' if len(given) > 1 else 'needs'} {FAST_UPDATE_PATCH}, "
                                 f"which {describe()} lacks: train without {'them' if len(given) > 1 else 'it'} "
                                 "(--optimizer torch_adam runs torch's Adam there) or `make setup` (docs/setup.md)")
        raise error


def describe():
    """'fairseq 0.12.2 at /path (...)': which fairseq this is, in the words the messages use."""
    import fairseq

    version = patch_version()
    state = ("with this project's patch" if patched() else
             "without this project's patch" if version is None else f"with an older patch (version {version})")
    return f"fairseq {fairseq.__version__} at {fairseq.__path__[0]} ({state})"


def log_once():
    """At import, on a fairseq without the patch: one line naming what is refused there."""
    if patched() or getattr(log_once, "done", False):
        return
    log_once.done = True
    logger.warning(f"{describe()}: refused there, since it would train them wrong: FLOATER's cached updates "
                   "(--floater-update-every N > 1, --floater-cache-whole-bias) with --fp16/--bf16 unless --amp or "
                   "--memory-efficient-fp16/bf16, and --floater-shared-solve with --ddp-backend legacy_ddp on "
                   "several processes; `make setup` installs the patched fairseq (docs/setup.md, 'Your own fairseq')")


def settings_reader(args):
    """A reader of the run's settings from the model's args: fairseq-train hands the model its whole flat
    Namespace; fairseq-hydra-train a node of the whole config, whose parent holds common and distributed_training."""
    if OmegaConf.is_config(args):
        root = args._get_parent()
        return lambda section, key: None if root is None else OmegaConf.select(root, f"{section}.{key}")
    return lambda section, key: getattr(args, key, None)


def data_parallel_world(get):
    """The processes training together: torch.distributed's once it runs, else the configured world size."""
    import torch.distributed as dist

    configured = get("distributed_training", "distributed_world_size") or 1
    return max(configured, dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1)


def unpatched_refusal(get, args, model):
    """One line naming the flags that fairseq without the patch would train wrong for this model, or None (get:
    settings_reader of the args the model's build was handed; args: them as a Namespace). Called at the first
    training forward: the model's dtype and the process group are then the training's."""
    if patched():
        return None
    skips = any(getattr(p, "may_skip_update", False) for p in model.parameters())
    reasons = []
    half = get("common", "fp16") or get("common", "bf16")
    efficient = get("common", "memory_efficient_fp16") or get("common", "memory_efficient_bf16")
    # FP16Optimizer trains a model the trainer made half; a checkpoint's --fp16 in one's own fp32 loop is harmless
    halved = any(p.dtype in (torch.float16, torch.bfloat16) for p in model.parameters())
    if skips and half and halved and not efficient and not get("common", "amp"):
        flag = "--bf16" if get("common", "bf16") else "--fp16"
        flat = not get("common", "bf16") and not get("common", "fp16_no_flatten_grads")
        harm = ("its flat gradients would hand every parameter after the flow's the gradient of another on every "
                "cached update" if flat else "the flow's parameters would get a zero gradient on every cached update, "
                "which Adam's momentum still acts on")
        cached = [f for f, on in (("--floater-update-every %s" % getattr(args, "floater_update_every", None),
                                   (getattr(args, "floater_update_every", None) or 1) > 1),
                                  ("--floater-cache-whole-bias", getattr(args, "floater_cache_whole_bias", False)))
                  if on]
        reasons.append(f"{flag} with {' '.join(cached) or 'parameters that sit out updates'} ({harm}); "
                       f"--amp or --memory-efficient-{flag[2:]} train it right there")
    world = data_parallel_world(get)
    backend = get("distributed_training", "ddp_backend")
    if getattr(args, "floater_shared_solve", False) and backend in ("legacy_ddp", "no_c10d") and world > 1:
        # where pytorch_ddp works: this fairseq's hands DistributedDataParallel a CUDA device, so not on CPU
        there = ("on CPU (gloo) this fairseq's --ddp-backend pytorch_ddp cannot start (it hands "
                 "DistributedDataParallel a device): train without --floater-shared-solve here"
                 if get("common", "cpu") else "--ddp-backend pytorch_ddp trains it right there, on GPUs")
        reasons.append(f"--floater-shared-solve with --ddp-backend {backend} on {world} processes (its legacy_ddp "
                       f"never calls the model's all_reduce_grads, so θ and b(0) would never get their gradient); "
                       f"{there}")
    if not reasons:
        return None
    return (f"{describe()} would train this wrong: {'; and '.join(reasons)}. `make setup` installs the patched "
            "fairseq (docs/setup.md, 'Your own fairseq')")


class UnpatchedFairseq(RuntimeError):
    one_line = True  # fairseq_plugins' excepthook prints the message alone
