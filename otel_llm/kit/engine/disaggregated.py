"""The reference engine disaggregated on one machine: a prefill worker process and a decode worker
process (``multiprocessing``, spawn), the KV cache of each request sent between them over a Unix socket.

    router (this process) ──requests, aborts──> prefill worker ──KV, aborts (Unix socket)──> decode worker
            <──── queued (id, traceparent) ──────────┘
            <──────────────────────────── outputs (the decode worker's; and requests ended at prefill)

The prefill worker draws each request's trace identity (its tracker, its sampler) and answers it at once
(``Queued``), so a server can send a request's ``traceparent`` before its first token. An ``Abort``
ends the request where it is: in the prefill engine, else it follows the request's hand-off over the
socket to the decode worker. The workers ignore SIGINT: the router decides when they stop.

Each worker has its own engine (its own small KV cache, so each preempts on its own), its own
``RequestTracker`` with its role, and its own telemetry from ``otel_llm.configure()`` (OTLP when the
OTEL_* environment names an endpoint, else OTLP JSON files in ``<output_dir>/<role>/``). The request's
one trace is joined through the hand-off carrier in each transfer's header (``otel_llm.hooks.handoff``).
Timestamps are ``time.monotonic()`` seconds, shared by the processes of one Linux host.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from otel_llm.kit.engine.config import EngineConfig

_ORPHAN_CHECK_S = 1.0  # how often an idle prefill worker checks that the router still runs (seconds)


@dataclass(slots=True)
class Submit:
    """A request the router sends to the prefill worker."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_ts: float  # monotonic seconds
    carrier: dict[str, str] | None = None
    stop_token_ids: tuple[int, ...] = ()  # tokens that end the request (on either worker)


@dataclass(slots=True)
class Abort:
    """The router no longer wants a request (its client hung up, or the server is stopping)."""

    request_id: str


@dataclass(slots=True)
class Queued:
    """The prefill worker queued a request: the W3C ``traceparent`` of its ``llm.request`` span (None
    without one). ``error`` is set instead when the worker could not take it (nothing else follows)."""

    request_id: str
    traceparent: str | None
    error: str | None = None


@dataclass(slots=True)
class Output:
    """Tokens delivered for one request (``ts``: monotonic seconds of the step that produced them)."""

    request_id: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    ts: float


def _telemetry(role: str, output_dir: str | None, model: str, resource: dict[str, str]) -> tuple[Any, Any]:
    import torch

    import otel_llm

    # Ctrl-C, and a service manager's SIGTERM, reach every process of the group: the router stops us
    # (so telemetry is flushed); if the router itself dies, the prefill worker notices and stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(1)  # tiny matrices; two workers share the machine's cores
    out = None if output_dir is None else Path(output_dir) / role
    telemetry = otel_llm.configure(
        service_name=f"otel-llm-{role}", output_dir=out, set_global=False, resource_attributes=resource
    )
    # A tracker per GenAI operation, as `otel-llm serve` has: the request ids the server chose say which
    # (chat completions are `chat`, completions and the demo's requests `text_completion`).
    from otel_llm.kit.server.operations import OperationTrackers

    tracker = OperationTrackers(
        lambda operation: otel_llm.RequestTracker(
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
            model=model,
            role=role,
            operation_name=operation,
        )
    )
    return telemetry, tracker


def _engine(config: EngineConfig, tracker: Any, telemetry: Any) -> Any:
    from otel_llm.kit.engine.engine import LLMEngine

    return LLMEngine(
        config,
        tracker=tracker,
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )


def prefill_worker(
    config: EngineConfig,
    sock_path: str,
    requests: Any,
    outputs: Any,
    output_dir: str | None,
    model: str,
    resource: dict[str, str],
) -> None:
    """Prefill each request, send its KV to the decode worker, report ``kv_sent`` once sent. A None
    request means: finish what is in flight, then close the socket and stop."""
    from otel_llm.kit.engine import kv_transfer

    telemetry, tracker = _telemetry("prefill", output_dir, model, resource)
    engine = _engine(config, tracker, telemetry)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sock_path)
    outputs.put(("ready", "prefill"))
    router = mp.parent_process()
    assert router is not None

    def idle() -> bool:
        return not engine.has_unfinished()

    stopping = False
    while not stopping or engine.has_unfinished():
        while not stopping:
            try:
                item = requests.get(timeout=_ORPHAN_CHECK_S) if idle() else requests.get_nowait()
            except queue.Empty:
                if idle() and not router.is_alive():  # the router is gone: stop as if it had asked
                    stopping = True
                break
            if item is None:
                stopping = True
                break
            if isinstance(item, Abort):
                if not engine.abort_request(item.request_id):  # handed off already (or unknown there)
                    kv_transfer.send_abort(sock, item.request_id)
                continue
            try:
                engine.add_request(
                    item.prompt_token_ids,
                    item.max_tokens,
                    item.request_id,
                    item.carrier,
                    item.stop_token_ids,
                    item.arrival_ts,
                )
            except ValueError as exc:  # a request this engine can never run: it ends here, as an error
                outputs.put(Queued(item.request_id, None, str(exc)))
                outputs.put(Output(item.request_id, [], True, "error", time.monotonic()))
            else:
                outputs.put(Queued(item.request_id, tracker.traceparent(item.request_id)))
        if not engine.has_unfinished():
            continue
        for out in engine.step():  # requests that ended here (e.g. max_tokens 1) are delivered from here
            outputs.put(Output(out.request_id, out.new_token_ids, out.finished, out.finish_reason, out.ts))
        for h in engine.take_handoffs():
            num_bytes = kv_transfer.send(sock, h)
            tracker.kv_sent(h.request_id, ts=time.monotonic(), num_bytes=num_bytes)
    sock.close()
    # The router tells the user what this worker's exporters delivered (they are not the router's).
    outputs.put(("stopped", "prefill", telemetry.delivery_report()))


def decode_worker(
    config: EngineConfig,
    sock_path: str,
    outputs: Any,
    output_dir: str | None,
    model: str,
    resource: dict[str, str],
) -> None:
    """Receive hand-offs on the socket (a thread), decode them; stop when the prefill worker closed
    the socket and nothing is left to decode."""
    from otel_llm.kit.engine import kv_transfer

    telemetry, tracker = _telemetry("decode", output_dir, model, resource)
    engine = _engine(config, tracker, telemetry)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(1)
    outputs.put(("ready", "decode"))
    conn, _ = listener.accept()
    inbox: queue.Queue[Any] = queue.Queue()

    def receive() -> None:
        while (got := kv_transfer.receive(conn)) is not None:
            inbox.put(got)
        inbox.put(None)

    threading.Thread(target=receive, name="kv-receiver", daemon=True).start()
    closed = False
    while not closed or engine.has_unfinished():
        while True:
            try:
                got = inbox.get(block=not engine.has_unfinished() and not closed, timeout=None)
            except queue.Empty:
                break
            if got is None:
                closed = True
                break
            if isinstance(got, kv_transfer.AbortRequest):
                engine.abort_request(got.request_id)  # False when it had finished here already
                continue
            h, started, done, num_bytes = got
            engine.add_handoff(h, started, done, num_bytes)
        if engine.has_unfinished():
            for out in engine.step():
                outputs.put(
                    Output(out.request_id, out.new_token_ids, out.finished, out.finish_reason, out.ts)
                )
    conn.close()
    listener.close()
    # The router tells the user what this worker's exporters delivered (they are not the router's).
    outputs.put(("stopped", "decode", telemetry.delivery_report()))


class DisaggregatedEngine:
    """Starts the two workers and routes requests: ``submit()`` to the prefill worker, ``outputs()``
    from both. ``output_dir``: where each worker's OTLP JSON files go when no endpoint is set."""

    def __init__(
        self,
        prefill: EngineConfig,
        decode: EngineConfig,
        *,
        output_dir: str | os.PathLike[str] | None = None,
        model: str = "otel-llm-tiny",
        resource_attributes: dict[str, str] | None = None,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="otel-llm-kv-")
        sock_path = os.path.join(self._tmp.name, "kv.sock")
        ctx = mp.get_context("spawn")
        self._requests: Any = ctx.Queue()  # None once the workers are stopped
        self._outputs: Any = ctx.Queue()
        out = None if output_dir is None else str(output_dir)
        resource = dict(resource_attributes or {})
        self._decode = ctx.Process(
            target=decode_worker,
            args=(replace(decode, role="decode"), sock_path, self._outputs, out, model, resource),
            name="otel-llm-decode",
        )
        self._prefill = ctx.Process(
            target=prefill_worker,
            args=(
                replace(prefill, role="prefill"),
                sock_path,
                self._requests,
                self._outputs,
                out,
                model,
                resource,
            ),
            name="otel-llm-prefill",
        )
        self._started: list[Any] = [self._decode]
        self._decode.start()
        self._wait_for("ready", "decode")  # its socket listens before the prefill worker connects
        self._started.append(self._prefill)
        self._prefill.start()
        self._wait_for("ready", "prefill")
        self._held: list[Output | Queued] = []
        self.closed = False  # close() was called
        # By role, what each worker's telemetry delivered and lost (a DeliveryReport), sent as it stopped
        # in close(); a worker killed at the timeout sends none.
        self.delivery: dict[str, Any] = {}

    def _wait_for(self, what: str, role: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                item = self._outputs.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() > deadline or not all(p.is_alive() for p in self._started):
                    self._stop_all()
                    raise RuntimeError(f"the {role} worker did not start (see its error above)") from None
                continue
            if item == (what, role):
                return
            if isinstance(item, (Output, Queued)):
                self._held.append(item)

    def _stop_all(self) -> None:
        for proc in self._started:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5)
        self._tmp.cleanup()
        self._release_queues()

    def _release_queues(self) -> None:
        """Close both queues and drop them, once no worker uses them.

        A spawn-context queue holds named semaphores that multiprocessing unlinks when the queue is
        garbage-collected or at interpreter exit. ``otel-llm serve`` ends by re-raising SIGTERM (uvicorn
        does), so there is no interpreter exit, and the resource tracker would report them as leaked:
        dropping the last references here unlinks them while the process still runs."""
        for q in (self._requests, self._outputs):
            if q is not None:
                q.close()
                # The feeder thread holds the queue (and its write lock) until it has flushed; with
                # the workers gone a full pipe would never drain, so the wait is bounded.
                flushed = threading.Thread(target=q.join_thread, name="otel-llm-queue-flush", daemon=True)
                flushed.start()
                flushed.join(timeout=1.0)
        self._requests = self._outputs = None

    def submit(self, request: Submit) -> None:
        if self._requests is None:
            raise RuntimeError("the workers are stopped: close() was called")
        self._requests.put(request)

    def abort(self, request_id: str) -> None:
        """End a submitted request wherever it is now (finish reason ``abort``); a no-op once finished
        or once the workers are stopped."""
        if self._requests is not None:
            self._requests.put(Abort(request_id))

    def events(self, timeout_s: float = 0.1) -> list[Output | Queued]:
        """Outputs and ``Queued`` answers available now (waiting up to ``timeout_s`` for the first)."""
        got: list[Any] = list(self._held)
        self._held = []
        if self._outputs is None:  # stopped: nothing more will come
            return [o for o in got if isinstance(o, (Output, Queued))]
        with contextlib.suppress(queue.Empty):
            if not got:
                got.append(self._outputs.get(timeout=timeout_s))
            while True:
                got.append(self._outputs.get_nowait())
        return [o for o in got if isinstance(o, (Output, Queued))]

    def outputs(self, timeout_s: float = 0.1) -> list[Output]:
        """Outputs available now (waiting up to ``timeout_s`` for the first)."""
        return [o for o in self.events(timeout_s) if isinstance(o, Output)]

    def alive(self) -> bool:
        """Whether both workers are running."""
        return all(p.is_alive() for p in self._started)

    def close(self, timeout_s: float = 60.0) -> list[Output]:
        """Finish every submitted request, stop both workers (telemetry flushed, ``delivery`` filled); the
        last outputs. Workers still running ``timeout_s`` seconds from now are killed."""
        if self._requests is None:
            return []  # already stopped
        self.closed = True
        self._requests.put(None)
        rest: list[Output] = []
        stopped: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while len(stopped) < 2 and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                item = self._outputs.get(timeout=0.2)
                if isinstance(item, Output):
                    rest.append(item)
                elif isinstance(item, tuple) and item[0] == "stopped":
                    stopped.add(item[1])
                    self.delivery[item[1]] = item[2]
        for proc in self._started:
            proc.join(timeout=max(0.0, min(10.0, deadline - time.monotonic())))
        self._stop_all()
        return [o for o in self._held if isinstance(o, Output)] + rest
