"""FLOATER with --floater-update-every N > 1 trained by a loop of one's own that never calls set_num_updates
(fairseq_plugins/modules/floater/update_count.py): the model counts its optimizer steps, so θ re-solves and trains
every N steps; fairseq's way (set_num_updates before every forward) is exactly as it was; an update the model
cannot see is refused in one line."""
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from fairseq.optim.adam import Adam as FairseqAdam

from fairseq_plugins.modules.floater import update_count
from fairseq_plugins.modules.floater.update_count import UncountedUpdateError
from helpers.floater_helpers import (  # noqa: F401  (one_thread: autouse fixture)
    batch,
    floater_model,
    flows,
    one_thread,
    train_updates,
)

EVERY = 3


def theta(model):
    return [p for flow in flows(model) for p in flow.dynamics.parameters()]


def counter(model):
    return flows(model)[0]._num_updates


def resumed(whole=False):
    """A model loaded from a checkpoint at update 4 (not a multiple of 3), trained to there the way fairseq does:
    its next update reuses the cached biases of update 3."""
    kw = dict(floater_update_every=EVERY, floater_cache_whole_bias=whole)
    trained = floater_model(**kw)
    for _ in train_updates(trained, 4):
        pass
    model = floater_model(seed=5, **kw)
    model.load_state_dict(trained.state_dict())
    assert counter(model) == 4
    return model


def by_hand(params):
    """An update written by hand under no_grad (in place: the parameters' version counters move)."""

    class ByHand:
        def step(self):
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.sub_(0.05 * p.grad)

        def zero_grad(self):
            for p in params:
                p.grad = None

    return ByHand()


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05),
    "fused_adam": lambda params: torch.optim.Adam(params, lr=1e-3, fused=True),  # no version counter moves
    "fairseq_adam": lambda params: FairseqAdam(params, lr=1e-3),  # updates through .data: no counter moves
    "by_hand": by_hand,
}


def own_loop(model, optimizer, steps, forwards=1):
    """forward(s) and backward, step, zero_grad; never set_num_updates. Per step: the counter each forward saw,
    whether θ got a gradient, whether θ moved."""
    model.train()
    facts = []
    for k in range(steps):
        seen = []
        for m in range(forwards):
            model(*batch(seed=10 * k + m))[0].pow(2).mean().backward()
            seen.append(counter(model))
        grad = any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in theta(model))
        before = [p.detach().clone() for p in theta(model)]
        optimizer.step()
        optimizer.zero_grad()
        moved = any(not torch.equal(b, p) for b, p in zip(before, theta(model)))
        facts.append(dict(seen=seen, grad=grad, moved=moved))
    return facts


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_own_loop_counts_its_steps_and_theta_trains_every_n(kind):
    model = resumed()
    facts = own_loop(model, OPTIMIZERS[kind](list(model.parameters())), 7)
    assert [f["seen"] for f in facts] == [[4 + k] for k in range(7)]
    resolves = [(4 + k) % EVERY == 0 for k in range(7)]  # updates 6 and 9
    assert [f["grad"] for f in facts] == resolves
    assert [f["moved"] for f in facts] == resolves
    # a checkpoint saved after the last step holds the update about to run, and counting goes on from there
    saved = {k: int(v) for k, v in model.state_dict().items() if k.endswith(".num_updates")}
    assert len(saved) == 3 and set(saved.values()) == {11}
    assert own_loop(model, OPTIMIZERS[kind](list(model.parameters())), 1)[0]["seen"] == [11]


def test_gradient_accumulation_counts_steps_not_forwards():
    model = resumed(whole=True)  # b(0) sits out the cached updates too: other parameters show the step
    facts = own_loop(model, torch.optim.SGD(model.parameters(), lr=0.05), 4, forwards=2)
    assert [f["seen"] for f in facts] == [[4, 4], [5, 5], [6, 6], [7, 7]]
    assert [f["grad"] for f in facts] == [False, False, True, False]


def test_a_copy_counts_its_own_steps():
    model = copy.deepcopy(resumed())
    facts = own_loop(model, torch.optim.Adam(model.parameters(), lr=1e-3, fused=True), 3)
    assert [f["seen"] for f in facts] == [[4], [5], [6]] and facts[2]["grad"]


def test_set_load_skip_and_validation_count_nothing_extra():
    model = resumed()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    checkpoint = copy.deepcopy(model.state_dict())  # at update 4
    own_loop(model, opt, 2)  # updates 4, 5
    model.set_num_updates(8)  # after a step: the number set stands, nothing is added to it
    assert [f["seen"] for f in own_loop(model, opt, 2)] == [[8], [9]]
    model.load_state_dict(checkpoint)  # after a step too
    assert [f["seen"] for f in own_loop(model, opt, 1)] == [[4]]
    model(*batch())[0].pow(2).mean().backward()  # update 5, its step skipped (GradScaler on an overflow)
    opt.zero_grad()
    model.eval()  # validation between two updates
    with torch.no_grad():
        model(*batch())
    assert [f["seen"] for f in own_loop(model, opt, 2)] == [[5], [6]]


def test_update_through_data_refused_in_one_line():
    """An update the model cannot see (fairseq's FP16Optimizer copies its float32 step back through .data)."""
    model = resumed().train()
    model(*batch())[0].pow(2).mean().backward()
    for p in model.parameters():
        if p.grad is not None:
            p.data.add_(p.grad, alpha=-0.05)
        p.grad = None
    with pytest.raises(UncountedUpdateError) as err:
        model(*batch())
    message = str(err.value)
    assert "\n" not in message
    assert "model.set_num_updates(i)" in message and "--floater-update-every 3" in message


def fairseq_loop(model, sets, micro_batches=2):
    """fairseq's trainer in miniature: set_num_updates before every micro-batch's forward (the task's train_step),
    with the numbers given (a repeated one: an update whose step overflowed); the counter each forward saw."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    seen = []
    for k, number in enumerate(sets):
        for m in range(micro_batches):
            model.set_num_updates(number)
            model(*batch(seed=10 * k + m))[0].pow(2).mean().backward()
            seen.append(counter(model))
        opt.step()
        opt.zero_grad()
    return seen


def test_fairseq_trainer_way_is_as_before(monkeypatch):
    """set_num_updates before every forward: the counter is what was set, the trained model bit for bit the one
    without the model's own count."""
    sets = [4, 5, 5, 6, 7, 9, 10]
    model = resumed()
    assert fairseq_loop(model, sets) == [n for n in sets for _ in range(2)]
    monkeypatch.setattr(update_count.UpdateCounter, "observe", lambda self: None)
    without = resumed()
    fairseq_loop(without, sets)
    for (name, p), q in zip(model.state_dict().items(), without.state_dict().values()):
        assert name.endswith("_float_tensor") or torch.equal(p, q), name  # (fairseq's uninitialised buffer)



class RecordOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_counting_is_host_only(monkeypatch):
    """At a forward no device work but the counter buffers' fill (as set_num_updates fills them), the fairseq way
    or one's own once a step was seen: no copy, no comparison, no sync."""
    work = []
    observe = update_count.UpdateCounter.observe

    def recorded(self):
        with RecordOps() as ops:
            observe(self)
        work.append(ops.names)

    theirs, ours = resumed(), resumed()
    monkeypatch.setattr(update_count.UpdateCounter, "observe", recorded)
    fairseq_loop(theirs, [4, 5, 6])
    assert work == [[]] * 6
    work.clear()
    own_loop(ours, torch.optim.SGD(ours.parameters(), lr=0.05), 4, forwards=2)
    # the first update's forwards keep one weight to compare (no step seen yet), the second compares it
    assert work[:2] == [["detach", "clone"], ["detach", "clone", "equal"]]
    assert work[2:] == [["fill_"] * 3, [], ["fill_"] * 3, [], ["fill_"] * 3, []]  # one count per step


@pytest.mark.parametrize("every", [1, EVERY])
@pytest.mark.parametrize("to_none", [True, False])
def test_shared_solve_in_an_own_loop_without_all_reduce_grads_is_refused(every, to_none):
    """--floater-shared-solve in a loop of one's own that steps without the model's all_reduce_grads(): θ never got
    its gradient, and the next forward said nothing (zero_grad() to None looked like fairseq's out-of-memory
    recovery; in place, the same update number looked like its next micro-batch). Now it stops in one line; with
    all_reduce_grads() θ trains, and gradients zeroed without a step still drop the solve quietly."""
    from fairseq_plugins.modules.floater.shared_solve import SharedSolveError

    model = floater_model(floater_shared_solve=True, floater_update_every=every).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model(*batch(seed=1))[0].pow(2).mean().backward()
    opt.zero_grad(set_to_none=to_none)  # no step: the recovery from an out-of-memory micro-batch
    model(*batch(seed=2))[0].pow(2).mean().backward()
    model.all_reduce_grads()
    before = [p.detach().clone() for p in theta(model)]
    opt.step()
    opt.zero_grad(set_to_none=to_none)
    assert any(not torch.equal(b, p) for b, p in zip(before, theta(model)))
    for k in range(every - 1):  # to the next re-solve (every update with N = 1)
        model(*batch(seed=10 + k))[0].pow(2).mean().backward()
        model.all_reduce_grads()
        opt.step()
        opt.zero_grad(set_to_none=to_none)
    assert (counter(model) + 1) % every == 0  # the next forward is a re-solve
    model(*batch(seed=3))[0].pow(2).mean().backward()
    opt.step()  # without model.all_reduce_grads()
    opt.zero_grad(set_to_none=to_none)
    with pytest.raises(SharedSolveError) as err:
        model(*batch(seed=4))
    message = str(err.value)
    assert "\n" not in message and "model.all_reduce_grads()" in message and "before the step" in message
