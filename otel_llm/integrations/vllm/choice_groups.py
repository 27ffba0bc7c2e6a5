"""The ``llm.choices`` spans (``choices``) of the ``n > 1`` requests one vLLM adapter follows.

vLLM runs each choice as a request of its own, with its own request id, under one ``ParentRequest``. A
group is opened by the first choice vLLM's frontend registers and found by the parent's request id while
its choices run; each choice is found by its own id until it ends, and the group's span ends with the
last of them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from otel_llm import semconv as sc
from otel_llm.integrations.vllm.choices import Choices
from otel_llm.integrations.vllm.identity import RequestIdentity


class ChoiceGroups:
    """Open ``Choices`` by vLLM's parent request id, and by each choice's request id."""

    __slots__ = ("_by_child", "_by_parent")

    def __init__(self) -> None:
        self._by_parent: dict[str, Choices] = {}  # vLLM's parent request id -> its choices, while they run
        self._by_child: dict[str, Choices] = {}  # a choice's request id -> its parent's Choices

    def join(
        self,
        request_id: str,
        parent: Any,
        identity: RequestIdentity,
        tracker: Any,
        arrival: float | None,
        count: int,
        carrier: Mapping[str, str] | None,
        model: str | None,
    ) -> Choices:
        """The group of ``parent`` (vLLM's ``ParentRequest`` of ``count`` choices), which the choice
        ``request_id`` joins; its first choice opens it, its span starting at ``arrival`` (monotonic
        seconds; None: now) under the caller's ``carrier``."""
        parent_id = str(getattr(parent, "request_id", identity.client_id))
        choices = self._by_parent.get(parent_id)
        if choices is None:
            attributes: dict[str, Any] = {
                sc.LLM_REQUEST_ID: identity.client_id,
                sc.VLLM_REQUEST_ID: parent_id,
                sc.GEN_AI_OPERATION_NAME: identity.operation,
                sc.GEN_AI_REQUEST_CHOICE_COUNT: count,
            }
            if model is not None:
                attributes[sc.GEN_AI_REQUEST_MODEL] = model
            start = arrival if arrival is not None else time.monotonic()
            choices = self._by_parent[parent_id] = Choices(tracker, start, count, attributes, carrier)
        self._by_child[request_id] = choices
        return choices

    def child_gone(self, request_id: str, ts: float) -> None:
        """The request ``request_id`` ended at ``ts`` (monotonic seconds), finished or not: when it was
        the last choice of its group, the group's span ends and the group is forgotten."""
        choices = self._by_child.pop(request_id, None)
        if choices is not None and choices.child_finished(ts):
            for parent_id in [k for k, v in self._by_parent.items() if v is choices]:
                del self._by_parent[parent_id]
