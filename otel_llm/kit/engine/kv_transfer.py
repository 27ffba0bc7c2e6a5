"""Sending a request's KV cache from a prefill instance to a decode instance over a local socket.

One message per request: a 4-byte big-endian header length, a JSON header (the request's tokens, the
tensor's shape and dtype, the tracker's hand-off carrier), then the K/V bytes. The receiver stamps the
header's arrival and the last byte's (``time.monotonic()`` seconds): the decode instance's transfer is
[header, last byte], the prefill instance's ends when ``sendall`` returned. An abort is a header alone,
``{"abort": request_id}``: sent on the same socket, it always arrives after the request's hand-off.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from dataclasses import dataclass

import torch

from otel_llm.kit.engine.engine import Handoff

_LEN = struct.Struct(">I")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, slots=True)
class AbortRequest:
    """The prefill instance no longer wants ``request_id`` (its client hung up): abort it if it is here."""

    request_id: str


def send_abort(sock: socket.socket, request_id: str) -> None:
    """Ask the decode instance to abort a request handed off earlier on this socket."""
    header = json.dumps({"abort": request_id}).encode()
    sock.sendall(_LEN.pack(len(header)) + header)


def send(sock: socket.socket, h: Handoff) -> int:
    """Send one hand-off; returns the K/V bytes sent (the header not counted)."""
    kv = h.kv.contiguous()
    payload = kv.view(torch.uint8).numpy().tobytes() if kv.numel() else b""
    header = json.dumps(
        {
            "request_id": h.request_id,
            "prompt": h.prompt_token_ids,
            "first": h.first_token,
            "max_tokens": h.max_tokens,
            "stop": h.stop_token_ids,
            "shape": list(kv.shape),
            "dtype": str(kv.dtype).removeprefix("torch."),
            "bytes": len(payload),
            "carrier": h.carrier,
        }
    ).encode()
    sock.sendall(_LEN.pack(len(header)) + header)
    sock.sendall(payload)
    return len(payload)


def _read(sock: socket.socket, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket) -> tuple[Handoff, float, float, int] | AbortRequest | None:
    """The next hand-off with (header arrived, last byte arrived, K/V bytes), or an abort; None when
    the peer closed."""
    size = _read(sock, _LEN.size)
    if size is None:
        return None
    raw = _read(sock, _LEN.unpack(size)[0])
    if raw is None:
        return None
    started = time.monotonic()
    header = json.loads(raw)
    if "abort" in header:
        return AbortRequest(str(header["abort"]))
    payload = _read(sock, header["bytes"]) if header["bytes"] else b""
    if payload is None:
        return None
    done = time.monotonic()
    dtype = _DTYPES[header["dtype"]]
    kv = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype).reshape(header["shape"])
    h = Handoff(
        header["request_id"],
        header["prompt"],
        header["first"],
        header["max_tokens"],
        header["stop"],
        kv,
        header["carrier"],
    )
    return h, started, done, header["bytes"]
