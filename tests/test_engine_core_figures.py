"""Figures from vLLM's engine core to its frontend in another process (engine_core_figures), over real
Unix stream sockets between real processes; vLLM itself is not needed here (tests/vllm runs it)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from otel_llm.integrations.vllm.engine_core_figures import (
    EngineCoreFigures,
    FrontendFigures,
    address,
    decode,
    encode,
)
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
    table = [line for line in engine_core_figures.lines(result) if line.startswith("| ")]
    assert len(table) == 1 + 3 and all("nan" not in line for line in table)  # the header, a row per kind
