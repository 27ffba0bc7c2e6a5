"""Figures from vLLM's engine core to its frontend in another process (engine_core_figures), over real
Unix stream sockets between real processes; vLLM itself is not needed here (tests/vllm runs it)."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import pytest

from otel_llm.integrations.vllm.compositions import MAX_PENDING_STEPS, Compositions
from otel_llm.integrations.vllm.engine_core_figures import MAX_HELD_STEPS, EngineCoreFigures
from otel_llm.integrations.vllm.figure_lines import address, decode, encode, encode_step
from otel_llm.integrations.vllm.frontend_figures import FrontendFigures
from otel_llm.integrations.vllm.rescheduling import Reschedulings

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets: Linux")

# A timestamp whose repr needs all 17 digits: it must arrive bit for bit.
TS = 12345.678901234567


def engine_core(figures: list[tuple[str, float, int, int]]) -> dict[str, int]:
    """Send ``figures`` from a child process, as an engine core does (to its parent's pid)."""
    code = textwrap.dedent(
        f"""
        import json, sys
        from otel_llm.integrations.vllm.engine_core_figures import EngineCoreFigures
        sender = EngineCoreFigures()
        sender.send({figures!r})
        print(json.dumps({{"sent": sender.sent, "lost": sender.lost}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_child_engine_cores_figures_reach_the_frontend_of_its_client_exactly() -> None:
    first, second = FrontendFigures(os.getpid(), 0), FrontendFigures(os.getpid(), 1)
    try:
        counts = engine_core([("cmpl-a-0", TS, 64, 0), ("cmpl b 1", TS + 1, 0, 1), ("cmpl-c-0", 2.5, 32, 0)])
        assert counts == {"sent": 3, "lost": 0}
        assert first.drain() == [("cmpl-a-0", TS, 64), ("cmpl-c-0", 2.5, 32)]
        assert second.drain() == [("cmpl b 1", TS + 1, 0)]  # an id with spaces keeps them
        assert first.drain() == [] and second.drain() == []  # read once
    finally:
        first.close()
        second.close()


def engine_core_steps(steps: list[tuple[float, dict[str, int], list[str] | None]], clients: list[int]) -> int:
    """Send ``steps`` from a child process, as an engine core does after learning ``clients``; returns the
    step lines it wrote."""
    code = textwrap.dedent(
        f"""
        from otel_llm.integrations.vllm.engine_core_figures import EngineCoreFigures
        sender = EngineCoreFigures()
        sender.clients.update({clients!r})
        for ts, scheduled, recompute in {steps!r}:
            sender.send([], (ts, scheduled, sum(scheduled.values()), recompute))
        print(sender.steps_sent, sender.steps_lost)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    sent, lost = map(int, done.stdout.split())
    assert lost == 0
    return sent


def test_a_steps_figures_and_its_line_arrive_together() -> None:
    frontend = FrontendFigures(os.getpid(), 12)
    try:
        sender = EngineCoreFigures()
        sender._parent = os.getpid()
        sender.clients = {12}
        sender.send([("req-1", TS, 64, 12)], (TS, {"req-1": 32, "req-2": 1}, 33, ["req-1"]))
        assert (sender.sent, sender.steps_sent, sender.lost, sender.steps_lost) == (1, 1, 0, 0)
        assert frontend.drain() == [("req-1", TS, 64)]
        assert frontend.take_steps() == [(TS, {"req-1": 32, "req-2": 1}, ["req-1"])]
    finally:
        frontend.close()


def test_an_api_server_whose_requests_all_wait_still_gets_its_next_figure_before_its_outputs() -> None:
    """Two API servers; for 2000 steps only the first one's request runs, and the second reads nothing
    (a frontend reads as its outputs arrive, and it has none). Then its own request is rescheduled: in
    the one read that comes before that step's outputs, the figure is there, after the steps it missed
    that the engine core held for it (the newest MAX_HELD_STEPS), in order. Sent one write per step,
    those steps would have filled the stream's buffer long before (some 280 small writes), and the
    figure would wait behind them in the engine core."""
    first, second = FrontendFigures(os.getpid(), 20), FrontendFigures(os.getpid(), 21)
    requests = {"a": SimpleNamespace(client_index=20), "b": SimpleNamespace(client_index=21)}
    try:
        sender = EngineCoreFigures()
        sender._parent = os.getpid()
        sender.clients = {20, 21}
        for k in range(2000):
            sender.send([], (float(k), {"a": 1}, 1, None), requests)
            if k % 50 == 0:
                first.drain()  # the first API server reads as its outputs arrive
        sender.send([("b", 2000.5, 32, 21)], (2000.0, {"a": 1, "b": 7}, 8, ["b"]), requests)
        assert second.drain() == [("b", 2000.5, 32)]
        steps = second.take_steps()
        assert [ts for ts, _, _ in steps] == [float(k) for k in range(2000 - MAX_HELD_STEPS, 2001)]
        assert steps[-1] == (2000.0, {"a": 1, "b": 7}, ["b"])
        first.drain()
        # It took none: it keeps the newest MAX_PENDING_STEPS of the 2001.
        assert len(first.take_steps()) == MAX_PENDING_STEPS
        assert (sender.lost, sender.steps_lost) == (0, 0)
    finally:
        first.close()
        second.close()


def test_a_child_engine_cores_steps_reach_every_frontend_it_knows_in_order() -> None:
    """Each step goes to the frontend of every client index seen (a request's stalls come from the whole
    step, whichever API server its other requests came through); a decode step, a prefill chunk beside
    decodes, a recompute, and an id with a space (dropped: its count disagrees)."""
    first, second = FrontendFigures(os.getpid(), 10), FrontendFigures(os.getpid(), 11)
    steps = [
        (TS, {"cmpl-a-0": 1, "cmpl-b-0": 1}, None),
        (TS + 0.01, {"cmpl-a-0": 1, "cmpl-c-0": 512, "cmpl-b-0": 1}, None),
        (TS + 0.02, {"cmpl-b-0": 1, "cmpl-a-0": 97}, ["cmpl-a-0"]),
        (TS + 0.03, {"cmpl d 0": 1}, None),
        (TS + 0.04, {"cmpl-b-0": 2}, None),
    ]
    try:
        assert engine_core_steps(steps, [10, 11]) == 2 * len(steps)
        for frontend in (first, second):
            assert frontend.drain() == []  # no figure, only steps
            assert frontend.take_steps() == [steps[0], steps[1], steps[2], steps[4]]
            assert frontend.take_steps() == []  # taken once
    finally:
        first.close()
        second.close()


def test_a_step_line_that_does_not_parse_is_dropped() -> None:
    good = encode_step(2.5, {"a": 3, "b": 1}, 4, ["a"])
    assert good == b"S 2.5 2 3,1 0 a b\n"
    assert encode_step(1.0, {"a": 1, "b": 1}, 2, None) == b"S 1.0 2 - - a b\n"  # a decode step: no counts
    bad = [
        b"S 1.0 3 - - a b",  # three requests said, two named
        b"S 1.0 2 1 - a b",  # one count for two
        b"S 1.0 2 0,1 - a b",  # a request computing nothing
        b"S 1.0 2 - 2 a b",  # a recompute position past the end
        b"S nan 1 - - a",
        b"S 1.0 x - - a",
        b"S 1.0 1 -",
    ]
    steps: list = []
    assert decode(b"\n".join([*bad, good]) + b"\n", steps) == []
    assert steps == [(2.5, {"a": 3, "b": 1}, ["a"])]
    assert decode(good) == []  # a reader of figures only drops steps


def test_with_no_frontend_listening_the_engine_core_loses_quietly_and_stops_trying() -> None:
    assert engine_core([("a", 1.0, 1, 7)]) == {"sent": 0, "lost": 1}
    sender = EngineCoreFigures()
    sender._parent = os.getpid()  # no socket under this pid and client 9
    sender.send([("a", 1.0, 1, 9)])
    sender.send([("b", 2.0, 1, 9)])  # within the quiet interval: not even tried
    assert (sender.sent, sender.lost) == (0, 2)
    assert address(os.getpid(), 9) in sender._quiet_until


def test_more_figures_than_a_datagram_queue_holds_all_arrive() -> None:
    """A frontend hundreds of steps behind its engine core still gets every figure, in order: the stream
    takes a few hundred writes (a Unix datagram socket holds 10), then the engine core holds the rest
    (bounded) and writes it with its next figures once the frontend has read."""
    frontend = FrontendFigures(os.getpid(), 2)
    try:
        sender = EngineCoreFigures()
        sender._parent = os.getpid()
        for k in range(500):
            sender.send([(f"req-{k}", float(k), k, 2)])
        assert (sender.sent, sender.lost) == (500, 0)
        first = frontend.drain()
        assert len(first) > 10
        sender.send([("req-500", 500.0, 500, 2)])
        assert first + frontend.drain() == [(f"req-{k}", float(k), k) for k in range(501)]
    finally:
        frontend.close()


def test_a_frontend_that_never_reads_never_blocks_the_engine_core(caplog: pytest.LogCaptureFixture) -> None:
    frontend = FrontendFigures(os.getpid(), 3)
    try:
        sender = EngineCoreFigures()
        sender._parent = os.getpid()

        def flood() -> None:
            for k in range(100_000):  # far beyond the stream's buffers
                sender.send([(f"req-{k}", float(k), k, 3)])

        with caplog.at_level(logging.WARNING):
            engine = threading.Thread(target=flood, daemon=True)
            engine.start()
            engine.join(timeout=120)
        assert not engine.is_alive(), "a send blocked on a frontend that reads nothing"
        assert sender.lost > 0 and sender.sent + sender.lost == 100_000
        warnings = [r for r in caplog.records if "could not send" in r.getMessage()]
        assert len(warnings) == 1
        drained = frontend.drain()
        # What was written arrives whole and in order, every line parsed (none cut in two).
        assert drained[:2] == [("req-0", 0.0, 0), ("req-1", 1.0, 1)]
        assert all(rid == f"req-{k}" and ts == float(k) for rid, ts, k in drained)
        assert len(drained) <= sender.sent
    finally:
        frontend.close()


def test_a_frontend_restarted_under_the_same_key_gets_the_figures_after_it() -> None:
    sender = EngineCoreFigures()
    sender._parent = os.getpid()
    first = FrontendFigures(os.getpid(), 8)
    sender.send([("a", 1.0, 1, 8)])
    assert first.drain() == [("a", 1.0, 1)]
    first.close()
    sender.send([("b", 2.0, 2, 8)])  # to a closed frontend: lost, the connection dropped
    second = FrontendFigures(os.getpid(), 8)
    try:
        sender.send([("c", 3.0, 3, 8)])
        sender.send([("d", 4.0, 4, 8)])
        assert [rid for rid, _, _ in second.drain()] in (["c", "d"], ["d"])
        assert sender.lost >= 1
    finally:
        second.close()


def test_engine_cores_that_come_and_go_are_each_read_and_a_closed_frontend_reads_nothing() -> None:
    """The frontend polls its listener and connections: one that hung up is dropped after its last line,
    one that connects later is read, a write larger than one read arrives whole, and after ``close``
    a drain finds nothing."""
    frontend = FrontendFigures(os.getpid(), 6)
    try:
        assert frontend.drain() == []  # nothing connected yet
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as first:
            first.connect(address(os.getpid(), 6))
            first.sendall(encode([("a", 1.0, 1)]))
        assert frontend.drain() == [("a", 1.0, 1)]
        frontend.drain()  # the hang-up, if the first drain did not see it
        assert frontend._readers == {}
        many = [(f"req-{i:06d}", 2.0 + i, i) for i in range(8000)]  # some 200 KB: several reads
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as second:
            second.connect(address(os.getpid(), 6))
            # Written from a thread of its own, as an engine core writes from its process: more than a
            # socket buffer may hold, so a write here would wait on the reads below.
            writer = threading.Thread(target=second.sendall, args=(encode(many),))
            writer.start()
            found: list[tuple[str, float, int]] = []
            for _ in range(2000):
                found += frontend.drain()
                if len(found) == len(many):
                    break
                time.sleep(0.005)
            writer.join(timeout=30)
        assert found == many
    finally:
        frontend.close()
    assert frontend.drain() == [] and frontend.take_steps() == []


def test_a_second_frontend_under_the_same_key_cannot_bind() -> None:
    frontend = FrontendFigures(os.getpid(), 4)
    try:
        with pytest.raises(OSError):
            FrontendFigures(os.getpid(), 4)
    finally:
        frontend.close()


def test_what_does_not_parse_is_dropped() -> None:
    assert decode(b"1.5 3 ok\nnot a line\n2.0 x bad\nnan 1 nan-ts\n1.0 -1 negative\n\n3.0 4 \n") == [
        ("ok", 1.5, 3)
    ]
    assert decode(b"\xff\xfe 1 2") == []
    assert decode(encode([("a\nb", 1.0, 1), ("c", 2.0, 2)])) == [("c", 2.0, 2)]  # no id with a newline


def test_a_stranger_writing_to_the_socket_is_ignored() -> None:
    frontend = FrontendFigures(os.getpid(), 5)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stranger:
            stranger.connect(address(os.getpid(), 5))
            stranger.sendall(b"\x00\x01garbage\n7.0 12 req-1\n8.0 3 cut-")
            assert frontend.drain() == [("req-1", 7.0, 12)]
            stranger.sendall(b"short\n")  # the rest of a line read in two parts
            assert frontend.drain() == [("cut-short", 8.0, 3)]
    finally:
        frontend.close()


def test_a_rescheduling_takes_its_figure_from_the_socket_or_says_once_that_none_came(
    caplog: pytest.LogCaptureFixture,
) -> None:
    frontend = FrontendFigures(os.getpid(), 6)
    try:
        kept = Reschedulings()
        kept.sources.append(frontend.drain)
        assert engine_core([("req-1", TS, 96, 6)])["sent"] == 1
        with caplog.at_level(logging.WARNING):
            assert kept.take_rescheduling("req-1", TS) == 96
            assert kept.take_rescheduling("req-1", TS) is None  # taken once
            assert kept.take_rescheduling("req-2", 1.0) is None
        assert kept.missing == 2
        said = [r for r in caplog.records if "did not say what it found cached" in r.getMessage()]
        assert len(said) == 1  # once, not per rescheduling
    finally:
        frontend.close()


def test_the_engine_core_benchmark_measures_each_step_kind_and_loses_nothing() -> None:
    from benchmarks import engine_core_figures

    result = engine_core_figures.measure(quick=True)
    assert [row["resumed"] for row in result["rows"]] == [0, 1, 4]
    assert all(row["bare_ns"] > 0 for row in result["rows"])
    assert result["lost"] == 0 and result["received"] == result["sent"] > 0
    assert result["steps_sent"] > 0  # the variant with a frontend known wrote each step's line
    table = [line for line in engine_core_figures.lines(result) if line.startswith("| ")]
    # The header, a row per kind, and the decode step whose batch changed (its ids named in full).
    assert len(table) == 1 + 3 + 1 and all("nan" not in line for line in table)
    assert all(line.count("|") == 6 for line in table)  # five columns: the step line's cost among them
    keys = ("read_empty_ns", "read_step_ns", "read_changed_ns", "changed_added_ns")
    assert all(math.isfinite(result[key]) for key in keys)  # the frontend's read, the changed batch
    read = [line for line in engine_core_figures.lines(result) if line.startswith("In the frontend")]
    assert len(read) == 1 and "nan" not in read[0]


def test_a_frontend_that_reads_hundreds_of_steps_ahead_of_their_outputs_keeps_every_one() -> None:
    """A frontend whose output loop was held up reads the engine core's lines many steps before their
    outputs arrive: 500 decode steps read at once, then the outputs one by one. Each step is taken
    when the outputs scheduled after it arrive, none dropped and none early."""
    frontend = FrontendFigures(os.getpid(), 46)
    try:
        sender = EngineCoreFigures()
        sender._parent = os.getpid()
        sender.clients = {46}
        batches = [{"a": 1, "b": 1}, {"a": 1, "b": 1, "c": 1}]
        for k in range(500):
            sender.send([], (float(k), batches[k // 100 % 2], 2 + k // 100 % 2, None))
        frontend.drain()
        pending = Compositions()
        for ts, scheduled, recompute in frontend.take_steps():
            pending.add(ts, scheduled, recompute)
        taken = [pending.due(k + 0.5) for k in range(500)]  # each step's outputs, stamped after it
        assert [[ts for ts, _, _ in due] for due in taken] == [[float(k)] for k in range(500)]
        assert [due[0][1] for due in taken] == [batches[k // 100 % 2] for k in range(500)]
        assert (sender.lost, sender.steps_lost) == (0, 0)
    finally:
        frontend.close()
