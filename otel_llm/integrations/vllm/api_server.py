"""The frontend under `vllm serve`: the API server's address, port and served model for every span.

vLLM's API server passes its engine client, its bound socket and its arguments to ``build_and_serve``
before it serves; the wrapper reads ``server.address`` / ``server.port`` there (the port read back from
the socket, so ``--port 0`` is known) and whether LoRA adapters may name the answers, and adds the
middleware that keeps callers' trace headers (``caller_headers.py``) to ``--middleware``. The module is
imported by the API server only, so an import hook waits for it (``watch``). `vllm serve` imports its CLI
module (``SERVE_CLI``) with it: when that completes without the module, this vLLM serves from somewhere
else, and the integration stops rather than trace every request without the server's attributes.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from otel_llm.integrations.patching import warn_once
from otel_llm.integrations.vllm import caller_headers, targets
from otel_llm.integrations.vllm.providers import configure_asked
from otel_llm.integrations.vllm.state import LOCK, IntegrationState, log
from otel_llm.server_attributes import server_attributes

Stop = Callable[[IntegrationState, str, str], None]

LOST = "server.address, server.port and gen_ai.response.model under vllm serve"


def watch(state: IntegrationState, stop: Stop) -> None:
    """Wrap ``build_and_serve`` when the API server's module is imported, and check, when `vllm serve`'s
    CLI module is imported, that it was."""
    from otel_llm.integrations import import_hook

    state.api_server_hook = import_hook.when_imported(targets.SERVE[0], lambda: _patch(state, stop))
    if state.stopped:
        return
    state.cli_hook = import_hook.when_imported(targets.SERVE_CLI, lambda: _check_served(state, stop))


def _check_served(state: IntegrationState, stop: Stop) -> None:
    with LOCK:
        state.cli_hook = None
        if state.patch is None or state.stopped or targets.SERVE[0] in sys.modules:
            return
    state.faults.count(targets.SERVE_CLI)
    stop(state, targets.SERVE_CLI, f"vllm serve does not import {targets.SERVE[0]}; {LOST} would be missing")


def _patch(state: IntegrationState, stop: Stop) -> None:
    """Wrap the API server's ``build_and_serve`` (its module is imported); called by the import hook."""
    with LOCK:
        state.api_server_hook = None
        if state.patch is None or state.stopped:  # uninstrumented meanwhile
            return
        why = None
        try:
            module = sys.modules[targets.SERVE[0]]
            original: Any = vars(module).get(targets.SERVE[1])
            if not targets.coroutine_function(original):
                why = f"this vLLM's API server has no {targets.SERVE[1]}"
            else:
                lacking = targets.lacks(targets.SERVE[1], original, targets.SERVE_ARGUMENTS, True, False)
                if lacking:
                    why = f"this vLLM's API server lacks {', '.join(lacking)}"
                else:
                    state.patch.replace(module, targets.SERVE[1], _wrap_build_and_serve(state, original))
                    return
        except Exception as exc:  # never break the API server's start
            why = f"{type(exc).__name__}: {exc}"
    state.faults.count(targets.SERVE[1])
    stop(state, targets.SERVE[1], f"{why}; {LOST} would be missing")


def _wrap_build_and_serve(state: IntegrationState, original: Callable[..., Any]) -> Callable[..., Any]:
    async def build_and_serve(
        engine_client: Any, listen_address: Any, sock: Any, args: Any, *rest: Any, **kw: Any
    ) -> Any:
        try:
            _read_api_server(state, sock, args)
        except Exception:
            state.faults.failed(targets.SERVE[1], LOST)
        return await original(engine_client, listen_address, sock, args, *rest, **kw)

    build_and_serve.__wrapped__ = original  # type: ignore[attr-defined]
    return build_and_serve


def _read_api_server(state: IntegrationState, sock: Any, args: Any) -> None:
    """server.address and server.port of the API server: the host it was told to listen on (none when
    every address), the port its socket is bound to (read back, so --port 0 is known), or its Unix
    socket's path (--uds). vLLM's answers name its first served model name (``gen_ai.response.model``,
    added per tracker), or the LoRA adapter a request asked for: with ``--enable-lora`` it is left out."""
    state.lora = bool(args.enable_lora)
    warn_of_several_api_servers(args)
    if not caller_headers.add_to(args):
        warn_once(
            log,
            "otel_llm: this vLLM's API server has no --middleware option; a caller's traceparent is "
            "kept only where vLLM passes it on itself",
        )
    uds = getattr(args, "uds", None)  # not every vLLM has --uds
    if isinstance(uds, str) and uds:
        state.api_server = server_attributes(None, None, unix_socket=uds)
        return
    bound = sock.getsockname()
    port = bound[1] if isinstance(bound, tuple) and len(bound) >= 2 else None
    host = args.host
    state.api_server = server_attributes(host if isinstance(host, str) else None, port)


def warn_of_several_api_servers(args: Any) -> None:
    """At an API server's start under ``vllm serve --api-server-count N`` (N > 1), what would lose or
    mix up its telemetry, said once with what to set. Nothing with one API server."""
    count = getattr(args, "api_server_count", None)
    if not (isinstance(count, int) and count > 1):
        return
    _warn_if_stopped_before_flushing(count, getattr(args, "shutdown_timeout", None))
    if not configure_asked():
        _warn_if_one_resource(count)  # configure_if_asked() gives each process its own instance


def _warn_if_stopped_before_flushing(count: int, wait: Any) -> None:
    """vLLM's launcher stops several API servers on SIGTERM by waiting ``--shutdown-timeout`` seconds
    (default 0) and then killing each one's process tree, export processes included: an API server
    still flushing loses its last telemetry without a word. Said with the value that lets the flush
    finish: our budget + 1 s of grace."""
    if not isinstance(wait, (int, float)):
        return
    from otel_llm.setup import shutdown_timeout

    try:
        needed = math.ceil(shutdown_timeout(None) + 1.0)
    except ValueError:
        return  # configure() says what is wrong with it
    if wait < needed:
        warn_once(
            log,
            "otel_llm: vllm serve --api-server-count %d kills its API servers %s s after SIGTERM "
            "(--shutdown-timeout); each needs up to %d s to send its last telemetry "
            "(OTEL_LLM_SHUTDOWN_TIMEOUT + 1 s), which is lost otherwise: pass --shutdown-timeout %d",
            count,
            wait,
            needed,
            needed,
        )


def _warn_if_one_resource(count: int) -> None:
    """Providers built by ``opentelemetry-instrument`` take the resource the SDK's detectors give. Before
    opentelemetry-sdk 1.45 that has no ``service.instance.id`` unless asked for: every API server then
    exports its cumulative metrics as the same stream, and a backend keeps whichever came last."""
    from opentelemetry.sdk.resources import Resource

    if "service.instance.id" in Resource.create().attributes:
        return
    warn_once(
        log,
        "otel_llm: the %d API servers of vllm serve export their metrics under one resource with no "
        "service.instance.id, so a backend takes their counters for one stream: opentelemetry-sdk 1.45 "
        "or later gives each process its own; with 1.43 or 1.44, add service_instance to "
        "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS; or set OTEL_LLM_VLLM_CONFIGURE=1",
        count,
    )
