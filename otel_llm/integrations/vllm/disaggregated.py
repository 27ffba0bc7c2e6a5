"""vLLM's disaggregated prefill and decode: which part a request plays, and our carrier in its
``kv_transfer_params``.

vLLM's P/D set-up is driven per request by the KV connector's metadata, ``kv_transfer_params`` (a JSON
object the caller puts in the request; vLLM keeps it in ``SamplingParams.extra_args``):

- ``do_remote_decode: true``: this instance only prefills (the caller asks for ``max_tokens=1``); the KV
  cache is kept for a decode instance, and the connector's answer comes back to the caller in the
  request's output (``RequestOutput.kv_transfer_params``, the ``kv_transfer_params`` field of an OpenAI
  response). The caller (a proxy) forwards that answer unchanged to the decode instance;
- ``do_remote_prefill: true`` (plus the connector's block ids and address): this instance continues a
  request another instance prefilled.

The role is per request, not per instance: one vLLM instance (``kv_role: kv_both``) may serve both kinds,
and plain requests too. otel_llm adds its hand-off carrier (``otel_llm.hooks.handoff.CARRIER_KEYS``,
strings) to the prefill instance's answer, so it travels through the caller to the decode instance with the
connector's own keys. Nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_llm import semconv as sc
from otel_llm.hooks.handoff import CARRIER_KEYS, KEY_ARRIVAL, KEY_TRACEPARENT

KV_TRANSFER_PARAMS = "kv_transfer_params"  # the key in SamplingParams.extra_args
DO_REMOTE_DECODE = "do_remote_decode"
DO_REMOTE_PREFILL = "do_remote_prefill"


def transfer_params(request: Any) -> Mapping[str, Any] | None:
    """The ``kv_transfer_params`` an ``EngineCoreRequest`` came with (None when it has none)."""
    extra = getattr(getattr(request, "sampling_params", None), "extra_args", None)
    params = extra.get(KV_TRANSFER_PARAMS) if isinstance(extra, Mapping) else None
    return params if isinstance(params, Mapping) else None


def carrier_in(params: Mapping[str, Any] | None) -> dict[str, str] | None:
    """Our hand-off carrier inside ``kv_transfer_params`` (only our keys), or None when absent."""
    if not params:
        return None
    carrier = {key: params[key] for key in CARRIER_KEYS if isinstance(params.get(key), str)}
    return carrier if KEY_TRACEPARENT in carrier and KEY_ARRIVAL in carrier else None


def request_role(params: Mapping[str, Any] | None) -> str:
    """The request's part: ``prefill`` (asked ``do_remote_decode``), ``decode`` (asked
    ``do_remote_prefill``, or carries a prefill instance's carrier: connectors such as vLLM's example
    connector need no flag of their own on the decode side), else ``both``."""
    if not params:
        return sc.ROLE_BOTH
    if params.get(DO_REMOTE_DECODE) is True:
        return sc.ROLE_PREFILL
    if params.get(DO_REMOTE_PREFILL) is True or carrier_in(params) is not None:
        return sc.ROLE_DECODE
    return sc.ROLE_BOTH


def attach_carrier(output: Any, carrier: Mapping[str, str]) -> None:
    """Add ``carrier`` to the ``kv_transfer_params`` of a finishing ``EngineCoreOutput``, before vLLM's
    frontend turns it into the request's output (and the caller's answer).

    A connector that answers nothing (vLLM's example connector finds the KV cache by the prompt's hash,
    so it needs no metadata) gets a dict of our keys alone: the caller forwards ``kv_transfer_params``
    to the decode instance, the only way the carrier can get there. Connector keys are never replaced.
    """
    params = getattr(output, KV_TRANSFER_PARAMS, None)
    if isinstance(params, dict):
        for key, value in carrier.items():
            params.setdefault(key, value)
    elif params is None:
        setattr(output, KV_TRANSFER_PARAMS, dict(carrier))
    # Anything else (a connector's own object): left alone, the trace then ends on this instance.
