"""The engine core's ring of shared memory (``step_ring``): its lines reach the frontend through it,
not the socket, in order, across the ring's end and across processes; a decode batch that did not
change is written as ``=`` and read back whole; a file that is not a sealed ring is refused."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from otel_llm.integrations.vllm import engine_core_figures, step_ring
from otel_llm.integrations.vllm.compositions import MAX_PENDING_STEPS
from otel_llm.integrations.vllm.engine_core_figures import EngineCoreFigures
from otel_llm.integrations.vllm.figure_lines import address
from otel_llm.integrations.vllm.frontend_figures import FrontendFigures

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="memfd and abstract sockets: Linux"
)


def _sender(client: int) -> EngineCoreFigures:
    sender = EngineCoreFigures()
    sender._parent = os.getpid()  # this process stands in for the frontend
    sender.clients = {client}
    return sender


def test_once_connected_the_lines_go_through_the_ring_in_order_across_its_end() -> None:
    """Steps of 64 requests, some 3 KB a line named in full, are written until the ring has wrapped
    around several times, read every 50 steps; each step arrives once, in order, and after the first
    step the socket carries nothing."""
    frontend = FrontendFigures(os.getpid(), 40)
    try:
        sender = _sender(40)
        ids = [f"cmpl-{k:040x}-0" for k in range(64)]
        got = []
        for k in range(3000):
            order = ids[k % 64 :] + ids[: k % 64]  # another order each step: named in full each time
            scheduled = dict.fromkeys(order, 1)
            scheduled[ids[k % 64]] = 2
            sender.send([], (float(k), scheduled, 65, None))
            if k % 50 == 49:
                frontend.drain()
                got += frontend.take_steps()
        frontend.drain()
        got += frontend.take_steps()
        assert len(sender._rings) == 1  # the ring was made and handed over
        written = next(iter(sender._rings.values())).written
        assert written > 3 * step_ring.CAPACITY  # it wrapped around
        assert [ts for ts, _, _ in got] == [float(k) for k in range(3000)]
        for k, (_, scheduled, _) in enumerate(got):
            assert list(scheduled) == ids[k % 64 :] + ids[: k % 64] and scheduled[ids[k % 64]] == 2
        assert (sender.steps_sent, sender.steps_lost) == (3000, 0)
    finally:
        frontend.close()


def test_an_unchanged_decode_batch_is_written_as_the_same_ids_and_read_back_whole() -> None:
    assert engine_core_figures.SAME_LINES  # as vLLM's engine core runs it
    frontend = FrontendFigures(os.getpid(), 41)
    try:
        sender = _sender(41)
        decode = {"a": 1, "b": 1, "c": 1}
        sender.send([], (1.0, decode, 3, None))
        ring = next(iter(sender._rings.values()))
        first = ring.written
        sender.send([], (2.0, dict(decode), 3, None))
        assert ring.written - first == len(b"S 2.0 3 - - =\n")  # the ids are not written again
        sender.send([], (3.0, {"a": 1, "b": 5, "c": 1}, 7, ["b"]))  # same ids, other counts
        sender.send([], (4.0, dict(decode), 3, None))  # same ids, one token each again
        sender.send([], (5.0, {"a": 1, "c": 1}, 2, None))  # one left: named in full
        sender.send([], (6.0, {"a": 1, "c": 1}, 2, None))
        frontend.drain()
        assert frontend.take_steps() == [
            (1.0, decode, None),
            (2.0, decode, None),
            (3.0, {"a": 1, "b": 5, "c": 1}, ["b"]),
            (4.0, decode, None),
            (5.0, {"a": 1, "c": 1}, None),
            (6.0, {"a": 1, "c": 1}, None),
        ]
    finally:
        frontend.close()


def test_a_child_engine_core_writes_through_its_ring_to_the_frontend() -> None:
    """As vLLM runs it: the engine core in another process, its lines through the ring it made there."""
    frontend = FrontendFigures(os.getpid(), 42)
    steps = MAX_PENDING_STEPS + 200  # more than the frontend keeps of the steps it has not taken
    code = textwrap.dedent(
        """
        import json
        from otel_llm.integrations.vllm.engine_core_figures import EngineCoreFigures
        sender = EngineCoreFigures()
        sender.clients.add(42)
        for k in range(STEPS):
            found = [("req-%d" % k, k + 0.5, k, 42)] if k % 40 == 0 else []
            sender.send(found, (float(k), {"x": 1, "y": 1}, 2, None))
        print(json.dumps([len(sender._rings), sender.steps_sent, sender.sent]))
        """
    ).replace("STEPS", str(steps))
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [1, steps, len(range(0, steps, 40))]
        figures = frontend.drain()
        assert figures == [(f"req-{k}", k + 0.5, k) for k in range(0, steps, 40)]
        # The newest MAX_PENDING_STEPS of them: the frontend keeps no more of the steps not taken yet.
        newest = [float(k) for k in range(steps - MAX_PENDING_STEPS, steps)]
        assert [ts for ts, _, _ in frontend.take_steps()] == newest
    finally:
        frontend.close()


@pytest.mark.parametrize("size", [step_ring.SIZE, 4096])
def test_a_file_that_is_not_a_sealed_ring_of_its_size_is_refused(size: int) -> None:
    """An unsealed file of the right size (which its sender could shrink under the reader), or a file
    of another size: dropped, and the connection's lines still read from the socket."""
    frontend = FrontendFigures(os.getpid(), 43)
    try:
        fd = os.memfd_create("stranger")
        os.ftruncate(fd, size)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stranger:
            stranger.connect(address(os.getpid(), 43))
            socket.send_fds(stranger, [step_ring.ANNOUNCE + b"7.0 12 req-1\n"], [fd])
            os.close(fd)
            assert frontend.drain() == [("req-1", 7.0, 12)]
            assert frontend._rings == {}
    finally:
        frontend.close()


def test_a_closed_frontend_is_seen_through_its_ring_and_a_new_one_gets_the_lines() -> None:
    sender = _sender(44)
    first = FrontendFigures(os.getpid(), 44)
    sender.send([], (1.0, {"a": 1}, 1, None))
    first.drain()
    assert [ts for ts, _, _ in first.take_steps()] == [1.0]
    first.close()
    sender.send([], (2.0, {"a": 1}, 1, None))  # the ring says closed: lost, the connection dropped
    assert sender.steps_lost == 1 and sender._rings == {}
    second = FrontendFigures(os.getpid(), 44)
    try:
        sender._quiet_until.clear()
        sender.send([], (3.0, {"a": 1}, 1, None))
        second.drain()
        assert second.take_steps() == [(3.0, {"a": 1}, None)]  # named in full to the new frontend
    finally:
        second.close()


def test_a_frontend_reading_while_the_engine_core_writes_keeps_its_ring_and_every_step() -> None:
    """Both ends busy at once, in two processes, as under ``vllm serve``: the engine core writes step
    lines as fast as it can while the frontend reads in a loop. Each position in the ring's header is
    read and stored whole, so the frontend never sees a half-written one and never takes the ring for a
    stranger's (it would drop it, and the engine core would lose the steps it writes meanwhile). The
    child keeps within 32 lines of what the frontend has read, so a slow reader on a busy machine loses
    nothing (the ring is full at some 50,000 of these lines)."""
    steps = 60_000
    frontend = FrontendFigures(os.getpid(), 45)
    code = textwrap.dedent(
        f"""
        import os, socket, sys
        from otel_llm.integrations.vllm.figure_lines import address, encode_step
        from otel_llm.integrations.vllm.step_ring import READ, RingWriter
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(address({os.getpid()}, 45))
        ring = RingWriter.offer(connection)
        assert ring is not None
        for k in range({steps}):
            line = encode_step(float(k), {{"a": 1, "b": 1 + k % 3}}, 2 + k % 3, None)
            while ring.written - ring._words[READ] > 32 * len(line):
                os.sched_yield()  # the frontend is behind: let it read (it reads in a loop)
            while True:
                written = ring.write(line)
                if written is None:
                    sys.exit("the frontend closed the ring at step %d" % k)
                if written:
                    break
        """
    )
    got: list[float] = []
    try:
        child = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
        while len(got) < steps and child.poll() is None:
            frontend.drain()
            got.extend(ts for ts, _, _ in frontend.take_steps())
        frontend.drain()
        got.extend(ts for ts, _, _ in frontend.take_steps())
        _, errors = child.communicate(timeout=60)
        assert child.returncode == 0, errors
        assert got == [float(k) for k in range(steps)]
        assert len(frontend._rings) == 1
    finally:
        frontend.close()
