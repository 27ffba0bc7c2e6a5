"""``otel-llm serve --disaggregated`` as a real process: the official openai client drives it (plain and
streaming, with a caller's traceparent, concurrent requests on small KV caches, a hang-up mid-stream),
then SIGTERM stops it; the two workers' OTLP JSON files must hold one trace per request with both
instances and a KV transfer on each side, under the caller's span.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from otel_llm import semconv as sc

pytest.importorskip("torch", reason="the reference engine needs the torch extra")
openai = pytest.importorskip("openai")

from otel_llm.kit.commands.view import load_all  # noqa: E402
from tests.ports import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = "otel-llm-tiny"
BUDGET_S = 1.0  # OTEL_LLM_SHUTDOWN_TIMEOUT here
GRACEFUL_S = 1.0  # --graceful-timeout here
SLACK_S = 5.0  # process teardown on a busy 2-core machine
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
HANG_UP_TOKENS = 200  # max_tokens of the request whose client hangs up after a few events


def start(tmp: Path, port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPENAI_"))}
    env.update(OTEL_LLM_SHUTDOWN_TIMEOUT=str(BUDGET_S), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # Small caches (blocks of 16 tokens): room for one long request, or a few short ones at a time.
    args = ["--disaggregated", "--prefill-kv-blocks", "14", "--decode-kv-blocks", "16"]
    args += ["--port", str(port), "--log-level", "warning", "--graceful-timeout", str(GRACEFUL_S)]
    args += ["--output-dir", str(tmp / "out")]
    cmd = [sys.executable, "-m", "otel_llm.kit.cli", "serve", *args]
    out, err = subprocess.DEVNULL, subprocess.PIPE
    return subprocess.Popen(cmd, cwd=tmp, env=env, stdout=out, stderr=err, text=True)


def wait_ready(proc: subprocess.Popen[str], port: int) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "otel-llm serve did not start"
            time.sleep(0.2)


def hang_up_mid_stream(port: int) -> str:
    """A streamed completion whose client goes away after three events; its request id."""
    body = json.dumps({"model": MODEL, "prompt": "tell me", "max_tokens": HANG_UP_TOKENS, "stream": True})
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = (
            "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body.encode())
        data = b""
        while data.count(b"data: ") < 3:
            chunk = sock.recv(4096)
            assert chunk, data
            data += chunk
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"x-request-id:"):
            return line.split(b":", 1)[1].strip().decode()
    raise AssertionError(data[:300])


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("serve-disaggregated")
    port = free_port()
    proc = start(tmp, port)
    try:
        wait_ready(proc, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        caller = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
        plain = client.completions.with_raw_response.create(
            model=MODEL, prompt="Hello there", max_tokens=12, extra_headers=caller
        )
        streamed = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
        )
        chunks = list(streamed.parse())
        with ThreadPoolExecutor(4) as pool:
            prompts = [f"request number {i} " * 2 for i in range(4)]
            answers = list(
                pool.map(lambda p: client.completions.create(model=MODEL, prompt=p, max_tokens=20), prompts)
            )
        gone = hang_up_mid_stream(port)
        workers = children(proc.pid)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.stderr is not None
    return {
        "plain": plain,
        "streamed": streamed,
        "chunks": chunks,
        "answers": answers,
        "gone": gone,
        "workers": workers,
        "took": took,
        "stderr": proc.stderr.read(),
        "spans": load_all([str(tmp / "out")]),
    }


def traces(run: dict[str, Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for span in run["spans"]:
        out.setdefault(span.trace_id, []).append(span)
    return out


def request_span(run: dict[str, Any], request_id: str) -> Any:
    (root,) = [
        s
        for s in run["spans"]
        if s.name == sc.SPAN_REQUEST and s.attributes.get(sc.LLM_REQUEST_ID) == request_id
    ]
    return root


def test_the_caller_span_is_the_parent_of_the_one_request_span(run: dict[str, Any]) -> None:
    headers, body = run["plain"].headers, run["plain"].parse()
    assert headers["x-trace-id"] == CALLER_TRACE
    root = request_span(run, body.id)
    assert root.trace_id == CALLER_TRACE and root.parent_id == CALLER_SPAN
    assert headers["traceparent"] == f"00-{CALLER_TRACE}-{root.span_id}-01"
    assert body.usage.completion_tokens == 12


def test_a_streamed_answer_names_its_trace_before_the_first_token(run: dict[str, Any]) -> None:
    headers, chunks = run["streamed"].headers, run["chunks"]
    assert chunks[-1].choices[0].finish_reason == "length"
    root = request_span(run, chunks[0].id)
    assert headers["x-trace-id"] == root.trace_id != CALLER_TRACE and root.parent_id is None


def test_every_request_is_one_trace_with_both_instances_and_a_transfer_on_each_side(
    run: dict[str, Any],
) -> None:
    by_trace = traces(run)
    assert len(by_trace) == 1 + 1 + 4 + 1  # plain, streamed, concurrent, hung up
    for spans in by_trace.values():
        (root,) = [s for s in spans if s.name == sc.SPAN_REQUEST]
        for name in (sc.SPAN_INSTANCE_PREFILL, sc.SPAN_INSTANCE_DECODE):
            (inst,) = [s for s in spans if s.name == name]
            assert inst.parent_id == root.span_id
            (transfer,) = [s for s in spans if s.name == sc.SPAN_KV_TRANSFER and s.parent_id == inst.span_id]
            assert transfer.attributes[sc.LLM_KV_TRANSFER_BYTES] > 0
    assert all(a.choices[0].finish_reason == "length" for a in run["answers"])


def test_a_hang_up_mid_stream_aborts_the_request_at_the_decode_worker(run: dict[str, Any]) -> None:
    root = request_span(run, run["gone"])
    assert root.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == [sc.REASON_ABORT]
    assert 0 < root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] < HANG_UP_TOKENS
    (decode,) = [s for s in traces(run)[root.trace_id] if s.name == sc.SPAN_INSTANCE_DECODE]
    assert decode.end_ns == root.end_ns  # it ended where it was: decoding


def test_sigterm_stops_the_server_and_both_workers_within_the_budget(run: dict[str, Any]) -> None:
    assert run["took"] < GRACEFUL_S + BUDGET_S + 1 + SLACK_S, f"SIGTERM took {run['took']:.1f} s"
    assert len(run["workers"]) >= 2
    for pid in run["workers"]:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert run["stderr"].count("wrote ") == 4, run["stderr"]  # traces and metrics of each worker
    # The worker queues' named semaphores are unlinked before uvicorn re-raises SIGTERM: the resource
    # tracker (which shares this stderr and outlives the server) has nothing to report as leaked.
    assert "leaked semaphore" not in run["stderr"], run["stderr"]


def test_each_request_names_its_operation_on_both_workers(run: dict[str, Any]) -> None:
    """A chat completion is `chat` and a completion `text_completion` (the GenAI conventions' names),
    on the prefill worker's spans and the decode worker's alike."""
    chat_id = run["chunks"][0].id
    plain_id = run["plain"].parse().id
    by_request: dict[str, set[str]] = {}
    for span in run["spans"]:
        request_id = span.attributes.get(sc.LLM_REQUEST_ID)
        if request_id in (chat_id, plain_id) and sc.GEN_AI_OPERATION_NAME in span.attributes:
            by_request.setdefault(request_id, set()).add(span.attributes[sc.GEN_AI_OPERATION_NAME])
    assert by_request == {chat_id: {"chat"}, plain_id: {"text_completion"}}
