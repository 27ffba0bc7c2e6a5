"""Which request a vLLM sequence belongs to, as the client sees it, and which endpoint it came from.

vLLM's OpenAI server names a request after its endpoint and gives the client that name: ``cmpl-<base>``
for ``/v1/completions``, ``chatcmpl-<base>`` for ``/v1/chat/completions`` (``<base>`` is the caller's
``X-Request-Id`` header or a random hex id). Internally each prompt of a completion becomes
``cmpl-<base>-<prompt index>`` (vLLM's "external" id), the engine appends a random suffix to make its
internal id unique (``cmpl-<base>-0-8281c457``), and with ``n > 1`` every choice is a child sequence
``<choice index>_<internal id of the parent>``. Offline ``LLM.generate()`` uses counters (``"0"``,
``"1"``, ...). This module reads those names back; it imports nothing from vLLM.
"""

from __future__ import annotations

from typing import Any, NamedTuple

OPERATION_CHAT = "chat"
OPERATION_TEXT_COMPLETION = "text_completion"

_CHAT_PREFIX = "chatcmpl-"
_COMPLETION_PREFIX = "cmpl-"


class RequestIdentity(NamedTuple):
    """Names of one engine sequence.

    ``client_id``: the id in the HTTP response (or the caller's id offline); ``internal_id``: vLLM's
    engine request id (unique per sequence); ``operation``: ``chat`` or ``text_completion``;
    ``choice``: the choice index when the request asked for ``n > 1``, else None.
    """

    client_id: str
    internal_id: str
    operation: str
    choice: int | None = None


def identify(request: Any, choice: int | None = None) -> RequestIdentity:
    """The identity of an ``EngineCoreRequest`` (``choice``: its index among ``n > 1`` choices)."""
    internal_id = str(request.request_id)
    external = getattr(request, "external_req_id", None)
    external_id = str(external) if external is not None else internal_id
    if external_id.startswith(_CHAT_PREFIX):
        return RequestIdentity(external_id, internal_id, OPERATION_CHAT, choice)
    if external_id.startswith(_COMPLETION_PREFIX):
        return RequestIdentity(
            _without_prompt_index(external_id), internal_id, OPERATION_TEXT_COMPLETION, choice
        )
    return RequestIdentity(external_id, internal_id, OPERATION_TEXT_COMPLETION, choice)


def _without_prompt_index(external_id: str) -> str:
    """``cmpl-<base>-<i>`` -> ``cmpl-<base>``: the completions endpoint always appends the prompt index."""
    base, dash, index = external_id.rpartition("-")
    return base if dash and index.isdigit() and len(base) > len(_COMPLETION_PREFIX) else external_id
