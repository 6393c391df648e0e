"""torch.cuda's streams and events for CPU test layers (tests/helpers/cuda_graph_emulation.py, tests/helpers/fake_cuda/): CPU work
is synchronous, so waits order nothing; a subclass's ``host_sync`` hears of every synchronize."""
import contextlib


class Stream:
    """torch.cuda.Stream: an id. wait_stream/wait_event order nothing (no device work to order)."""

    _next = 1

    def __init__(self, device=None, priority=0, stream_id=None, **kwargs):
        if stream_id is None:
            stream_id, Stream._next = Stream._next, Stream._next + 1
        self.stream_id, self.device, self.priority = stream_id, device, priority

    def host_sync(self, what):
        """Called on every host synchronisation with this stream."""

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or self.event_type()
        event.record(self)
        return event

    def query(self):
        return True

    def synchronize(self):
        self.host_sync("torch.cuda.Stream.synchronize")

    def __eq__(self, other):
        return isinstance(other, Stream) and other.stream_id == self.stream_id

    def __hash__(self):
        return hash(self.stream_id)


class Event:
    """torch.cuda.Event: record/wait do nothing; no timing."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, **kwargs):
        pass

    def host_sync(self, what):
        """Called on every host synchronisation with this event."""

    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        self.host_sync("torch.cuda.Event.synchronize")

    def elapsed_time(self, end):
        raise RuntimeError("CPU stand-in events have no timings")


Stream.event_type = Event


class Streams:
    """One stand-in device's streams: default_stream, current_stream and the stream(s) context, as torch.cuda's."""

    def __init__(self, default):
        self.default, self._current = default, [default]

    def current_stream(self, device=None):
        return self._current[-1]

    def default_stream(self, device=None):
        return self.default

    @contextlib.contextmanager
    def stream(self, s):
        """torch.cuda.stream: makes s the current stream for the block (None: no change), and on leaving it the
        stream that was current on entering it, whatever an inner block left current (torch's StreamContext)."""
        depth = len(self._current)
        self._current.append(s if s is not None else self._current[-1])
        try:
            yield
        finally:
            del self._current[depth:]

    def reset(self):
        """The default stream current again (a block left without restoring its stream must not outlive a test)."""
        del self._current[1:]
