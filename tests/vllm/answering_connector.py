"""vLLM's ``ExampleConnector`` that also answers ``kv_transfer_params``, as connectors such as NIXL do.

Loaded by ``drive_disaggregated.py`` through vLLM's ``kv_connector_module_path``. The example connector
itself answers nothing (its decode side finds the KV cache by the prompt's hash); a production connector
returns the address and blocks of the KV cache for the decode instance. For requests that ask for it
(``test_answer`` in their params) this one returns such an answer, so the tier sees otel_llm's carrier
join a connector's own answer through vLLM's real frontend. No ``do_remote_prefill`` in it: that flag
makes vLLM's scheduler wait for an asynchronous load, which the example connector never reports.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

ANSWER_KEY = "test_answer"  # a prefill request's params: answer it
ENGINE_ID = "example-prefill"


class AnsweringExampleConnector(ExampleConnector):
    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        delay_free, params = super().request_finished(request, block_ids)
        asked = getattr(request, "kv_transfer_params", None) or {}
        if params is None and asked.get(ANSWER_KEY):
            params = {"remote_engine_id": ENGINE_ID, "remote_block_ids": list(block_ids)}
        return delay_free, params
