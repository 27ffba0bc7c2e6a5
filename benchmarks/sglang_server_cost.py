"""CPU per request of SGLang's HTTP server with otel-llm, with SGLang's own tracing (synchronous and
``SGLANG_TRACE_ASYNC=1``) and with neither, each of the server's processes apart.

Runs in the development virtualenv::

    python -m benchmarks.sglang_server_cost [--quick] [--requests N] [--tokens T] [--rounds R]
        [--output PATH] [--json PATH]

A full run (no size given: 64 concurrent requests x 32 tokens, 30 rounds, about seven minutes on 2 cores)
writes BENCHMARKS-sglang.md and BENCHMARKS-sglang.json at the repository root; the export process's
targets table in BENCHMARKS.md reads its row from the JSON. Any other run writes only what it is asked to.

Four ``python -m sglang.launch_server`` servers of the SGLang virtualenv (``tests/sglang/make_env.sh``),
each started with docs/sglang.md's command line for a CPU-only machine and the tests' tiny random Llama
(``tests/sglang/tiny_model.py``), differ only in tracing:

- ``bare``: ``SGLANG_PLUGINS=none`` (otel-llm's plugin is not loaded), no ``--enable-trace``;
- ``sglang-trace``: SGLang's ``--enable-trace --otlp-traces-endpoint HOST:PORT``, otel-llm's plugin off;
- ``sglang-trace-async``: the same with ``SGLANG_TRACE_ASYNC=1`` (each traced process starts an
  exporter process of its own, which replays the trace operations and exports);
- ``otel-llm``: otel-llm's plugin as a user gets it (installed, found through its entry point, with
  ``OTEL_EXPORTER_OTLP_ENDPOINT``), default export mode (an ``otel_llm.export.process`` beside the
  scheduler), SGLang's tracing off.

All four export OTLP/gRPC to one loopback receiver in a child process of this one (``benchmarks.receiver``),
so the receiver's CPU is charged to no measured process. The servers start one after the other; each is
stopped (SIGSTOP to its process group and every descendant) once warm. Each round sends every variant the
same batch of concurrent ``/generate`` requests, variants taking turns in an order rotated by the round;
a turn continues the variant's processes (SIGCONT), reads each process's CPU clock, sends the batch, waits
until the variant's spans have reached the receiver (the count stops growing), reads the CPU clocks again
and stops the processes. So only one server runs at a time, and the export CPU of its round is inside its
window. Work a variant leaves for later (SGLang's async contexts flush their last operations when they are
collected) lands in that variant's next window, so over rounds each window carries one round's work.

Two things would bury tracing's CPU under the window's length, and are taken out: an idle SGLang scheduler
polls its sockets without sleeping (about one core on this CPU engine), so every server runs with
``--sleep-on-idle``; and what each process still uses idle is measured once per server, after its warm-up,
once the whole tree has gone quiet (SGLang's async exporters take seconds to start after ``/health``
answers), and that rate times the window's wall time is subtracted from the window. A third would add
noise: torch's OpenMP workers spin while they wait, by an amount that depends on what else runs, so every
server runs torch with one thread (``OMP_NUM_THREADS=1``).

CPU is user + system time of a whole process (every thread, ended ones included), in nanoseconds, from the
process's CPU clock (``benchmarks.cpu_clocks.other_process_ns``: the same accounting as ``utime + stime``
of ``/proc/PID/stat``, without its 10 ms ticks). Processes are classified by their command line: the
launcher (HTTP server and tokenizer manager) is ``main``; ``sglang::scheduler*`` and
``sglang::detokenizer`` are SGLang's titles; ``otel_llm.export.process`` is otel-llm's export process; a
``multiprocessing.spawn`` child that kept its command line is SGLang's async trace exporter (SGLang starts
its scheduler and detokenizer the same way, but they retitle themselves before they are ready).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from benchmarks import cpu_clocks
from benchmarks.end_to_end import Receiver
from benchmarks.sglang_server_report import (
    CLASSES,
    SERVING,
    SGLANG_TRACING,
    VARIANTS,
    markdown,
    summarize,
    work_ns,
)

ROOT = Path(__file__).resolve().parent.parent
SGLANG_PYTHON = Path(os.environ.get("OTEL_LLM_SGLANG_PYTHON", ROOT / ".venv-sglang" / "bin" / "python"))
# docs/sglang.md's CPU-only command line (its `--model-path` and `--port` are filled in per server).
DOCS_CPU_ARGS = (
    "--enable-metrics",
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--dtype",
    "float32",
    "--disable-cuda-graph",
    "--skip-server-warmup",
    "--max-total-tokens",
    "4096",
)
# Not in the docs' line. A stopped server sits frozen through the other variants' turns; SGLang's
# watchdog measures wall time (perf_counter), so a long freeze must not look like a hung batch. And an
# idle scheduler polls its sockets without sleeping (about one core on this CPU engine), which would
# bury tracing's CPU under the window's length: `--sleep-on-idle` makes it wait on the sockets instead.
EXTRA_ARGS = ("--watchdog-timeout", "3600", "--sleep-on-idle")
READY_TIMEOUT_S = 300.0  # one start-up is 20-40 s alone on 2 cores; far more on a loaded machine
REQUEST_TIMEOUT_S = 600.0
SETTLE_S = 0.2  # after SIGCONT, before the window: timers that expired while stopped fire here
# Spans are in once the receiver's count has not grown for this long (over SGLang's 0.5 s schedule delay);
# what a variant still exports after that lands in its next window, as the server is stopped in between.
STABLE_S = 0.8
FLUSH_MAX_S = 20.0  # the most a turn waits for its spans after its last answer
WARMUP_REQUESTS = 4
# A server is quiet once its whole tree uses under this much CPU in a second: SGLang's async trace
# exporters are still importing and setting up for seconds after /health answers, and that must end
# before the first window. Idle with --sleep-on-idle is a few tens of ms per second here.
QUIET_NS_PER_S = 100_000_000
QUIET_TIMEOUT_S = 180.0


@dataclass
class Server:
    """One variant's ``launch_server`` process (the leader of its own process group) and its log."""

    variant: str
    proc: subprocess.Popen[bytes]
    log: Path
    url: str
    log_file: IO[bytes] | None = None
    tree: dict[int, str] = field(default_factory=dict)  # pid -> class, from the latest look
    idle_ns_per_s: dict[str, float] = field(default_factory=dict)  # class -> idle CPU rate, once quiet

    def pids(self) -> list[int]:
        """The launcher and every live descendant."""
        return [self.proc.pid, *cpu_clocks.descendants(self.proc.pid)]

    def signal(self, signum: int) -> None:
        """``signum`` to the process group and to each descendant (one may have left the group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)
        for pid in cpu_clocks.descendants(self.proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def stop(self) -> None:
        """Continue, SIGTERM to the group and descendants, then SIGKILL to whatever is left."""
        left = self.pids()
        self.signal(signal.SIGCONT)
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
        # SGLang's children may outlive their launcher: kill the group and each pid seen.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def skip_reason() -> str | None:
    """Why this benchmark cannot run here, or None."""
    if not SGLANG_PYTHON.exists():
        return "the SGLang virtualenv is missing (bash tests/sglang/make_env.sh builds it)"
    return None


def free_port() -> int:
    """A TCP port free on loopback right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(variant: str, endpoint: str) -> dict[str, str]:
    """This process's environment without OTEL_*, SGLANG_* and PYTHONPATH, plus SGLang's CPU-engine
    settings and the variant's tracing switches."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SGLANG_"))}
    env.pop("PYTHONPATH", None)
    env.update({"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    # One OpenMP thread per server: torch's OpenMP workers spin-wait between parallel regions, and that
    # spin grows with whatever else runs on the 2 cores, so with two of them the bare server's CPU per
    # request varied 14-37 ms over nine rounds and buried tracing's few ms; with one, no spin is counted
    # (what still moves a turn's CPU is the machine's speed, which the report's spread shows).
    env["OMP_NUM_THREADS"] = "1"
    if variant == "otel-llm":
        # As a user gets it: the plugin is installed, so SGLang loads it; the endpoint is the docs' variable.
        env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
        # The SDK's standard variable, set to SGLang's own default (500 ms) instead of the SDK's 5 s, so
        # both export on the same cadence and a turn's spans leave within its window.
        env["OTEL_BSP_SCHEDULE_DELAY"] = "500"
    else:
        env["SGLANG_PLUGINS"] = "none"  # a whitelist naming no installed plugin: otel-llm stays out
    if variant == "sglang-trace-async":
        env["SGLANG_TRACE_ASYNC"] = "1"
    return env


def server_argv(variant: str, model: Path, port: int, receiver_port: int) -> list[str]:
    argv = [str(SGLANG_PYTHON), "-m", "sglang.launch_server", "--model-path", str(model), "--port", str(port)]
    argv += [*DOCS_CPU_ARGS, *EXTRA_ARGS]
    if variant in SGLANG_TRACING:
        # SGLang's flag takes host:port (its gRPC exporter, insecure), not a URL.
        argv += ["--enable-trace", "--otlp-traces-endpoint", f"127.0.0.1:{receiver_port}"]
    return argv


def start_server(variant: str, model: Path, receiver_port: int, tmp: Path) -> Server:
    """Start one variant's server and wait for ``/health``; raises with the log's tail if it fails."""
    port = free_port()
    log = tmp / f"{variant}.log"
    log_file = log.open("wb")
    proc = subprocess.Popen(
        server_argv(variant, model, port, receiver_port),
        env=server_env(variant, f"http://127.0.0.1:{receiver_port}"),
        cwd=tmp,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: one signal reaches every process it starts
    )
    server = Server(variant, proc, log, f"http://127.0.0.1:{port}", log_file)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = server.tail()
            server.stop()  # the children it started may still run
            raise RuntimeError(f"{variant}: launch_server exited {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"{variant}: not ready within {READY_TIMEOUT_S:.0f} s:\n{server.tail()}")


def classify(pid: int, root: int) -> str:
    """The class of one process of a server's tree, from its command line (see the module docstring)."""
    if pid == root:
        return "main"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    if "sglang::scheduler" in cmdline:
        return "scheduler"
    if "sglang::detokenizer" in cmdline:
        return "detokenizer"
    if "otel_llm.export.process" in cmdline:
        return "otel_llm_export"
    if "multiprocessing.spawn" in cmdline:
        return "sglang_exporter"
    return "other"


def cpu_reading(server: Server) -> dict[int, int]:
    """CPU nanoseconds so far of each live process of the server's tree; refreshes ``server.tree``."""
    reading = {}
    for pid in server.pids():
        if server.tree.get(pid, "other") == "other":
            # Again while "other": a child looked at between fork and exec still shows its parent's line.
            server.tree[pid] = classify(pid, server.proc.pid)
        reading[pid] = cpu_clocks.other_process_ns(pid)
    return reading


def quiesce(server: Server) -> dict[str, float]:
    """Wait until the server's tree is quiet (``QUIET_NS_PER_S``); its idle CPU ns per second by class,
    from the last second looked at. Raises if it never quiets."""
    deadline = time.monotonic() + QUIET_TIMEOUT_S
    while True:
        before, t0 = cpu_reading(server), time.perf_counter()
        time.sleep(1.0)
        after, seconds = cpu_reading(server), time.perf_counter() - t0
        rates = dict.fromkeys(CLASSES, 0.0)
        for pid, ns in after.items():
            rates[server.tree[pid]] += max(0, ns - before.get(pid, 0)) / seconds
        if sum(rates.values()) < QUIET_NS_PER_S:
            return rates
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.variant}: still busy after {QUIET_TIMEOUT_S:.0f} s: {rates}")


def _generate(url: str, text: str, tokens: int) -> int:
    """One ``/generate`` request, greedy, exactly ``tokens`` new tokens; its completion tokens."""
    body = {
        "text": text,
        "sampling_params": {"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True},
    }
    request = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
        return int(json.loads(answer.read())["meta_info"]["completion_tokens"])


def send_batch(url: str, texts: list[str], tokens: int) -> int:
    """Every text as its own request, all at once (one client thread each); the output tokens."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(texts)) as pool:
        return sum(pool.map(lambda text: _generate(url, text, tokens), texts))


def wait_spans(receiver: Receiver, since: int) -> int:
    """Spans received since ``since`` once the count has stopped growing for ``STABLE_S``."""
    last, stable_from = int(receiver.ask("spans")), time.monotonic()
    deadline = time.monotonic() + FLUSH_MAX_S
    while time.monotonic() < deadline and time.monotonic() - stable_from < STABLE_S:
        time.sleep(0.2)
        now = int(receiver.ask("spans"))
        if now != last:
            last, stable_from = now, time.monotonic()
    return last - since


def timed_turn(server: Server, receiver: Receiver, texts: list[str], tokens: int) -> dict[str, Any]:
    """One variant's timed batch: CPU nanoseconds by process class, spans, wall seconds, tokens."""
    server.signal(signal.SIGCONT)
    try:
        time.sleep(SETTLE_S)
        spans_before = int(receiver.ask("spans"))
        before = cpu_reading(server)
        started = time.perf_counter()
        produced = send_batch(server.url, texts, tokens)
        answered_s = time.perf_counter() - started
        spans = wait_spans(receiver, spans_before)
        after = cpu_reading(server)
        wall_s = time.perf_counter() - started
    finally:
        server.signal(signal.SIGSTOP)
    by_class = dict.fromkeys(CLASSES, 0)
    processes = dict.fromkeys(CLASSES, 0)
    for pid, ns in after.items():
        # A process born inside the window counts from zero; one that ended in it is lost (none should).
        by_class[server.tree[pid]] += max(0, ns - before.get(pid, 0))
        processes[server.tree[pid]] += 1
    return {
        "cpu_ns": by_class,
        "processes": processes,
        "spans": spans,
        "tokens": produced,
        "answered_s": answered_s,
        "wall_s": wall_s,
        # What the tree would have used idle over the same wall time, by class (subtracted in the summary).
        "idle_ns": {cls: rate * wall_s for cls, rate in server.idle_ns_per_s.items()},
    }


def batch_texts(round_index: int, requests: int) -> list[str]:
    # The round in the prompt: each round misses the radix cache alike, whichever variant goes first.
    return [
        f"Round {round_index} request {i}: tell me a story about tokens and batches" for i in range(requests)
    ]


def _progress(line: str) -> None:
    print(
        f"sglang_server_cost [{(time.monotonic() - _STARTED) / 60:4.1f} min]: {line}",
        file=sys.stderr,
        flush=True,
    )


_STARTED = time.monotonic()


def measure(requests: int, tokens: int, rounds: int) -> dict[str, Any]:
    """Start the four servers, run the rounds, stop everything; the raw rounds per variant."""
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    servers: dict[str, Server] = {}
    receiver = Receiver()
    try:
        with tempfile.TemporaryDirectory(prefix="sglang-server-cost-") as tmp_name:
            tmp = Path(tmp_name)
            model = tmp / "model"
            maker = [str(SGLANG_PYTHON), str(ROOT / "tests" / "sglang" / "tiny_model.py"), str(model)]
            subprocess.run(maker, check=True, capture_output=True, env=server_env("bare", ""))
            try:
                for variant in VARIANTS:
                    _progress(f"starting {variant}")
                    server = start_server(variant, model, receiver.port, tmp)
                    servers[variant] = server
                    # Warm-up (first-use costs), its spans drained, then frozen until its first turn.
                    send_batch(server.url, batch_texts(-1, WARMUP_REQUESTS), tokens)
                    wait_spans(receiver, 0)
                    server.idle_ns_per_s = quiesce(server)  # also classifies the tree, whole and idle
                    server.signal(signal.SIGSTOP)
                    _progress(f"{variant} ready: {_tree_summary(server)}")
                for r in range(rounds):
                    shift = r % len(VARIANTS)
                    texts = batch_texts(r, requests)
                    for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                        results[variant].append(timed_turn(servers[variant], receiver, texts, tokens))
                    _progress(f"round {r + 1}/{rounds}: " + _round_summary(results, requests))
                trees = {v: _tree_summary(s) for v, s in servers.items()}
                idle = {v: s.idle_ns_per_s for v, s in servers.items()}
            finally:
                for server in servers.values():
                    server.stop()
    finally:
        receiver.close()
    return {
        "sglang": _sglang_version(),
        "requests": requests,
        "max_new_tokens": tokens,
        "rounds": rounds,
        "variants": results,
        "processes": trees,
        "idle_ns_per_s": idle,
        "stable_s": STABLE_S,
        "quiet_ns_per_s": QUIET_NS_PER_S,
    }


def _tree_summary(server: Server) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pid, cls in server.tree.items():
        if pid in server.pids():
            counts[cls] = counts.get(cls, 0) + 1
    return counts


def _round_summary(results: dict[str, list[dict[str, Any]]], requests: int) -> str:
    parts = []
    for variant, rounds in results.items():
        last = rounds[-1]
        serving = sum(work_ns(last, c) for c in SERVING) / requests / 1e3
        parts.append(f"{variant}={serving:.0f}us/req ({last['spans']} spans)")
    return " ".join(parts)


def _sglang_version() -> str:
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    answer = subprocess.run([str(SGLANG_PYTHON), "-c", code], capture_output=True, text=True, timeout=120)
    return answer.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="8 requests x 8 tokens, 1 round (a smoke run)")
    parser.add_argument("--requests", type=int, help="concurrent requests per batch (full: 64)")
    parser.add_argument("--tokens", type=int, help="output tokens per request (full: 32)")
    parser.add_argument("--rounds", type=int, help="rounds (full: 30)")
    parser.add_argument("--output", type=Path, help="Markdown report (full run: BENCHMARKS-sglang.md)")
    parser.add_argument(
        "--json", type=Path, help="raw rounds and summary as JSON (full run: BENCHMARKS-sglang.json)"
    )
    args = parser.parse_args(argv)
    reason = skip_reason()
    if reason is not None:
        print(f"sglang_server_cost: skipped: {reason}", file=sys.stderr)
        return 0
    requests = args.requests or (8 if args.quick else 64)
    tokens = args.tokens or (8 if args.quick else 32)
    rounds = args.rounds or (1 if args.quick else 30)
    raw = measure(requests, tokens, rounds)
    summary = summarize(raw)
    text = markdown(raw, summary)
    print(text)
    # A full run (no size given) is the one the targets table reads: it writes both files at the root.
    full = not (args.quick or args.requests or args.tokens or args.rounds)
    output = args.output or (ROOT / "BENCHMARKS-sglang.md" if full else None)
    raw_output = args.json or (ROOT / "BENCHMARKS-sglang.json" if full else None)
    if output is not None:
        output.write_text(text, encoding="utf-8")
    if raw_output is not None:
        raw_output.write_text(json.dumps({**raw, **summary}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
