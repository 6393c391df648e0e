#!/usr/bin/env python3
"""Warm start FLOATER from a trained Transformer (Liu et al. 2020, §3.3 and Appendix B).

    python scripts/transformer_to_floater.py IN.pt OUT.pt [--arch floater_...] [--floater-... options]

IN is a fairseq checkpoint of a `transformer` architecture; OUT is a `floater_transformer` checkpoint of the
same dimensions whose translations are *identical* to IN's:

1. every weight is copied; each attention q/k/v bias becomes that block's initial value b^(n)(0);
2. the flows are new, with their output layer at zero: h ≡ 0, so b^(n)(t) ≡ b^(n)(0) and the model computes
   exactly what the Transformer computed (paper eq. 12 with h ≡ 0);
3. the checkpoint's model config is switched to the floater arch (default: floater_<IN's arch>, else
   floater_transformer) with its FLOATER defaults or the options given here;
4. the optimizer state, the update counter and the data position are dropped: OUT starts a new training phase.

The paper's protocol: train the Transformer (30 epochs), convert, continue with FLOATER at half the peak learning
rate (base En-De 7e-4 → 3.5e-4) for 10 epochs (En-Fr: 1), average the last 5 checkpoints. Continue with

    fairseq-train DATA --user-dir fairseq_plugins --arch floater_transformer_wmt_en_de \\
        --finetune-from-model OUT.pt ...          # (or --restore-file OUT.pt --reset-optimizer
                                                  #  --reset-dataloader --reset-meters --reset-lr-scheduler)

OUT is written atomically (a temporary file in OUT's directory, then a rename).
"""
import argparse
import copy
import os
from pathlib import Path

from fairseq import checkpoint_utils, utils
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.models.transformer import TransformerModel
from omegaconf import OmegaConf

from tooling.atomic import save_torch

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))
from fairseq_plugins.flags import add_flags  # noqa: E402
from fairseq_plugins.models.position_transformer import PositionTransformerModel  # noqa: E402
from fairseq_plugins.modules.floater import Floater, FloaterFlow  # noqa: E402
from fairseq_plugins.schemes import SCHEMES, SIZES  # noqa: E402

DIMS = ("encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_layers", "encoder_attention_heads",
        "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_layers", "decoder_attention_heads")


class ConversionError(Exception):
    """A one-line reason the conversion cannot go on."""


def load_transformer(path):
    """The checkpoint and its model args (argparse.Namespace); fails unless it is a fairseq `transformer`."""
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: no such file")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as err:  # unpickling, zip and upgrade errors alike
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConversionError(f"{path}: not a readable fairseq checkpoint ({type(err).__name__}: {reason})")
    if state.get("cfg") is not None:
        model_args = state["cfg"]["model"]
    else:
        model_args = state.get("args")
    if OmegaConf.is_config(model_args):
        model_args = argparse.Namespace(**OmegaConf.to_container(model_args, resolve=True))
    if not isinstance(model_args, argparse.Namespace) or "model" not in state:
        raise ConversionError(f"{path}: no model and model config in this checkpoint")
    arch = getattr(model_args, "arch", None) or getattr(model_args, "_name", None)
    if ARCH_MODEL_REGISTRY.get(arch) is not TransformerModel:
        kind = getattr(ARCH_MODEL_REGISTRY.get(arch), "__name__", "unknown model")
        raise ConversionError(f"{path}: arch {arch!r} ({kind}) is not a fairseq `transformer` architecture")
    return state, model_args, arch


def floater_args(model_args, arch, target_arch, options):
    """IN's model args switched to the floater arch: same dimensions, FLOATER options and defaults added."""
    target_arch = target_arch or (f"floater_{arch}" if f"floater_{arch}" in ARCH_MODEL_REGISTRY
                                  else "floater_transformer")
    if target_arch not in {SCHEMES["floater"].arch(size) for size in SIZES}:
        raise ConversionError(f"--arch {target_arch!r} is not a floater_transformer architecture")
    reference = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[target_arch](reference)
    different = [f"{d} {getattr(reference, d)} vs {getattr(model_args, d, None)}" for d in DIMS
                 if getattr(reference, d) != getattr(model_args, d, None)]
    if different and target_arch != "floater_transformer":
        raise ConversionError(f"--arch {target_arch} does not have the input's dimensions ({', '.join(different)})")
    args = copy.copy(model_args)
    for name in [n for n in vars(args) if n.startswith("floater_")]:
        delattr(args, name)
    args.arch = args._name = target_arch
    for name, value in vars(options).items():
        setattr(args, name, value)
    ARCH_CONFIG_REGISTRY[target_arch](args)  # FLOATER defaults; dimensions are IN's
    return args


class _Dictionaries:
    """A stand-in task: dictionaries of the checkpoint's vocabulary sizes (their symbols play no part)."""

    def __init__(self, model_state, shared):
        def sized(n):
            d = Dictionary()
            while len(d) < n:
                d.add_symbol(f"madeupword{len(d):05d}")
            return d

        self.source_dictionary = sized(model_state["encoder.embed_tokens.weight"].size(0))
        self.target_dictionary = (self.source_dictionary if shared
                                  else sized(model_state["decoder.embed_tokens.weight"].size(0)))


def convert_model_state(model_state, args):
    """The floater model's state: IN's tensors, plus flows with h ≡ 0 and update counters at 0."""
    task = _Dictionaries(model_state, shared=getattr(args, "share_all_embeddings", False))
    try:
        model = PositionTransformerModel.build_model(copy.copy(args), task)
    except ValueError as err:
        raise ConversionError(str(err))
    result = model.load_state_dict(model_state, strict=False, model_cfg=args)
    flow_keys = {k for k in model.state_dict() if ".position_scheme." in k}
    if result.unexpected_keys or set(result.missing_keys) - flow_keys:
        raise ConversionError("the checkpoint's weights do not fit the floater model (missing: "
                              f"{sorted(set(result.missing_keys) - flow_keys)[:3]}, "
                              f"unexpected: {sorted(result.unexpected_keys)[:3]})")
    for module in model.modules():
        if isinstance(module, FloaterFlow):
            module.dynamics.zero_output_()
            module.set_num_updates(0)
    return model.state_dict()


def convert(src, dst, target_arch=None, options=None):
    state, model_args, arch = load_transformer(src)
    args = floater_args(model_args, arch, target_arch, options or argparse.Namespace())
    model_state = convert_model_state(state["model"], args)
    last = (state.get("optimizer_history") or [{}])[-1]
    out = {
        "args": None,
        "cfg": None,
        "model": model_state,
        "criterion": state.get("criterion"),
        # a new training phase: no optimizer state, update 0, epoch 1 from the start
        "optimizer_history": [{"criterion_name": last.get("criterion_name", "CrossEntropyCriterion"),
                               "optimizer_name": last.get("optimizer_name", "FairseqAdam"),
                               "lr_scheduler_state": {}, "num_updates": 0}],
        "task_state": state.get("task_state") or {},
        "extra_state": {"train_iterator": {"version": 2, "epoch": 1, "iterations_in_epoch": 0, "shuffle": True}},
    }
    if state.get("cfg") is not None:
        cfg = OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True)
        cfg["model"] = args
        out["cfg"] = cfg
    else:  # pre-0.10 checkpoints keep one flat argparse namespace
        full = copy.copy(state["args"])
        vars(full).update(vars(args))
        out["args"] = full
    folder = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(folder):
        raise ConversionError(f"{dst}: directory {folder} does not exist")
    save_torch(out, dst)
    return args


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Convert a trained fairseq transformer checkpoint into an equivalent floater_transformer one "
                    "(FLOATER warm start: flows start at h ≡ 0, outputs are identical).")
    parser.add_argument("input", metavar="IN.pt", help="fairseq checkpoint of a transformer architecture")
    parser.add_argument("output", metavar="OUT.pt", help="where to write the floater_transformer checkpoint")
    parser.add_argument("--arch", help="floater architecture of OUT (default: floater_<IN's arch> when it exists, "
                                       "else floater_transformer); must have IN's dimensions")
    add_flags(parser.add_argument_group("FLOATER options (default: the arch's)", argument_default=argparse.SUPPRESS),
              Floater.flags)
    args = parser.parse_args(argv)
    options = argparse.Namespace(**{k: v for k, v in vars(args).items() if k.startswith("floater_")})
    try:
        converted = convert(args.input, args.output, args.arch, options)
    except ConversionError as err:
        parser.exit(1, f"{parser.prog}: error: {err}\n")
    print(f"{args.output}: {converted.arch} (h ≡ 0, same outputs as {args.input}); continue with fairseq-train "
          f"--user-dir fairseq_plugins --arch {converted.arch} --finetune-from-model {args.output}")


if __name__ == "__main__":
    main()
