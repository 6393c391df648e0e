"""What a fairseq process must finish at exit, while Python is still whole (atexit runs before the interpreter is
torn down): threads that would otherwise re-enter a finalizing interpreter from C++ code abort a run that ended
("terminate called without an active exception", exit status -6 or 134, or a segfault)."""
import atexit
import sys
import threading
import time

SETTLE_SECONDS = 10  # how long a data thread may take to finish the batch it is making


def register():
    if not getattr(register, "done", False):  # once, whatever the number of imports
        register.done = True
        atexit.register(_at_exit)


def _at_exit():
    _settle_data_threads()
    _destroy_gloo_process_group()


def _settle_data_threads():
    """fairseq makes batches ahead in a daemon thread (BufferedIterator's BackgroundConsumer). When a run ends
    early (an error raised by a training step, which the plugins' one-line refusals are), that thread is often
    inside torch's C++ code with the GIL released, making the next batch; a finalizing interpreter answers its
    request for the GIL with pthread_exit, whose unwinding through C++ frames aborts the process after the error
    was printed. Waiting until each such thread is blocked on its full queue (a pure Python wait, where a
    finalizing interpreter leaves it be) or has ended closes that window."""
    iterators = sys.modules.get("fairseq.data.iterators")
    consumer = getattr(iterators, "BackgroundConsumer", None)
    if consumer is None:
        return
    deadline = time.monotonic() + SETTLE_SECONDS
    for thread in threading.enumerate():
        if not isinstance(thread, consumer):
            continue
        waiting = getattr(getattr(thread, "_queue", None), "not_full", None)
        while thread.is_alive() and not getattr(waiting, "_waiters", None) and time.monotonic() < deadline:
            thread.join(0.01)


def _destroy_gloo_process_group():
    """fairseq returns from training without destroying its process group. A gloo group's worker threads can
    still hold finished work (tensors) when the interpreter shuts down; releasing it then takes the GIL, which
    a finalizing interpreter no longer grants, and a run that finished aborts ("terminate called without an
    active exception", exit status -6, or a segfault). Destroyed at exit, while Python is still whole, the group
    goes quietly. Gloo only: NCCL's teardown is left to torch, as fairseq leaves it.

    Dropping the references is not enough: under pytorch_ddp the DistributedDataParallel wrapper holds fairseq's
    data-parallel group (its process_group and its C++ reducer) and sits in a reference cycle (a closure of its
    own hooks), which only the cyclic collector frees. Whether the collector has run since training returned
    depends on allocation counts, and so on how long the ranks polled each other's stores: under load it often
    had not, and the group's threads lived into shutdown. So the handler collects, while Python is whole."""
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()
        _drop_group_references(dist.ProcessGroup)
        gc.collect()


def _drop_group_references(group_type):
    """destroy_process_group() unregisters every group, but a group (and its threads) lives on while Python
    holds it. Two references do in every fairseq run: fairseq caches its data-parallel group on
    get_global_group, and torch.distributed.nn.functional, first imported after the group's creation (by
    torch.optim's first optimizer), binds the world group as its functions' default ``group``."""
    fairseq_distributed = sys.modules.get("fairseq.distributed.utils")
    if fairseq_distributed is not None:
        vars(fairseq_distributed.get_global_group).pop("_global_group", None)
    functional = sys.modules.get("torch.distributed.nn.functional")
    for f in vars(functional).values() if functional is not None else ():
        defaults = getattr(f, "__defaults__", None)
        if isinstance(defaults, tuple) and any(isinstance(d, group_type) for d in defaults):
            f.__defaults__ = tuple(None if isinstance(d, group_type) else d for d in defaults)


