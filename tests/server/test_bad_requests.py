"""Bad requests get a 4xx in OpenAI's error shape and never reach the engine or the traces."""

from __future__ import annotations

import http.client
import json

import openai
import pytest

from tests.server.conftest import MODEL, Served

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served(serve) -> Served:
    return serve(num_kv_blocks=4)  # 64 token slots: small enough that a long max_tokens is out of reach


@pytest.fixture(autouse=True)
def nothing_recorded(served: Served):
    yield
    served.tracker.force_flush()
    assert served.spans.get_finished_spans() == (), "a rejected request must leave no trace"
    assert served.tracker.in_flight == 0 and not served.engine.has_unfinished()


def post(served: Served, path: str, body: bytes) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def assert_openai_error(body: dict, param: str | None) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == param
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        ("/v1/completions", b'{"model": "' + MODEL.encode() + b'", "prompt": "x"', None),  # cut short
        ("/v1/completions", b"\xff\xfe not even text", None),
        ("/v1/completions", b"[1, 2, 3]", None),  # JSON, but not an object
        ("/v1/completions", json.dumps({"model": MODEL}).encode(), "prompt"),
        ("/v1/completions", json.dumps({"prompt": "x"}).encode(), "model"),
        ("/v1/chat/completions", json.dumps({"model": MODEL}).encode(), "messages"),
        ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": []}).encode(), "messages"),
        (
            "/v1/chat/completions",
            json.dumps({"model": MODEL, "messages": [{"role": "user"}]}).encode(),
            "messages.0.content",
        ),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": 42}).encode(), "prompt"),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": [1, 300]}).encode(), "prompt"),
        (
            "/v1/completions",
            json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 0}).encode(),
            "max_tokens",
        ),
        (
            "/v1/completions",
            json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2.5}).encode(),
            "max_tokens",
        ),
        (
            "/v1/completions",
            json.dumps({"model": MODEL, "prompt": "x", "max_tokens": True}).encode(),
            "max_tokens",
        ),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "stream": "yes"}).encode(), "stream"),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "n": 2}).encode(), "n"),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": ""}).encode(), "prompt"),
    ],
)
def test_malformed_bodies_get_400(served: Served, path: str, raw: bytes, param: str | None) -> None:
    status, body = post(served, path, raw)
    assert status == 400
    assert_openai_error(body, param)


def test_max_tokens_beyond_the_kv_cache_is_a_400_through_the_openai_client(served: Served) -> None:
    client = openai.OpenAI(base_url=served.base_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hello", max_tokens=200, stream=True)
    assert caught.value.status_code == 400
    assert_openai_error(caught.value.response.json(), "max_tokens")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=10_000)
    assert_openai_error(caught.value.response.json(), "max_tokens")


def test_wrong_types_and_unsupported_values_through_the_openai_client(served: Served) -> None:
    client = openai.OpenAI(base_url=served.base_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hello", max_tokens="8")  # type: ignore[arg-type]
    assert_openai_error(caught.value.response.json(), "max_tokens")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, stop=["END"])
    assert_openai_error(caught.value.response.json(), "stop")


def test_unknown_model_is_a_404(served: Served) -> None:
    client = openai.OpenAI(base_url=served.base_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-nothing", prompt="hello", max_tokens=4)
    error = caught.value.response.json()["error"]
    assert (error["param"], error["code"]) == ("model", "model_not_found")


def test_unknown_route_and_method_keep_the_error_shape(served: Served) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    try:
        for method, path, status in (("GET", "/v1/engines", 404), ("GET", "/v1/completions", 405)):
            conn.request(method, path)
            response = conn.getresponse()
            body = json.loads(response.read())
            assert response.status == status
            assert set(body["error"]) == {"message", "type", "param", "code"}
    finally:
        conn.close()


@pytest.mark.parametrize(
    "raw",
    [
        # An integer past Python's int-from-string digit limit (4,300 digits).
        b'{"model": "' + MODEL.encode() + b'", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
        b"[" * 2000 + b"]" * 2000,  # nesting past the JSON parser's recursion limit
        b'{"model": "' + MODEL.encode() + b'", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    ],
    ids=["huge-int", "deep-array", "deep-field"],
)
def test_pathological_json_is_a_400_not_a_500(served: Served, raw: bytes) -> None:
    status, body = post(served, "/v1/completions", raw)
    assert status == 400
    assert_openai_error(body, None)
    assert body["error"]["code"] == "invalid_json"


def test_a_prompt_too_long_is_blamed_on_the_prompt_with_the_servers_option(served: Served) -> None:
    status, body = post(
        served, "/v1/completions", json.dumps({"model": MODEL, "prompt": "x" * 100, "max_tokens": 1}).encode()
    )
    assert status == 400
    assert_openai_error(body, "prompt")
    message = body["error"]["message"]
    assert "--kv-blocks" in message and "num_kv_blocks" not in message
    status, body = post(
        served, "/v1/completions", json.dumps({"model": MODEL, "prompt": "x" * 10, "max_tokens": 60}).encode()
    )
    assert_openai_error(body, "max_tokens")
    assert "at most 54 tokens" in body["error"]["message"]


def test_a_validator_message_has_no_pydantic_prefix(served: Served) -> None:
    raw = json.dumps({"model": MODEL, "prompt": "x", "stop": "END"}).encode()
    status, body = post(served, "/v1/completions", raw)
    assert status == 400
    assert_openai_error(body, "stop")
    assert not body["error"]["message"].startswith("stop: Value error"), body["error"]["message"]
    assert "Value error," not in body["error"]["message"]
