"""Disaggregated prefill, on the prefill instance: the requests that go on at a decode instance.

A request that asked ``do_remote_decode`` (see ``disaggregated``) runs its prefill here. When it finishes
normally, its tracker's hand-off carrier joins the ``kv_transfer_params`` vLLM returns to the caller, who
forwards them to the decode instance; its part here then ends as sent (the tracker's ``kv_sent``), not
finished.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from otel_llm import semconv as sc
from otel_llm.integrations.vllm import disaggregated as pd
from otel_llm.integrations.vllm.reading import finish_reason_name


class HandOffs:
    """The requests of one adapter that asked ``do_remote_decode``, and those being handed off."""

    __slots__ = ("handing_off", "remote_decode")

    def __init__(self) -> None:
        # Requests that asked do_remote_decode while they run here, and those whose carrier went out with
        # their last output (handed off: kv_sent, not finished).
        self.remote_decode: set[str] = set()
        self.handing_off: set[str] = set()

    def expect(self, request_id: str) -> None:
        """``request_id`` is the prefill part of a disaggregated request: it may be handed off."""
        self.remote_decode.add(request_id)

    def hand_off(self, outputs: Iterable[Any], live: Mapping[str, Any]) -> None:
        """A request of ``outputs`` that asked ``do_remote_decode`` and finished normally goes on at a
        decode instance; its carrier joins the ``kv_transfer_params`` vLLM returns to the caller.
        ``live``: the adapter's followed requests, request id -> tracker."""
        for out in outputs:
            request_id = out.request_id
            if request_id not in self.remote_decode or out.finish_reason is None:
                continue
            tracker = live.get(request_id)
            if tracker is None or getattr(tracker, "role", None) != sc.ROLE_PREFILL:
                continue  # a ready tracker of another role was given: the trace ends here
            if finish_reason_name(out.finish_reason) not in (sc.REASON_STOP, sc.REASON_LENGTH):
                continue  # aborted or failed: no decode instance takes it, it ends here
            carrier = tracker.handoff_carrier(request_id)
            if carrier is not None:
                pd.attach_carrier(out, carrier)
                self.handing_off.add(request_id)

    def sent(self, request_id: str, tracker: Any, ts: float) -> None:
        """The prefill instance's part ended at ``ts`` (monotonic seconds): vLLM's frontend saw the
        request's last output.

        vLLM's engine core learns when the KV cache has left (``KVConnectorOutput.finished_sending``,
        when it frees the blocks), but sends the frontend nothing then: this is the last moment the
        frontend sees (for a connector that saves synchronously, such as vLLM's example connector, the
        KV cache was written within the step that produced the output)."""
        self.forget(request_id)
        tracker.kv_sent(request_id, ts=ts)

    def forget(self, request_id: str) -> None:
        """``request_id`` ended here (or its tracker no longer follows it): nothing more to hand off."""
        self.remote_decode.discard(request_id)
        self.handing_off.discard(request_id)

    def clear(self) -> None:
        self.remote_decode.clear()
        self.handing_off.clear()
