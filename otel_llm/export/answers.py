"""What the collector answered to a failed export, so a loss is counted under what went wrong.

The SDK's OTLP exporters return only success or failure; the answer itself (an HTTP status, a gRPC
status) goes to their log lines. ``watch(exporter)`` puts an observer on the exporter's own transport
(its ``requests`` session, or its gRPC stub) that notes each attempt's outcome on the exporting thread.
After a failed export, ``Answers.reason()`` names the last one:

- ``export_not_found``: HTTP 404, gRPC ``UNIMPLEMENTED`` / ``NOT_FOUND`` (no OTLP receiver at that path);
- ``export_unauthorized``: HTTP 401 / 403, gRPC ``UNAUTHENTICATED`` / ``PERMISSION_DENIED``;
- ``export_too_large``: HTTP 413, gRPC ``RESOURCE_EXHAUSTED`` (the receiver's size limit);
- ``export_unavailable``: HTTP 429 / 502 / 503, gRPC ``UNAVAILABLE`` from a server that answered;
- ``export_timed_out``: no answer within the export timeout (HTTP 408 / 504, gRPC ``DEADLINE_EXCEEDED``);
- None otherwise (no connection, another status): the caller counts ``export_failed``.

Nothing here raises or changes what the exporter does: the observer notes and passes every result on.
An exporter laid out in a way this module does not know is left alone (its losses stay ``export_failed``).
"""

from __future__ import annotations

import threading
from typing import Any

NOT_FOUND = "export_not_found"
UNAUTHORIZED = "export_unauthorized"
TOO_LARGE = "export_too_large"
UNAVAILABLE = "export_unavailable"
TIMED_OUT = "export_timed_out"
REASONS = (NOT_FOUND, UNAUTHORIZED, TOO_LARGE, UNAVAILABLE, TIMED_OUT)

_HTTP = {
    404: NOT_FOUND,
    401: UNAUTHORIZED,
    403: UNAUTHORIZED,
    413: TOO_LARGE,
    429: UNAVAILABLE,
    502: UNAVAILABLE,
    503: UNAVAILABLE,
    408: TIMED_OUT,
    504: TIMED_OUT,
}
_GRPC = {
    "UNIMPLEMENTED": NOT_FOUND,
    "NOT_FOUND": NOT_FOUND,
    "UNAUTHENTICATED": UNAUTHORIZED,
    "PERMISSION_DENIED": UNAUTHORIZED,
    "RESOURCE_EXHAUSTED": TOO_LARGE,
    "UNAVAILABLE": UNAVAILABLE,
    "DEADLINE_EXCEEDED": TIMED_OUT,
}


def http_reason(status: int) -> str | None:
    """The loss reason of an HTTP answer (None for success and for statuses not listed above)."""
    return _HTTP.get(status)


def grpc_reason(code_name: str, details: str) -> str | None:
    """The loss reason of a gRPC status (by its name, e.g. ``UNAVAILABLE``). gRPC reports a connection
    nobody accepted as ``UNAVAILABLE`` too; its details then say the client failed to connect, and that
    is no answer (None)."""
    if code_name == "UNAVAILABLE" and "connect" in details.lower():
        return None
    return _GRPC.get(code_name)


class Answers:
    """The outcome of the last attempt of the export running on each thread (thread-local: a span and a
    metric exporter never share one, but a flush may export beside the worker thread)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def begin(self) -> None:
        """An export starts on this thread: forget the previous one's answers."""
        self._local.reason = None
        self._local.unreached = False

    def note(self, reason: str | None, unreached: bool = False) -> None:
        """One attempt's outcome. ``unreached``: it could not connect at all. An export whose deadline
        passed after such attempts (gRPC's DEADLINE_EXCEEDED while it retries the connection, as it
        does on a busy machine) never reached a collector either: that is no answer (None), not a
        collector that was too slow."""
        if unreached:
            self._local.unreached = True
        elif reason == TIMED_OUT and getattr(self._local, "unreached", False):
            reason = None
        self._local.reason = reason

    def reason(self) -> str | None:
        """What the last attempt of this thread's export got, as a loss reason, or None."""
        return getattr(self._local, "reason", None)


def watch(exporter: Any) -> Answers | None:
    """Observe ``exporter``'s attempts (an SDK OTLP exporter, HTTP or gRPC); None when its transport is
    not one this module knows."""
    answers = Answers()
    if _watch_grpc(exporter, answers) or _watch_http(exporter, answers):
        return answers
    return None


def _watch_http(exporter: Any, answers: Answers) -> bool:
    """Wrap the ``send`` of the ``requests`` session the exporter posts with (``_session`` in SDK 1.35 to
    1.39, its transport's ``_session`` later)."""
    try:
        import requests
    except ImportError:
        return False
    session = _find(exporter, requests.Session)
    if session is None:
        return False
    send = session.send

    def noting_send(request: Any, **kwargs: Any) -> Any:
        try:
            response = send(request, **kwargs)
        except requests.Timeout:
            answers.note(TIMED_OUT)
            raise
        except requests.RequestException:
            answers.note(None)  # no answer: nothing listened, or the connection broke
            raise
        answers.note(http_reason(response.status_code))
        return response

    session.send = noting_send  # the instance's own: Session.request calls self.send
    return True


def _find(root: Any, kind: type, depth: int = 3) -> Any:
    """The first attribute of ``kind`` within ``depth`` levels of ``root``'s instance attributes."""
    level = [root]
    for _ in range(depth):
        below = []
        for item in level:
            for value in getattr(item, "__dict__", {}).values():
                if isinstance(value, kind):
                    return value
                if hasattr(value, "__dict__") and not isinstance(value, type):
                    below.append(value)
        level = below
    return None


class _NotingStub:
    """A gRPC stub whose ``Export`` notes the status of each call, then answers as the stub did."""

    def __init__(self, stub: Any, answers: Answers) -> None:
        self._stub = stub
        self._answers = answers

    def Export(self, *args: Any, **kwargs: Any) -> Any:  # the name the exporter calls
        import grpc

        try:
            answer = self._stub.Export(*args, **kwargs)
        except grpc.RpcError as error:
            code = error.code() if hasattr(error, "code") else None
            details = (error.details() if hasattr(error, "details") else "") or ""
            name = getattr(code, "name", "")
            unreached = name == "UNAVAILABLE" and "connect" in details.lower()
            self._answers.note(grpc_reason(name, details), unreached)
            raise
        self._answers.note(None)
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)


def _watch_grpc(exporter: Any, answers: Answers) -> bool:
    """Wrap the exporter's stub (``_client``), and its stub factory (``_stub``), which SDK 1.4x calls
    again to reconnect after ``UNAVAILABLE``."""
    client, factory = getattr(exporter, "_client", None), getattr(exporter, "_stub", None)
    if client is None or not callable(factory) or not hasattr(client, "Export"):
        return False
    exporter._client = _NotingStub(client, answers)
    exporter._stub = lambda channel: _NotingStub(factory(channel), answers)
    return True
