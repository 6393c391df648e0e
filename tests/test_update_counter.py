"""tooling/bench/update_ops.py's UpdateCounter sees every read of a device value that a GPU would wait on, also those
a CPU build serves without an operator, and names each by where it happens; a copy to the device is not a read.

Tensors made before the counter opens stand for device tensors (as the update's parameters and batches do); those
made inside without a device, or moved to the host, are host-side, and a read of theirs is a host read, not a sync.
Each kind of read below is one sync at its line, and the update's own counts (tests/test_fused_update.py's bounds)
see one added to the update.
"""
import numpy as np
import pytest
import torch

from helpers.tiny_models import one_thread  # noqa: F401  (one_thread: an autouse fixture)
from tooling.bench.update_ops import UpdateCounter

# each read on device tensors x (floats), m (a mask of x) and r (counts, as x's length): the aten operator or the
# Python call it is named by. One lambda a line: the line is where the read is recorded.
READS = {
    "cpu": ("cpu", lambda x, m, r: x.cpu()),
    "to_cpu": ("to(cpu)", lambda x, m, r: x.to("cpu")),
    "to_cpu_and_dtype": ("to(cpu)", lambda x, m, r: x.to("cpu", torch.float16)),
    "tolist": ("tolist", lambda x, m, r: x.tolist()),
    "numpy": ("numpy", lambda x, m, r: x.numpy()),
    "np_asarray": ("numpy", lambda x, m, r: np.asarray(x)),
    "boolean_mask": ("index", lambda x, m, r: x[m]),
    "assign_a_device_value_through_a_mask": ("index_put_", lambda x, m, r: x.clone().__setitem__(m, x[:1])),
    "masked_select": ("masked_select", lambda x, m, r: torch.masked_select(x, m)),
    "unique": ("_unique2", lambda x, m, r: torch.unique(r)),
    "unique_consecutive": ("unique_consecutive", lambda x, m, r: torch.unique_consecutive(r)),
    "repeat_interleave": ("repeat_interleave", lambda x, m, r: torch.repeat_interleave(x, r)),
    "bincount": ("bincount", lambda x, m, r: torch.bincount(r)),
    "histc_of_the_values_range": ("histc", lambda x, m, r: torch.histc(x, bins=4)),
    "allclose": ("allclose", lambda x, m, r: torch.allclose(x, x + 1)),
    "nonzero": ("nonzero", lambda x, m, r: torch.nonzero(m)),
    "where_of_a_mask": ("nonzero", lambda x, m, r: torch.where(m)),
    "item": ("_local_scalar_dense", lambda x, m, r: x.sum().item()),
    "read_of_torch_tensor_on_the_device":
        ("_local_scalar_dense", lambda x, m, r: torch.tensor(2.0, device=x.device).item()),
    "read_of_new_tensor": ("_local_scalar_dense", lambda x, m, r: bool(x.new_tensor([1.0]))),
    "read_of_a_host_value_moved_to_the_device": ("_local_scalar_dense", lambda x, m, r: float(torch.tensor(2.0).to(x))),
}

# no read: copies to the device, moves that stay on the device, reads of host-side tensors, operators whose output's
# size is given, and a host value filled in through a mask (masked_fill_)
NOT_SYNCS = {
    "torch_tensor_on_the_device": lambda x, m, r: torch.tensor([1.0, 2.0], device=x.device),
    "as_tensor_on_the_device": lambda x, m, r: torch.as_tensor([1.0], device=x.device),
    "to_the_devices_device": lambda x, m, r: x.to(x.device),
    "to_a_device_tensor": lambda x, m, r: x.to(r),
    "to_a_dtype": lambda x, m, r: x.to(torch.float16),
    "repeat_interleave_with_output_size": lambda x, m, r: torch.repeat_interleave(x, r, output_size=8),
    "repeat_interleave_by_a_number": lambda x, m, r: x.repeat_interleave(2),
    "histc_of_a_given_range": lambda x, m, r: torch.histc(x, bins=4, min=-1, max=1),
    "fill_a_host_value_through_a_mask": lambda x, m, r: x.clone().__setitem__(m, 0.0),
    "read_of_a_host_tensor": lambda x, m, r: torch.tensor([1.0, 2.0]).tolist(),
    "host_tensor_to_the_host": lambda x, m, r: torch.tensor([1.0]).cpu().numpy(),
}


def device_tensors():
    x = torch.randn(6, generator=torch.Generator().manual_seed(0))
    return x, x > 0, torch.tensor([1, 0, 2, 1, 3, 1])


def counted(read):
    tensors = device_tensors()
    with UpdateCounter() as counter:
        read(*tensors)
    return counter


@pytest.mark.parametrize("kind", list(READS))
def test_each_read_of_a_device_value_is_one_sync_named_at_its_line(kind):
    name, read = READS[kind]
    counter = counted(read)
    assert list(counter.syncs.items()) == [(f"{name} @ {__file__}:{read.__code__.co_firstlineno}", 1)], counter.syncs
    assert counter.host_reads == 0


@pytest.mark.parametrize("kind", list(NOT_SYNCS))
def test_copies_to_the_device_and_reads_of_host_values_are_not_syncs(kind):
    assert dict(counted(NOT_SYNCS[kind]).syncs) == {}


def test_a_move_to_the_host_is_the_one_sync_and_what_it_returns_is_host_side():
    """On a GPU `.cpu()` waits for the device and returns a host copy, whose values are then read without a sync;
    on CPU the same tensor comes back, which the counter must not take for host-side (later reads of the device
    tensor are syncs) nor read twice."""
    x, _, _ = device_tensors()
    with UpdateCounter() as counter:
        on_host = x.cpu()
        values = on_host.tolist()
        again = x.tolist()
    assert values == again == x.tolist()
    assert on_host is not x and torch.equal(on_host, x)
    assert sorted(site.split(" @ ")[0] for site in counter.syncs) == ["cpu", "tolist"]
    assert counter.host_reads == 1


def test_the_python_level_reads_add_no_operator():
    x, _, _ = device_tensors()
    with UpdateCounter() as counter:
        x.cpu(), x.to("cpu"), x.tolist(), x.numpy(), torch.tensor([1.0], device=x.device)
    assert counter.ops == 0 and sum(counter.syncs.values()) == 4


class ReadInBackward(torch.autograd.Function):
    """x · 2 whose backward reads its incoming gradient on the host (as a custom function's backward could)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        grad.cpu()
        return grad * 2


def test_a_read_in_a_backward_is_counted():
    """The backward pass runs inside `loss.backward()` (a torch function, and the autograd engine): a `.cpu()` of a
    custom autograd function's backward is a sync as in the forward."""
    x, _, _ = device_tensors()
    x.requires_grad_()
    with UpdateCounter() as counter:
        ReadInBackward.apply(x).sum().backward()
    line = ReadInBackward.backward.__code__.co_firstlineno + 2
    assert dict(counter.syncs) == {f"cpu @ {__file__}:{line}": 1}


def count_fused_update(read=None):
    """update_ops' row of the tiny Transformer's third fp32 update with --fused-update --adam-impl torch (0 syncs:
    tests/test_fused_update.py's bound), `read` applied to the decoder's output inside the update."""
    from tooling.bench import length_mix
    from tooling.bench.models import BASELINE, FUSED_UPDATE, model_specs, synthetic_dictionary
    from tooling.bench.regime import build_trainer, regime_archs
    from tooling.bench.update_ops import WARM_UPDATES, count_update

    dictionary = synthetic_dictionary(1000)
    arch, flags, kind = model_specs("tiny", 4, archs=regime_archs("tiny"))[BASELINE]
    trainer = build_trainer(arch, flags + list(FUSED_UPDATE), "fp32", dictionary, "cpu", 1, kind=kind)
    drawn, _, _ = length_mix.corpus(length_mix.load_pairs(), dictionary, 512, 8, 1)
    batches = sorted(drawn, key=lambda b: -b["nsentences"])[:WARM_UPDATES + 1]
    if read is not None:
        trainer.model.decoder.register_forward_hook(lambda module, inputs, out: read(out[0].detach()))
    return count_update(trainer, batches)


def test_a_read_added_to_the_update_is_counted_where_it_is():
    """What test_fused_update's bounds would see of a `.cpu()` or a boolean mask added to the update: each a sync
    named at its line, where the update had none; the operators as before but for the mask's."""
    plain = count_fused_update()

    def read(out):
        out.cpu()
        out[out > 0]

    added = count_fused_update(read)
    first = read.__code__.co_firstlineno
    assert plain["syncs"] == 0
    assert added["sync_sites"] == {f"cpu @ {__file__}:{first + 1}": 1, f"index @ {__file__}:{first + 2}": 1}
    assert added["ops"] == plain["ops"] + 2  # the mask's gt and index
