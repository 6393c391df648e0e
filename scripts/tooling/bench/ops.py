"""scripts/bench/bench.py --count-ops: the aten operators (views aside: each is one kernel launch on a GPU) and the host
synchronisations of one training update per model and of FLOATER's exact solve and its backward, counted through a
TorchDispatchMode, no timing but the solve's (see tooling.bench.phases's docstring).
"""
import sys

import torch

from tooling.bench.models import Bundle, model_specs, random_batch, synthetic_dictionary
from tooling.bench.timing import machine, parse_lengths, source_state, timed


SYNCING_OPS = frozenset({"_local_scalar_dense", "equal", "is_nonzero", "nonzero", "item"})


def op_counter():
    """A TorchDispatchMode counting non-view aten operators and, by name, those that synchronise with the host."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.syncs = 0, Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += not func.is_view
            name = func.overloadpacket.__name__
            if name in SYNCING_OPS:
                self.syncs[name] += 1
            return func(*args, **(kwargs or {}))

    return CountOps()


def count_ops(args):
    """Operators and host syncs of one training update per model and of FLOATER's exact solve (see the docstring)."""
    from fairseq_plugins.modules.floater import STEPS_PER_DT, solve_flows

    device, lengths = args.device, parse_lengths(args.lengths)
    if args.threads:
        torch.set_num_threads(args.threads)
    specs = model_specs(args.dims, args.floater_every)
    dictionary = synthetic_dictionary(args.vocab)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.silent else (lambda *a: None)
    updates, solves = [], []
    for T in lengths:
        bsz = max(1, args.tokens // T)
        for name in ("transformer", "relative", "floater"):
            arch, flags, _ = specs[name]
            bundle = Bundle.build(arch, flags, dictionary, device, args.seed)
            model = bundle.model
            sample = random_batch(dictionary, bsz, T, device, args.seed)
            bundle.train_update(sample)  # Adam's state and every lazily built buffer exist from here on
            with op_counter() as counter:
                bundle.train_update(sample)
            updates.append({"model": name, "length": T, "batch_sentences": bsz, "ops": counter.ops,
                            "syncs": dict(counter.syncs)})
            log(f"ops {name:>12} T={T:<4} update: {counter.ops} operators, syncs {dict(counter.syncs)}")
            if name != "floater":
                continue
            flows = model.encoder.position_scheme.positions.flows
            rows = [len(projections) for _, projections in model.encoder.position_scheme.positions.members]
            steps = STEPS_PER_DT * (T - 1)

            def solve():
                initial = model.encoder.position_scheme.positions.initial_values()
                return solve_flows(flows, initial, T)

            with op_counter() as forward:
                ys = solve()
            loss = sum(y.float().sum() for y in ys)
            with op_counter() as backward:
                loss.backward()
            times = []
            for _ in range(2):  # CPU seconds on CPU (a shared machine), wall seconds on CUDA; the better of two
                box = []
                forward_t = timed(lambda: box.append(solve()), device)
                backward_t = timed(lambda: sum(y.float().sum() for y in box.pop()).backward(), device)
                clock = 1 if device == "cpu" else 0
                times.append((forward_t[clock], backward_t[clock]))
            forward_s = min(t[0] for t in times)
            backward_s = min(t[1] for t in times)
            solves.append({"length": T, "rows": rows, "steps": steps, "forward_ops": forward.ops,
                           "backward_ops": backward.ops, "forward_ops_per_step": forward.ops / steps,
                           "backward_ops_per_step": backward.ops / steps, "forward_syncs": dict(forward.syncs),
                           "backward_syncs": dict(backward.syncs), "forward_s": forward_s,
                           "backward_s": backward_s})
            log(f"ops solve T={T}: forward {forward.ops} ({forward.ops / steps:.1f}/step), backward {backward.ops}"
                f" ({backward.ops / steps:.1f}/step), syncs {dict(forward.syncs)} / {dict(backward.syncs)}")
    return {"kind": "count_ops", "command": args.command,
            "settings": {"dims": args.dims, "lengths": lengths, "tokens": args.tokens, "device": device,
                         "threads": torch.get_num_threads()},
            "machine": machine(device), "source": source_state(), "updates": updates, "solves": solves}



