"""scripts/bench/bench.py --count-ops --regime: the aten operators and host synchronisations of the users' update,
fairseq's Trainer.train_step, per (dims, precision, model), on the regime's batches (tooling.bench.regime builds the
trainers as fairseq-train does; tooling.bench.length_mix the batches).

On a GPU every operator is a kernel launch and every sync makes the host wait until the device has drained its
queue, so these two counts bound what an update costs the host. Both are counted on CPU through a
TorchDispatchMode (`UpdateCounter`), with one distinction a CPU build cannot make by device: a value read from a
tensor that is host-side on a GPU too is not a sync. Such tensors are those made without a device: a factory
given no device (`torch.onnx.operators.shape_as_tensor`, fairseq's sinusoidal embedding's length, is an
`empty` without one) or `torch.tensor(...)`, and whatever is computed from them alone; an operator given a device
(`.to(device)`, `zeros(..., device=x.device)`) makes a device tensor, so the count errs on the side of syncs.
Each sync is named by the innermost frame outside torch.

The counted update is the third: the first two build the optimizer's state, fairseq's lazily made buffers and the
trainer's meters.
"""
import sys
import traceback
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

from tooling.bench.ops import SYNCING_OPS

HOST_ORIGIN_OPS = frozenset({"lift_fresh", "lift_fresh_copy"})  # torch.tensor(...): host-side until moved
WARM_UPDATES = 2


def _where():
    """The innermost frame outside torch and this file: 'fairseq/trainer.py:943' (path from the package up)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace("\\", "/")
        if "/torch/" in path or path.endswith(("update_ops.py", "contextlib.py")):
            continue
        for root in ("site-packages/", "/fairseq_plugins/", "/scripts/"):
            if root in path:
                path = path.split(root, 1)[1] if root == "site-packages/" else root.strip("/") + "/" + \
                    path.split(root, 1)[1]
                break
        return f"{path}:{frame.lineno}"
    return "?"


class UpdateCounter(TorchDispatchMode):
    """Non-view aten operators (`ops`), syncs by where they happen (`syncs`), and reads of host-side tensors
    (`host_reads`: not syncs on a GPU)."""

    def __init__(self):
        super().__init__()
        self.ops, self.syncs, self.host_reads = 0, Counter(), 0
        self._host = WeakTensorKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += not func.is_view
        name = func.overloadpacket.__name__
        tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        made_here = not tensors and kwargs.get("device") is None  # torch's default device: the host's
        host = (bool(tensors) and all(t in self._host for t in tensors)) or made_here
        if name in SYNCING_OPS:
            if host:
                self.host_reads += 1
            else:
                self.syncs[f"{name} @ {_where()}"] += 1
        out = func(*args, **kwargs)
        if (name in HOST_ORIGIN_OPS or host) and kwargs.get("device") is None:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self._host[t] = True
        return out


def count_update(trainer, batches):
    """Operators and syncs of trainer.train_step on batches[WARM_UPDATES] (one batch per update), after
    WARM_UPDATES updates on the batches before it."""
    for b in batches[:WARM_UPDATES]:
        trainer.train_step([b])
    with UpdateCounter() as counter:
        trainer.train_step([batches[WARM_UPDATES]])
    return {"ops": counter.ops, "syncs": sum(counter.syncs.values()), "sync_sites": dict(counter.syncs),
            "host_reads": counter.host_reads}


def count_update_ops(args):
    """Every (dims, precision, model) of --count-ops --regime: one counted update each (see the docstring)."""
    from tooling.bench import length_mix
    from tooling.bench.models import BASELINE, model_specs, synthetic_dictionary
    from tooling.bench.regime import build_trainer, regime_archs
    from tooling.bench.timing import machine, source_state

    if args.threads:
        torch.set_num_threads(args.threads)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.silent else (lambda *a: None)
    dictionary = synthetic_dictionary(args.vocab)
    pairs = length_mix.load_pairs()
    rows = []
    for dims in args.dims.split(","):
        specs = model_specs(dims, args.floater_every, archs=regime_archs(dims))
        names = [n for n in specs if n == BASELINE or n in args.models.split(",")]
        for max_tokens in (int(x) for x in str(args.max_tokens).split(",")):
            drawn, _, _ = length_mix.corpus(pairs, dictionary, max_tokens, 8, args.seed + max_tokens)
            # the fullest batches (a corpus's last batch may hold a sentence or two): two to warm up, one counted
            fullest = sorted(drawn, key=lambda b: -b["nsentences"])
            batches = fullest[1:WARM_UPDATES + 1] + fullest[:1]
            for precision in args.precision.split(","):
                for name in names:
                    arch, flags, kind = specs[name]
                    trainer = build_trainer(arch, flags + list(args.update_flags), precision, dictionary,
                                            args.device, args.seed, kind=kind)
                    row = {"dims": dims, "precision": precision, "max_tokens": max_tokens, "model": name,
                           "arch": arch, "sentences": batches[WARM_UPDATES]["nsentences"],
                           **count_update(trainer, batches)}
                    rows.append(row)
                    log(f"update ops {dims} {precision} {max_tokens} {name}: {row['ops']} operators, "
                        f"{row['syncs']} syncs")
    return {"kind": "update_ops", "command": args.command,
            "settings": {"dims": args.dims, "precision": args.precision, "max_tokens": args.max_tokens,
                         "models": args.models, "update_flags": list(args.update_flags), "device": args.device,
                         "threads": torch.get_num_threads()},
            "machine": machine(args.device), "source": source_state(), "rows": rows}


def update_ops_markdown(res):
    st = res["settings"]
    flags = " ".join(st["update_flags"]) or "none"
    lines = [f"# Operators and host synchronisations of the users' update ({st['device']})", "",
             f"Command: `{res['command']}`  ", f"Machine: {res['machine'].get('cpu', '')}, torch "
             f"{res['machine']['torch']}, {st['threads']} thread(s); commit {res['source']['commit']}  ",
             f"Extra training flags: {flags}", "",
             "One `Trainer.train_step` (batch to device, forward, criterion, backward, gradient norm, precision's "
             "optimizer wrapper, Adam, learning-rate schedule, the trainer's metrics), the third on the regime's "
             "batches, counted through a TorchDispatchMode (tooling/bench/update_ops.py): non-view aten operators "
             "(kernel launches on a GPU) and reads of a device value on the host (syncs), by where they happen.", "",
             "| dims | precision | max tokens | model | sentences | operators | host syncs |",
             "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['dims']} | {r['precision']} | {r['max_tokens']:,} | {r['model']} | {r['sentences']} | "
                     f"{r['ops']:,} | {r['syncs']} |")
    sites = Counter()
    for r in res["rows"]:
        for k, v in r["sync_sites"].items():
            sites[k] = max(sites[k], v)
    lines += ["", "Where the syncs happen (the most in any one row):", ""]
    lines += [f"- `{k}`: {v}" for k, v in sorted(sites.items())] or ["- none"]
    return "\n".join(lines) + "\n"
