"""Where drive_scheduler.py meets vLLM's own types that change between releases, followed by feature
detection, never by version numbers (as the integration itself does).

- ``model_runner_output``: the model runner's answer of a step. ``req_id_to_index`` is a field only where
  vLLM's ``ModelRunnerOutput`` still has it (vLLM 0.34 removed it).
- ``EngineCoreLink``: a request as vLLM's engine core receives it from a frontend in another process
  (``vllm serve``, ``LLM`` with multiprocessing). The frontend's engine-core client packs it first where
  vLLM has that step (vLLM 0.34's ``core_client._with_packed_prompt``: the prompt ids become an int32
  NumPy array), vLLM's ``MsgpackEncoder`` encodes it, and the engine core's ``MsgpackDecoder`` decodes
  it; the engine core then builds its ``Request`` from what was decoded (a ``TokenBuffer`` around that
  array on 0.34). The frontend's ``OutputProcessor`` keeps the request as it was made, as vLLM's does.
  Only the ZeroMQ socket between the two encodings is left out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.v1.engine import EngineCoreRequest, core_client
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

_RUNNER_FIELDS = {f.name for f in dataclasses.fields(ModelRunnerOutput)}


def model_runner_output(request_ids: list[str], sampled: list[list[int]]) -> ModelRunnerOutput:
    """One step's sampled tokens, one list per scheduled request, in ``request_ids``' order."""
    fields: dict[str, Any] = {"req_ids": request_ids, "sampled_token_ids": sampled}
    if "req_id_to_index" in _RUNNER_FIELDS:
        fields["req_id_to_index"] = {rid: k for k, rid in enumerate(request_ids)}
    return ModelRunnerOutput(**fields)


class EngineCoreLink:
    """The frontend-to-engine-core path of one request, and what it gave the engine core.

    ``received``: per request id, the type of the prompt ids the engine core decoded (``list`` or
    ``ndarray``) and their count; ``packs_prompt``: whether this vLLM's client packs them at all."""

    def __init__(self) -> None:
        self._pack = getattr(core_client, "_with_packed_prompt", None)
        self._encoder = MsgpackEncoder()
        self._decoder = MsgpackDecoder(EngineCoreRequest)
        self.packs_prompt = callable(self._pack)
        self.received: dict[str, dict[str, Any]] = {}

    def send(self, request: EngineCoreRequest) -> EngineCoreRequest:
        """The engine core's copy of ``request``, as it comes out of vLLM's own encoding and decoding."""
        sent = self._pack(request) if self._pack is not None else request
        got = self._decoder.decode(self._encoder.encode(sent))
        ids = got.prompt_token_ids
        self.received[got.request_id] = {"type": type(ids).__name__, "count": len(ids)}
        return got
