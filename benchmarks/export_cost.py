"""What encoding and sending otel_llm's spans costs the process that exports them.

``python -m benchmarks.export_cost [--quick]`` prints a Markdown section; ``measure(quick)`` and
``lines(result)`` give the same to another report (``benchmarks.vllm_cost``). ``--quick`` runs in seconds
at tiny repeat counts; its numbers mean little, it proves the harness runs.

The spans are the real ones: a ``RequestTracker`` (detail ``phases``) driven through its five hooks for a
few hundred requests in batches, a quarter of them preempted once, collected as the SDK's
``ReadableSpan`` objects (``llm.request`` with queue, prefill and decode children, plus preempted and
recompute spans). A pool of ``POOL`` spans is then, per variant, cut into batches and:

- encoded only: the OTLP trace encoder every standard exporter uses (``encode_spans(batch)`` then
  ``SerializeToString()``);
- exported: ``export(batch)`` of the standard ``OTLPSpanExporter``, gRPC or HTTP/protobuf, compression
  none or gzip, to a real receiver in another process (``benchmarks.export_receiver``), so the
  receiver's decoding is not charged here. Each export waits for the receiver's answer, as the batch
  span processor's worker thread does; every span is counted on arrival.

Clocks: CPU time, not wall clock, in nanoseconds, reported as microseconds per span. ``time.thread_time``
is the exporting thread's (the batch span processor's worker, in a real process);
``time.process_time`` is the whole process's, which also holds what gRPC's own threads spend. Variants
run interleaved, the starting variant rotated each round, the garbage collector off inside each timed
block; medians over rounds.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.export_report import lines
from benchmarks.timing import frozen_heap

__all__ = ["lines", "main", "measure"]

REPO = Path(__file__).resolve().parents[1]
POOL = 2048  # spans exported per variant and round: a whole number of batches of every size below
BATCH_SIZES = (64, 512, 2048)  # 512: the batch span processor's default max_export_batch_size
DEFAULT_BATCH = 512
COMPRESSIONS = ("none", "gzip")
PROTOCOLS = ("grpc", "http")
WAVE = 32  # requests that share engine steps
DECODE_STEPS = 24
PREEMPT_EVERY = 4  # every 4th request of a wave is preempted once during decode
TIMEOUT_S = 60.0  # generous: a loaded machine can starve the receiver, and a timed-out export is no sample


# --- the spans ----------------------------------------------------------------------------------------


def make_spans(min_spans: int) -> tuple[list[Any], dict[str, Any]]:
    """Drive a tracker until at least ``min_spans`` spans are finished; return them and how they came.

    The stats hold ``requests``, ``preempted`` (requests), ``spans``, ``names`` (spans per name) and
    ``finish_ns``: the thread CPU nanoseconds of the ``finished()`` calls, which build the SDK spans.
    """
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_llm import RequestTracker

    memory = InMemorySpanExporter()
    # Resource.create adds the SDK's telemetry.sdk.* attributes, as a configured process's resource has.
    provider = TracerProvider(resource=Resource.create({"service.name": "export-cost"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    # Metrics off: the finish CPU below is then the spans' alone.
    tracker = RequestTracker(
        tracer_provider=provider,
        meter_provider=NoOpMeterProvider(),
        model="bench-model",
        trace_detail="phases",
    )
    stats: dict[str, Any] = {"requests": 0, "preempted": 0, "finish_ns": 0}
    wave = 0
    while len(memory.get_finished_spans()) < min_spans:
        finish, preempted = _wave(tracker, wave)
        stats["finish_ns"] += finish
        stats["requests"] += WAVE
        stats["preempted"] += preempted
        wave += 1
    spans = list(memory.get_finished_spans())
    provider.shutdown()
    stats["spans"] = len(spans)
    stats["names"] = dict(Counter(s.name for s in spans))
    return spans, stats


def _wave(tracker: Any, wave: int) -> tuple[int, int]:
    """One batch of requests from queue to finish; (thread CPU ns of its finished() calls, preempted)."""
    ids = [f"w{wave}-r{i}" for i in range(WAVE)]
    victims = ids[::PREEMPT_EVERY]
    # Timestamps in the recent past (monotonic seconds), as an engine reports them, none in the future.
    t = time.monotonic() - 2.0
    for i, rid in enumerate(ids):
        tracker.queued(rid, ts=t, prompt_tokens=64 + 37 * i, attributes={"gen_ai.request.max_tokens": 256})
    t += 0.002
    tracker.scheduled(ids, ts=t)
    waiting: list[str] = []
    for step in range(DECODE_STEPS + 3):
        t += 0.02
        if step == 8:
            tracker.preempted(victims, ts=t)
            waiting = victims
        elif step == 11:
            tracker.scheduled(victims, ts=t)
            waiting = []
        # The preempted requests make up their three lost steps at the end; the others are done by then.
        running = ids if step < DECODE_STEPS else victims
        tracker.tokens([r for r in running if r not in waiting], ts=t)
    finish_started = time.thread_time_ns()
    for rid in ids:
        tracker.finished(rid, reason="stop", ts=t)
    ended = time.thread_time_ns()
    return ended - finish_started, len(victims)


# --- the receivers and exporters ----------------------------------------------------------------------


class Receiver:
    """A ``benchmarks.export_receiver`` child process for one protocol."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.export_receiver", protocol],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            # gRPC logs each connection the exporters close at the end as an info line; keep output clean.
            env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
        )
        try:
            self.port = int(self._ask(None))
        except BaseException:
            self.close()
            raise

    def _ask(self, command: str | None) -> str:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        if command is not None:
            self._proc.stdin.write(command + "\n")
            self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.protocol} receiver exited (code {self._proc.poll()})")
        return line.strip()

    def take(self) -> int:
        """Spans the receiver decoded since the last call."""
        return int(self._ask("take"))

    def close(self) -> None:
        """Ask the receiver to stop; kill it if it has not within 10 s."""
        if self._proc.poll() is not None:
            return
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write("quit\n")
            self._proc.stdin.close()
            self._proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait()


def exporter(protocol: str, compression: str, port: int) -> Any:
    """The standard OTLP span exporter for ``protocol`` and ``compression``, aimed at a loopback port."""
    if protocol == "grpc":
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        kind = grpc.Compression.Gzip if compression == "gzip" else grpc.Compression.NoCompression
        return OTLPSpanExporter(
            endpoint=f"127.0.0.1:{port}", insecure=True, compression=kind, timeout=TIMEOUT_S
        )
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    kind = Compression.Gzip if compression == "gzip" else Compression.NoCompression
    return HttpExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", compression=kind, timeout=TIMEOUT_S)


# --- timing -------------------------------------------------------------------------------------------


Work = Callable[[], None]


def _cpu(work: Work) -> tuple[int, int]:
    """(thread CPU ns, process CPU ns) of one call of ``work``, the garbage collector off meanwhile."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()  # a collection landing in one variant's block would be charged to it alone
    try:
        thread0, process0 = time.thread_time_ns(), time.process_time_ns()
        work()
        thread1, process1 = time.thread_time_ns(), time.process_time_ns()
    finally:
        if enabled:  # a caller that runs with the collector off keeps it off
            gc.enable()
    return thread1 - thread0, process1 - process0


def _batches(spans: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [spans[i : i + size] for i in range(0, len(spans), size)]


def _encode_work(batches: list[Sequence[Any]]) -> Work:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    def work() -> None:
        for batch in batches:
            encode_spans(batch).SerializeToString()

    return work


def _export_work(span_exporter: Any, batches: list[Sequence[Any]], failures: list[str]) -> Work:
    from opentelemetry.sdk.trace.export import SpanExportResult

    def work() -> None:
        for batch in batches:
            if span_exporter.export(batch) is not SpanExportResult.SUCCESS:
                failures.append(type(span_exporter).__module__)

    return work


def _build_work(stats: list[dict[str, Any]]) -> Work:
    def work() -> None:
        stats.append(make_spans(POOL)[1])

    return work


# --- the measurement ----------------------------------------------------------------------------------


def protobuf_backend() -> str:
    """The protobuf runtime in use: ``upb`` (C), ``cpp`` or ``python``."""
    from google.protobuf.internal import api_implementation

    return str(api_implementation.Type())


Key = tuple[str, str, int, str]  # (what, protocol or span name, batch size, compression)


def measure(quick: bool) -> dict[str, Any]:
    """Every variant's CPU per span (µs, medians over interleaved rounds), with what the spans were."""
    rounds = 2 if quick else 30  # two: the fewest that give quartiles
    spans, span_stats = make_spans(POOL)
    pool = spans[:POOL]
    receivers: dict[str, Receiver] = {}
    exporters: list[Any] = []
    failures: list[str] = []
    builds: list[dict[str, Any]] = []
    try:
        for protocol in PROTOCOLS:
            receivers[protocol] = Receiver(protocol)
        variants: dict[Key, Work] = {}
        for size in BATCH_SIZES:
            batches = _batches(pool, size)
            variants[("encode", "-", size, "none")] = _encode_work(batches)
            for protocol in PROTOCOLS:
                for compression in COMPRESSIONS:
                    made = exporter(protocol, compression, receivers[protocol].port)
                    exporters.append(made)
                    variants[("export", protocol, size, compression)] = _export_work(made, batches, failures)
        for kind in sorted(span_stats["names"]):
            # One batch of a default size, all of one kind: what the encoder's cost per span is made of.
            alike = [s for s in pool if s.name == kind]
            alike = (alike * (DEFAULT_BATCH // max(len(alike), 1) + 1))[:DEFAULT_BATCH]
            variants[("encode-kind", kind, DEFAULT_BATCH, "none")] = _encode_work([alike])
        variants[("build", "-", 0, "-")] = _build_work(builds)
        with frozen_heap():
            samples, beyond, received = _rounds(variants, receivers, rounds, warm_up=not quick)
    finally:
        for made in exporters:
            made.shutdown()
        for receiver in receivers.values():
            receiver.close()
    return {
        "quick": quick,
        "rounds": rounds,
        "protobuf": protobuf_backend(),
        "pool": POOL,
        "requests": span_stats["requests"],
        "preempted": span_stats["preempted"],
        "names": span_stats["names"],
        # finished() alone (it builds the SDK spans), thread CPU, median over the rounds' span pools.
        "finish_us": statistics.median(b["finish_ns"] / b["spans"] for b in builds) / 1e3,
        "attributes": _attribute_counts(pool),
        "bytes": _wire_bytes(pool),
        "rows": _rows(samples, beyond, builds[0]["spans"]),
        "sent": dict.fromkeys(PROTOCOLS, len(BATCH_SIZES) * len(COMPRESSIONS) * POOL * rounds),
        "received": received,
        "failures": len(failures),
    }


def _rounds(
    variants: dict[Key, Work], receivers: dict[str, Receiver], rounds: int, warm_up: bool = True
) -> tuple[dict[Key, list[tuple[int, int]]], dict[Key, list[int]], dict[str, int]]:
    """Run every variant once a round: (thread, process) CPU ns samples, paired differences, spans received.

    Each export runs right next to an encoding of the same batches (before it in even rounds, after it in
    odd ones): the difference of the pair, what sending adds to encoding, then sees the same state of a
    shared machine in both terms. The starting slot is rotated each round.
    """
    slots: list[tuple[Key, ...]] = [
        (("encode", "-", k[2], "none"), k) if k[0] == "export" else (k,) for k in variants if k[0] != "encode"
    ]
    samples: dict[Key, list[tuple[int, int]]] = {k: [] for k in variants}
    beyond: dict[Key, list[int]] = {k: [] for k in variants if k[0] == "export"}
    for work in variants.values() if warm_up else ():  # connections open, caches filled (not in --quick,
        work()  # whose numbers mean little: a third of its time)
    for receiver in receivers.values():
        receiver.take()
    received = dict.fromkeys(receivers, 0)
    for r in range(rounds):
        for slot in slots[r % len(slots) :] + slots[: r % len(slots)]:
            taken = {k: _cpu(variants[k]) for k in (slot if r % 2 == 0 else slot[::-1])}
            for key, cpu in taken.items():
                samples[key].append(cpu)
            if len(slot) == 2:
                beyond[slot[1]].append(taken[slot[1]][1] - taken[slot[0]][1])
        for protocol, receiver in receivers.items():
            received[protocol] += receiver.take()
    return samples, beyond, received


def _rows(samples: dict[Key, list[tuple[int, int]]], beyond: dict[Key, list[int]], built: int) -> list[Any]:
    """One row per variant: µs per span, medians of thread and process CPU (and of the export pairs)."""
    rows = []
    for key, pairs in samples.items():
        what, protocol, size, compression = key
        units = {"build": built, "encode-kind": DEFAULT_BATCH}.get(what, POOL)
        row = {
            "what": what,
            "protocol": protocol,
            "batch": size,
            "compression": compression,
            "thread_us": statistics.median(t for t, _ in pairs) / units / 1e3,
            "process_us": statistics.median(p for _, p in pairs) / units / 1e3,
        }
        if key in beyond:
            row["beyond_us"] = statistics.median(beyond[key]) / units / 1e3
            # The quartiles show how far apart the pairs' differences lie: the noise on this number.
            q1, _, q3 = statistics.quantiles(beyond[key], n=4)
            row["beyond_q_us"] = [q1 / units / 1e3, q3 / units / 1e3]
        rows.append(row)
    return rows


def _attribute_counts(pool: Sequence[Any]) -> dict[str, list[int]]:
    """Per span name: [attributes, events, attributes on its events] of its first span."""
    counts: dict[str, list[int]] = {}
    for span in pool:
        if span.name not in counts:
            events = span.events
            counts[span.name] = [len(span.attributes), len(events), sum(len(e.attributes) for e in events)]
    return counts


def _wire_bytes(pool: Sequence[Any]) -> dict[str, float]:
    """Bytes per span of a default-sized batch's request body, plain and gzipped (the HTTP exporter's)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    body = encode_spans(pool[:DEFAULT_BATCH]).SerializeToString()
    return {"none": len(body) / DEFAULT_BATCH, "gzip": len(gzip.compress(body)) / DEFAULT_BATCH}


def main(argv: Sequence[str] | None = None) -> None:
    """Print the section; ``--quick`` for tiny repeat counts."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.export_cost", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few rounds only (numbers mean little)")
    args = parser.parse_args(argv)
    print("\n".join(lines(measure(args.quick))))


if __name__ == "__main__":
    main()
