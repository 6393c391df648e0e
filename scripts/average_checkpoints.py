#!/usr/bin/env python3
"""Average the model parameters of N fairseq checkpoints (checkpoint averaging, as both papers evaluate).

    scripts/average_checkpoints.py --inputs A.pt B.pt ... --output AVG.pt
    scripts/average_checkpoints.py --inputs SAVE_DIR --num-epoch-checkpoints 5 --output AVG.pt
    scripts/average_checkpoints.py --inputs SAVE_DIR --num-update-checkpoints 20 --output AVG.pt

Definition: every floating-point entry of the model state dict becomes the element-wise mean of that entry
over the N checkpoints (accumulated in float64, stored in the entry's own dtype); entries that are not
floating point (step counters and other integer buffers) are taken from the last checkpoint. The output is
a fairseq checkpoint that fairseq-generate loads as it is: the last (newest) checkpoint's dict -- its cfg,
extra state and optimizer history -- with the averaged model, and without the optimizer state (it is not
meaningful for an average and would double the file). It is written to a temporary file in the output's
directory and renamed, so an interrupted run leaves no partial output.

From a directory, the checkpoints are fairseq's: checkpoint<epoch>.pt (--num-epoch-checkpoints: the N with the
highest epochs) or checkpoint_<epoch>_<updates>.pt (--num-update-checkpoints: the N with the most updates);
--checkpoint-upper-bound skips later ones. Errors (one line each): fewer checkpoints than asked, or
checkpoints whose parameter names or shapes differ.
"""
import argparse
import re
import sys
from pathlib import Path

import torch

from tooling.atomic import save_torch


class AveragingError(Exception):
    pass


def load(path):
    """A checkpoint dict through fairseq's loader: weights_only unpickling (tensors, containers, argparse.Namespace)."""
    try:  # the patched fairseq's loader (its messages name the file)
        from fairseq.checkpoint_utils import torch_load_checkpoint
    except ImportError:  # a fairseq without the patch (the release, main): the same weights-only load
        def torch_load_checkpoint(f, map_location):
            with torch.serialization.safe_globals([argparse.Namespace]):
                return torch.load(f, map_location=map_location, weights_only=True)

    try:
        with open(path, "rb") as f:
            state = torch_load_checkpoint(f, map_location="cpu")
    except FileNotFoundError:
        raise AveragingError(f"{path}: no such file")
    except Exception as err:
        raise AveragingError(f"{path}: not a readable checkpoint ({type(err).__name__}: {str(err).splitlines()[0][:200]})")
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise AveragingError(f"{path}: not a fairseq checkpoint (no 'model' state dict)")
    return state


def select_checkpoints(directory, num, kind, upper_bound=None):
    """The paths of the last `num` epoch or update checkpoints in `directory`, oldest first."""
    pattern = re.compile(r"checkpoint(\d+)\.pt" if kind == "epoch" else r"checkpoint_\d+_(\d+)\.pt")
    found = []
    for path in Path(directory).iterdir():
        m = pattern.fullmatch(path.name)
        if m and (upper_bound is None or int(m.group(1)) <= upper_bound):
            found.append((int(m.group(1)), path))
    found.sort()
    if len(found) < num:
        raise AveragingError(f"{directory}: {len(found)} {kind} checkpoints"
                             f"{'' if upper_bound is None else f' up to {upper_bound}'}, {num} needed "
                             f"({'checkpoint<epoch>.pt' if kind == 'epoch' else 'checkpoint_<epoch>_<updates>.pt'})")
    return [path for _, path in found[-num:]]


def average(paths):
    """The averaged checkpoint dict (see the module docstring)."""
    if not paths:
        raise AveragingError("no checkpoints to average")
    sums, reference, last = None, None, None
    for path in paths:
        state = load(path)
        model = state["model"]
        if sums is None:
            reference = (path, {k: tuple(v.shape) for k, v in model.items() if torch.is_tensor(v)})
            sums = {k: v.to(torch.float64).clone() if torch.is_floating_point(v) else v
                    for k, v in model.items() if torch.is_tensor(v)}
        else:
            ref_path, shapes = reference
            keys = {k for k, v in model.items() if torch.is_tensor(v)}
            if keys != set(shapes):
                extra, missing = sorted(keys - set(shapes)), sorted(set(shapes) - keys)
                detail = f"has {extra[:3]} that {ref_path} lacks" if extra else f"lacks {missing[:3]} that {ref_path} has"
                raise AveragingError(f"{path}: parameter names differ: it {detail}")
            for k in shapes:
                if tuple(model[k].shape) != shapes[k]:
                    raise AveragingError(f"{path}: parameter {k} has shape {tuple(model[k].shape)}, "
                                         f"but {shapes[k]} in {ref_path}")
                if torch.is_floating_point(sums[k]):
                    sums[k] += model[k].to(torch.float64)
                else:
                    sums[k] = model[k]
        last = state
    averaged = {}
    for k, v in last["model"].items():
        if torch.is_tensor(v) and torch.is_floating_point(v):
            averaged[k] = (sums[k] / len(paths)).to(v.dtype)
        else:
            averaged[k] = sums.get(k, v)
    out = {k: v for k, v in last.items() if k != "last_optimizer_state"}
    out["model"] = averaged
    extra = dict(out.get("extra_state") or {})
    extra["averaged_checkpoints"] = [str(p) for p in paths]
    out["extra_state"] = extra
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", nargs="+", required=True, help="checkpoint files, or one directory")
    ap.add_argument("--output", required=True)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--num-epoch-checkpoints", type=int, metavar="N")
    group.add_argument("--num-update-checkpoints", type=int, metavar="N")
    ap.add_argument("--checkpoint-upper-bound", type=int, metavar="K",
                    help="with a directory: ignore checkpoints after epoch/update K")
    args = ap.parse_args(argv)
    try:
        num = args.num_epoch_checkpoints or args.num_update_checkpoints
        if num is not None:
            if len(args.inputs) != 1 or not Path(args.inputs[0]).is_dir():
                raise AveragingError("--num-epoch-checkpoints/--num-update-checkpoints need --inputs to be one directory")
            if num < 1:
                raise AveragingError(f"the number of checkpoints must be >= 1, got {num}")
            kind = "epoch" if args.num_epoch_checkpoints else "update"
            paths = select_checkpoints(args.inputs[0], num, kind, args.checkpoint_upper_bound)
        else:
            if any(Path(p).is_dir() for p in args.inputs):
                raise AveragingError("a directory needs --num-epoch-checkpoints or --num-update-checkpoints")
            paths = [Path(p) for p in args.inputs]
        save_torch(average(paths), args.output)
    except AveragingError as err:
        sys.exit(f"average_checkpoints.py: {err}")
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) -> {args.output}")


if __name__ == "__main__":
    main()
