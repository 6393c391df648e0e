"""The model's own count of its training updates, for training loops that never call ``set_num_updates``.

With ``--floater-update-every N`` > 1 the flows re-solve, and θ trains, on the updates whose number is a multiple
of N (``positions._TrainingSolves``). fairseq's trainer sets that number before every training forward (the
task's ``train_step`` calls the model's ``set_num_updates``); a loop of one's own that never does would leave it
where it is, and from a number that is not a multiple of N θ would never train again. So every training forward
asks whether an optimizer step happened since the previous one with nothing set in between, and if so advances
every flow's counter by one. A step is

- a ``step()`` of a ``torch.optim`` optimizer that holds one of the model's parameters (a global step post-hook:
  every ``torch.optim.Optimizer``, fused ones included, and those that fairseq's optimizers wrap), or
- a change of the parameters' in-place version counters (an update written by hand under ``torch.no_grad()``).

Several forwards per step (gradient accumulation) count one update; a skipped step (``GradScaler`` on non-finite
gradients) none, as fairseq's trainer counts. ``set_num_updates`` leaves the count to its caller: the next training
forward counts nothing and starts from what was set (fairseq's runs are as they were); ``load_state_dict`` and
``invalidate_cache`` too, and moved parameters (``.to()``). Host-only: no device work per forward.

Unseen: an update written through ``.data`` by an optimizer that is not a ``torch.optim.Optimizer`` over these
parameters (fairseq's FP16Optimizer steps float32 copies and copies them back through ``.data``). Until a first
step has been seen, a training forward that saw none compares one parameter with its values at the previous one
(one device sync) and refuses values that moved unseen, in one line (``UncountedUpdateError``).
"""

import weakref
from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

_WATCHES: "weakref.WeakSet[StepWatch]" = weakref.WeakSet()  # the live watches the step hook tells
_HOOK = []  # the global hook's handle, once registered


class UncountedUpdateError(RuntimeError):
    one_line = True  # uncaught, it ends a fairseq command with its message alone (fairseq_plugins/__init__.py)


def _on_optimizer_step(optimizer, args, kwargs):
    for watch in list(_WATCHES):
        watch.optimizer_stepped(optimizer)


def _hook():
    if not _HOOK:
        _HOOK.append(register_optimizer_step_post_hook(_on_optimizer_step))


class StepWatch:
    """Whether a ``torch.optim`` optimizer holding one of ``params`` stepped since the watch began or was last
    taken (the update counter's, between two training forwards; the shared solve's: an update that ended without
    the model's ``all_reduce_grads()``)."""

    def __init__(self, params):
        self.ids, self.stepped = frozenset(id(p) for p in params), False
        _hook()
        _WATCHES.add(self)

    def optimizer_stepped(self, optimizer):
        if not self.stepped:
            self.stepped = any(id(p) in self.ids for group in optimizer.param_groups for p in group["params"])

    def take(self) -> bool:
        """Whether a step came since the last take, and watch afresh."""
        stepped, self.stepped = self.stepped, False
        return stepped


class UpdateCounter:
    """Counts a ``FloaterPositions``'s training updates where nobody sets them (see the module docstring)."""

    def __init__(self, positions):
        self.positions = positions
        self.scope: Optional[nn.Module] = None  # whose parameters an update moves (the model); None: the flows'
        self._reset()
        self._sets = 0  # the flows' set_num_updates calls seen
        self._seen_step = False  # a step has been seen: the refusal's value check is off

    def _reset(self):
        self._epochs: Optional[tuple] = None  # the flows' _epoch counters when _params was collected
        self._params: List[nn.Parameter] = []
        self._watch = StepWatch(())  # an optimizer over _params stepped since the last training forward
        self._base: Optional[Tuple[tuple, int]] = None  # (data_ptrs, sum of _version) at the last training forward
        self._own = False  # the last training forward's number was counted here, not set by a caller
        self._probe: Optional[Tuple[nn.Parameter, Tensor]] = None  # a parameter and its values then

    def __getstate__(self):
        # a copy (deepcopy, pickle) collects its own parameters: ids and data_ptrs are the original's
        state = dict(self.__dict__)
        for name in ("_epochs", "_params", "_watch", "_base", "_own", "_probe"):
            del state[name]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()

    def bind(self, model: nn.Module):
        """Count the steps on ``model``'s parameters, and settle the count when its state dict is taken."""
        if self.scope is not model:
            self.scope = model
            model.register_state_dict_pre_hook(self._before_state_dict)

    def _before_state_dict(self, module, prefix, keep_vars):
        self.settle()

    def observe(self):
        """At a training forward (once per forward): advance every flow's counter if an update happened since the
        previous one, unless set_num_updates was called in between."""
        flows = self.positions.flows
        epochs = tuple(flow._epoch for flow in flows)
        if epochs != self._epochs:  # built, loaded, invalidated: the parameters afresh, nothing counted
            self._reset()
            self._epochs, self._params = epochs, self._collect()
            self._watch = StepWatch(self._params)  # a copy's counter gets its own watch here (see __getstate__)
        sets = sum(flow._sets for flow in flows)
        external, self._sets = sets != self._sets, sets
        stepped = self._watch.take()
        base, self._base = self._base, self._state()
        self._own = not external
        if external:  # the caller counts: fairseq's trainer before every forward
            self._probe = None
            return
        if self._count(base, stepped):
            return
        if not self._seen_step:
            self._check_unseen(compare=base is not None and base[0] == self._base[0])

    def settle(self):
        """At a state dict: a step since the last training forward of a loop of one's own counts now, so that a
        checkpoint holds the number of the update about to run (where a caller sets it, nothing to do)."""
        flows = self.positions.flows
        if (self._own and self._epochs == tuple(flow._epoch for flow in flows)
                and self._sets == sum(flow._sets for flow in flows)):
            stepped = self._watch.take()
            base, self._base = self._base, self._state()
            self._count(base, stepped)

    def _state(self) -> Tuple[tuple, int]:
        return tuple(p.data_ptr() for p in self._params), sum(p._version for p in self._params)

    def _count(self, base, stepped: bool) -> bool:
        """Advance the flows if a step happened between ``base`` and now (the same storage: not a moved model)."""
        if base is None or base[0] != self._base[0] or not (stepped or base[1] != self._base[1]):
            return False
        self._seen_step, self._probe = True, None
        for flow in self.positions.flows:
            flow.advance_update()
        return True

    def _check_unseen(self, compare: bool):
        """Before a first step is seen: refuse a parameter that moved since the previous forward without one."""
        probe = self._probe_parameter()
        before, self._probe = self._probe, (probe, probe.detach().clone()) if probe is not None else None
        if compare and before is not None and before[0] is probe and not torch.equal(before[1], probe):
            every = self.positions.flows[0].settings.update_every
            raise UncountedUpdateError(
                f"FLOATER (--floater-update-every {every}): the parameters changed between two training forwards "
                "without an optimizer step the model can see (an update through .data, e.g. fairseq's "
                "FP16Optimizer), so it cannot count updates and θ would stop training; call "
                "model.set_num_updates(i) before each update's forwards, as fairseq's trainer does")

    def _probe_parameter(self) -> Optional[nn.Parameter]:
        """One parameter that every update moves: a driven projection's weight (one that may sit out an update, θ
        or a cached b(0), does not)."""
        for _, projections in self.positions.members:
            for proj in projections:
                if proj.weight.requires_grad:
                    return proj.weight
        return next((p for p in self._params if p.requires_grad and not getattr(p, "may_skip_update", False)), None)

    def _collect(self) -> List[nn.Parameter]:
        if self.scope is not None:
            return list(self.scope.parameters())
        modules = [flow for flow, _ in self.positions.members]
        modules += [proj for _, projections in self.positions.members for proj in projections]
        return list(dict.fromkeys(p for module in modules for p in module.parameters()))
