"""scripts/bench/bench.py --count-ops --regime: the aten operators and host synchronisations of the users' update,
fairseq's Trainer.train_step, per (dims, precision, model), on the regime's batches (tooling.bench.regime builds the
trainers as fairseq-train does; tooling.bench.length_mix the batches).

On a GPU every operator is a kernel launch and every sync makes the host wait until the device has drained its
queue, so these two counts bound what an update costs the host. Both are counted on CPU (`UpdateCounter`): the
operators and the reads that dispatch an operator through a TorchDispatchMode, the reads a CPU build does not
dispatch by wrapping the Python calls that make them (`_PythonReads`). A sync is:

- a value read on the host: `.item()`, `bool()`, `int()`, `float()` (`_local_scalar_dense`), `is_nonzero`,
  `equal`, `allclose`; and `.cpu()`, `.to("cpu")`, `.tolist()`, `.numpy()` of a device tensor, which on a CPU
  build return the tensor or its memory without an operator (named by the call: `cpu`, `to(cpu)`,
  `tolist`, `numpy`);
- an operator whose output's size depends on values (`DATA_SIZED_OPS`: `nonzero`, `masked_select`, `unique`,
  `bincount` ...; `repeat_interleave` without `output_size`; indexing with a boolean mask, and assigning through
  one unless a single host-side value is filled in, which torch does with `masked_fill_`).

One distinction a CPU build cannot make by device: a value read from a tensor that is host-side on a GPU too is not
a sync (`host_reads`). Such tensors are those made without a device: a factory given no device
(`torch.onnx.operators.shape_as_tensor`, fairseq's sinusoidal embedding's length, is an `empty` without one) or
`torch.tensor(...)`, whatever is computed from them alone, and what `.cpu()` or `.to("cpu")` returns (where a CPU
build returns the tensor itself, a fresh alias of it, as a GPU returns a copy). An operator given a device
(`.to(device)`, `zeros(..., device=x.device)`, `torch.tensor(..., device=d)`: a copy to the device, not a read)
makes a device tensor, so the count errs on the side of syncs. A device written as a string "cpu" is the host's, a
torch.device (`x.device`, the trainer's) the device's, which on a CPU build is cpu too (`_names_the_host`).
Each sync is named by the innermost frame outside torch.

The counted update is the third: the first two build the optimizer's state, fairseq's lazily made buffers and the
trainer's meters.
"""
import functools
import sys
import traceback
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

from tooling.bench.ops import SYNCING_OPS

HOST_ORIGIN_OPS = frozenset({"lift_fresh", "lift_fresh_copy"})  # torch.tensor(...): host-side until moved
# operators whose output's size depends on values: the device must count them before the host can size it
DATA_SIZED_OPS = frozenset({"nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive",
                            "unique_dim_consecutive", "bincount"})
READ_OPS = SYNCING_OPS | DATA_SIZED_OPS | {"allclose"}  # allclose: its kernel reads isclose(...).all()
# operators that read values only with some arguments (_reads_values)
SOMETIMES_READ_OPS = frozenset({"repeat_interleave", "histc", "index", "index_put", "index_put_"})
MASKS = (torch.bool, torch.uint8)
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


def _reads_values(name, args, kwargs, is_host):
    """Whether aten operator `name` (READ_OPS or SOMETIMES_READ_OPS) reads values on the host with these arguments."""
    if name in READ_OPS:
        return True
    if name == "repeat_interleave":  # only its Tensor overload dispatches; an output_size spares the count
        return kwargs.get("output_size") is None
    if name == "histc":  # min == max (the default): the range is read from the values
        low = args[2] if len(args) > 2 else kwargs.get("min", 0)
        return low == (args[3] if len(args) > 3 else kwargs.get("max", 0))
    indices = args[1] if len(args) > 1 else kwargs["indices"]
    given = [i for i in indices if i is not None]
    if not any(i.dtype in MASKS for i in given):
        return False
    if name == "index":
        return True
    # index_put_: one mask and one host-side value is filled in with masked_fill_ (ATen's canDispatchToMaskedFill)
    value = args[2] if len(args) > 2 else kwargs["values"]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    return not (not accumulate and len(given) == 1 and value.numel() == 1 and is_host(value))


class UpdateCounter(TorchDispatchMode):
    """Non-view aten operators (`ops`), syncs by where they happen (`syncs`), and reads of host-side tensors
    (`host_reads`: not syncs on a GPU). Entering it enters `_PythonReads` too, for the reads a CPU build does not
    dispatch."""

    def __init__(self):
        super().__init__()
        self.ops, self.syncs, self.host_reads = 0, Counter(), 0
        self._host = WeakTensorKeyDictionary()
        self._python = _PythonReads(self)

    def read(self, name, host):
        if host:
            self.host_reads += 1
        else:
            self.syncs[f"{name} @ {_where()}"] += 1

    def __enter__(self):
        self._python.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._python.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += not func.is_view
        name = func.overloadpacket.__name__
        tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        made_here = not tensors and kwargs.get("device") is None  # torch's default device: the host's
        host = (bool(tensors) and all(t in self._host for t in tensors)) or made_here
        if (name in READ_OPS or name in SOMETIMES_READ_OPS) and _reads_values(name, args, kwargs,
                                                                             self._host.__contains__):
            self.read(name, host)
        out = func(*args, **kwargs)
        if (name in HOST_ORIGIN_OPS or host) and kwargs.get("device") is None:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self._host[t] = True
        return out


class _PythonReads:
    """The reads of a device tensor that a CPU build serves without an operator (`.cpu()`, `.to("cpu")`,
    `.tolist()`, `.numpy()`), recorded in the counter, and the side (host or device) of what these calls and the
    factories from data (`torch.tensor`, `as_tensor`, `asarray`, `Tensor.new_tensor`) return: while open, each of
    PYTHON_CALLS is wrapped where torch defines it. Wrapped rather than seen through a TorchFunctionMode, which
    does not see what runs inside a torch function it hands on (all of `loss.backward()`: the custom autograd
    functions' backwards) nor in the autograd engine; the other calls pass at no cost."""

    def __init__(self, counter):
        self.counter = counter
        self._undo = []

    def __enter__(self):
        for owner, attr, kind, name in PYTHON_CALLS:
            self._undo.append((owner, attr, owner.__dict__.get(attr)))  # None: inherited (TensorBase's)
            setattr(owner, attr, self._wrap(getattr(owner, attr), kind, name))
        return self

    def __exit__(self, *exc):
        while self._undo:
            owner, attr, own = self._undo.pop()
            if own is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, own)
        return False

    def _wrap(self, original, kind, name):
        @functools.wraps(original)
        def call(*args, **kwargs):
            out = original(*args, **kwargs)
            return self._after(kind, name, out, args, kwargs)
        return call

    def _after(self, kind, name, out, args, kwargs):
        host = self.counter._host
        src = args[0] if args else None
        if kind == "read":  # the values themselves, into Python or numpy
            self.counter.read(name, src in host)
        elif kind == "cpu":
            out = self._moved(src, out, name, to_host=True)
        elif kind == "to":
            target = args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("device"))
            if isinstance(target, torch.Tensor):  # .to(other): to other's side
                out = self._moved(src, out, name, to_host=target in host)
            elif isinstance(target, (str, torch.device, int)) and not isinstance(target, bool):
                out = self._moved(src, out, name, to_host=_names_the_host(target))
        else:  # a factory from data: to the device given; else new_tensor's beside self, the others' on the host
            device = kwargs.get("device", args[2] if kind == "as_tensor" and len(args) > 2 else None)
            data = args[1] if kind == "new_tensor" else src
            data = data if isinstance(data, torch.Tensor) else None
            if device is not None:
                out = self._moved(data, out, name, to_host=_names_the_host(device))
            elif kind == "new_tensor":
                out = self._moved(data, out, name, to_host=src in host)
        return out

    def _moved(self, src, out, name, to_host):
        """out, the result of moving src (None: data from Python) to the host or the device: a read where a device
        tensor goes to the host; marked on its side. Where a CPU build returns src itself and a GPU a copy on the
        other side, a fresh alias stands for the copy (src keeps its side)."""
        host = self.counter._host
        src_host = src is None or src in host
        if not src_host and to_host:
            self.counter.read(name, False)
        if not isinstance(out, torch.Tensor):
            return out
        if out is src and src_host != to_host:
            out = out.view_as(out)
        if to_host:
            host[out] = True
        else:
            host.pop(out, None)
        return out


def _names_the_host(device):
    """Whether a device given to `.to` or a factory is the host's. On a CPU build the host's and the device's are
    both cpu; code that means the device's takes it from a tensor (`x.device`), a grouping of tensors by device or
    the trainer (torch.device objects, on a GPU cuda's), code that means the host's writes "cpu". So a string names
    the host, a torch.device the device (a `torch.device("cpu")` written out goes uncounted)."""
    return isinstance(device, str) and torch.device(device).type == "cpu"


# the calls _PythonReads wraps: (where torch defines it, its name there, kind, the name a read is recorded under)
PYTHON_CALLS = (
    (torch.Tensor, "tolist", "read", "tolist"), (torch.Tensor, "numpy", "read", "numpy"),  # numpy: np.asarray's too
    (torch.Tensor, "cpu", "cpu", "cpu"), (torch.Tensor, "to", "to", "to(cpu)"),
    (torch, "tensor", "tensor", "tensor(cpu)"), (torch, "as_tensor", "as_tensor", "as_tensor(cpu)"),
    (torch, "asarray", "asarray", "asarray(cpu)"), (torch.Tensor, "new_tensor", "new_tensor", "new_tensor(cpu)"),
)


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
    from tooling.bench.models import BASELINE, FUSED_UPDATE, model_specs, synthetic_dictionary
    from tooling.bench.regime import build_trainer, regime_archs
    from tooling.bench.timing import machine, source_state

    if args.threads:
        torch.set_num_threads(args.threads)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.silent else (lambda *a: None)
    memory = getattr(args, "memory", False)  # callers other than bench.py's command line (the suite's bounds) omit it
    dictionary = synthetic_dictionary(args.vocab)
    pairs = length_mix.load_pairs()
    rows = []
    # --memory: both updates, each row's flags --train-flags' (+ FUSED_UPDATE); else --train-flags' alone
    updates = [("default", list(args.update_flags)), ("fused", list(args.update_flags) + list(FUSED_UPDATE))] \
        if memory else [(None, list(args.update_flags))]
    for dims in args.dims.split(","):
        specs = model_specs(dims, args.floater_every, archs=regime_archs(dims))
        names = [n for n in specs if n == BASELINE or n in args.models.split(",")]
        for max_tokens in (int(x) for x in str(args.max_tokens).split(",")):
            batches = update_batches(pairs, dictionary, max_tokens, args.seed)
            for precision in args.precision.split(","):
                for name in names:
                    arch, flags, kind = specs[name]
                    for update, extra in updates:
                        trainer = build_trainer(arch, flags + extra, precision, dictionary, args.device,
                                                args.seed, kind=kind)
                        row = {"dims": dims, "precision": precision, "max_tokens": max_tokens, "model": name,
                               "arch": arch, "sentences": batches[WARM_UPDATES]["nsentences"],
                               "parameters": sum(p.numel() for p in trainer.model.parameters()),
                               **({"update": update} if update else {}), **count_update(trainer, batches)}
                        rows.append(row)
                        log(f"update ops {dims} {precision} {max_tokens} {name} {update or ''}: {row['ops']} "
                            f"operators, {row['syncs']} syncs")
    res = {"kind": "update_ops", "command": args.command,
           "settings": {"dims": args.dims, "precision": args.precision, "max_tokens": args.max_tokens,
                        "models": args.models, "update_flags": list(args.update_flags), "device": args.device,
                        "threads": torch.get_num_threads()},
           "machine": machine(args.device), "source": source_state(), "rows": rows}
    if memory:
        from tooling.bench.update_memory import measure_rows

        measure_rows(args, rows, dict(updates), log)
        res["kind"], res["settings"]["memory_reps"] = "update_memory", args.memory_reps
    return res


def update_batches(pairs, dictionary, max_tokens, seed):
    """The updates' batches under max_tokens: the fullest of the regime's (a corpus's last batch may hold a
    sentence or two), WARM_UPDATES to warm up, then the measured one."""
    from tooling.bench import length_mix

    drawn, _, _ = length_mix.corpus(pairs, dictionary, max_tokens, 8, seed + max_tokens)
    fullest = sorted(drawn, key=lambda b: -b["nsentences"])
    return fullest[1:WARM_UPDATES + 1] + fullest[:1]


def update_ops_markdown(res):
    st = res["settings"]
    flags = " ".join(st["update_flags"]) or "none"
    lines = [f"# Operators and host synchronisations of the users' update ({st['device']})", "",
             f"Command: `{res['command']}`  ", f"Machine: {res['machine'].get('cpu', '')}, torch "
             f"{res['machine']['torch']}, {st['threads']} thread(s); commit {res['source']['commit']}  ",
             f"Extra training flags: {flags}", "",
             "One `Trainer.train_step` (batch to device, forward, criterion, backward, gradient norm, precision's "
             "optimizer wrapper, Adam, learning-rate schedule, the trainer's metrics), the third on the regime's "
             "batches, counted through a TorchDispatchMode and wrapped Python calls (tooling/bench/update_ops.py): "
             "non-view aten operators (kernel launches on a GPU) and reads of a device value on the host (syncs: "
             "value reads, `.cpu()`/`.tolist()`/`.numpy()`, outputs sized by values), by where they happen.", "",
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
