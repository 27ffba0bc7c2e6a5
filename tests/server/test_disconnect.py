"""A client that hangs up aborts its request in the engine: the trace ends with reason ``abort``."""

from __future__ import annotations

import json
import socket
import time

import pytest
from opentelemetry.trace import StatusCode

from otel_llm import semconv as sc
from tests.server.conftest import MODEL, WAIT_S, Served

MAX_TOKENS = 1000  # seconds of decoding on this model: far longer than the test waits before hanging up


@pytest.fixture(scope="module")
def served(serve) -> Served:
    return serve(num_kv_blocks=64)


def send(port: int, path: str, body: dict) -> socket.socket:
    """A raw HTTP/1.1 POST, so the test decides exactly when the connection goes away."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def read_until(sock: socket.socket, marker: bytes, count: int = 1) -> bytes:
    """Read until ``marker`` has arrived ``count`` times."""
    data = b""
    while data.count(marker) < count:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed before {marker!r} x{count}: {data[-300:]!r}"
        data += chunk
    return data


def header(response: bytes, name: str) -> str:
    for line in response.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        key, _, value = line.decode().partition(":")
        if key.strip().lower() == name:
            return value.strip()
    raise AssertionError(f"no {name} header in {response[:300]!r}")


def assert_aborted(served: Served, request_id: str) -> None:
    root = served.request_span(request_id)
    assert root.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == (sc.REASON_ABORT,)
    assert root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] < MAX_TOKENS
    assert root.status.status_code is not StatusCode.ERROR  # a client leaving is not a server error
    deadline = time.monotonic() + WAIT_S
    while served.engine.has_unfinished():  # the KV blocks went back to the pool
        assert time.monotonic() < deadline, "the engine still runs the abandoned request"
        time.sleep(0.01)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_closing_a_stream_mid_way_aborts_the_request(served: Served, path: str) -> None:
    body = {"model": MODEL, "max_tokens": MAX_TOKENS, "stream": True}
    body.update(
        {"prompt": "tell me"} if "chat" not in path else {"messages": [{"role": "user", "content": "hi"}]}
    )
    sock = send(served.port, path, body)
    received = read_until(sock, b"data: ", count=3)  # a few events: the request is decoding
    request_id = header(received, "x-request-id")
    sock.close()
    assert_aborted(served, request_id)


def test_hanging_up_on_a_plain_request_aborts_it(served: Served) -> None:
    before = {s.attributes[sc.LLM_REQUEST_ID] for s in served.request_spans()}
    sock = send(
        served.port, "/v1/completions", {"model": MODEL, "prompt": "wait for me", "max_tokens": MAX_TOKENS}
    )
    deadline = time.monotonic() + WAIT_S
    while not served.engine.has_unfinished():  # wait until the engine works on it, then leave
        assert time.monotonic() < deadline, "the request never reached the engine"
        time.sleep(0.005)
    sock.close()
    deadline = time.monotonic() + WAIT_S
    while not (new := [s for s in served.request_spans() if s.attributes[sc.LLM_REQUEST_ID] not in before]):
        assert time.monotonic() < deadline, "no llm.request span for the abandoned request"
        time.sleep(0.01)
    assert_aborted(served, new[0].attributes[sc.LLM_REQUEST_ID])
