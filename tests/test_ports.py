"""The ports the tests hand to the processes they start (helpers.small_task.free_port): a port the kernel gives
out as ephemeral, found free and released, can be taken by another xdist worker's connection before the test's
process binds it; so free_port stays below the ephemeral range, each worker in its own slice."""
import socket

import pytest

from helpers import small_task
from helpers.small_task import PORT_FLOOR, ephemeral_range, free_port, port_slice

pytestmark = pytest.mark.skipif(ephemeral_range()[0] <= PORT_FLOOR, reason=(
    f"the kernel lends every port from {ephemeral_range()[0]} as ephemeral: free_port can only take its choice"))


def test_ports_are_never_ephemeral_and_never_repeat():
    low, high = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert all(PORT_FLOOR <= p < low for p in ports), (ports, low, high)
    assert len(set(ports)) == len(ports)


def test_workers_draw_from_disjoint_slices():
    slices = [port_slice(f"gw{i}", 4) for i in range(4)]
    for (a0, a1), (b0, b1) in zip(slices, slices[1:]):
        assert a0 < a1 <= b0 < b1
    assert slices[0][0] == PORT_FLOOR and slices[-1][1] <= ephemeral_range()[0]
    assert port_slice("master", 1) == (PORT_FLOOR, ephemeral_range()[0])


def test_a_port_someone_holds_is_skipped():
    free_port()
    nxt = small_task._next_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", nxt))
        held.listen()
        assert free_port() != nxt
