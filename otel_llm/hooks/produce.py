"""A finished timeline -> its record (``otel_llm.record.RequestRecord``): what the hook side hands on.

Runs on the thread that finished the request, outside the tracker's lock (but for the copy of the step
log, taken under it). Everything the emit side needs is turned into plain data here: the exception of a
failed request becomes its class name and text, the parent context its ids and flags, the step log the
request's longest steps. Times stay monotonic seconds.
"""

from __future__ import annotations

from typing import Any

from otel_llm import semconv as sc
from otel_llm.hooks.identity import TraceIdentity, parent_span_context, plain_parent
from otel_llm.hooks.timeline import FinishedRequest
from otel_llm.record import RequestRecord, Stalls, StepRow

_FAILED = sc.FAILED_REASONS


def _new_record(fields: tuple[Any, ...]) -> RequestRecord:
    return tuple.__new__(RequestRecord, fields)


def record_of(
    fin: FinishedRequest,
    identity: TraceIdentity,
    steps: tuple[int, tuple[StepRow, ...]] | None = None,
    stalls: Stalls | None = None,
    engine_time: tuple[float, float] | None = None,
) -> RequestRecord:
    """The record of ``fin``; ``steps``: the request's steps (detail ``steps``), else None; ``stalls``
    and ``engine_time``: its stalls and its share of the engine's steps (the engine reports its
    batches), else None.

    On every finished request's path, so built in one step as the record's tuple (fields in
    ``RequestRecord.FIELDS`` order), with the rare parts (a parent, a failure, preemptions) only when
    there are any."""
    tl = fin.timeline
    reason = fin.reason
    parent = None if tl.parent is None else parent_span_context(tl.parent)
    error_type = status = None
    if reason in _FAILED:
        error_type, status = _failure(reason, fin.error)
    preemptions = tl.preemptions
    return _new_record(
        (
            str(tl.request_id),
            tl.attributes,
            tl.prompt_tokens,
            tl.output_tokens,
            tl.cached_tokens,
            tl.arrival,
            tl.queued,
            tl.first_scheduled,
            tl.first_token,
            fin.last_token,
            fin.finished,
            tl.last_event,
            reason,
            error_type,
            status,
            tl.trace_id,
            tl.span_id,
            None if parent is None else plain_parent(parent),
            tl.sampling,
            identity.random_trace_id(parent),
            tuple(
                (
                    p.preempted,
                    p.output_tokens,
                    p.last_token,
                    p.rescheduled,
                    p.recomputed,
                    p.cached_tokens,
                    p.recompute_tokens,
                )
                for p in preemptions
            )
            if preemptions
            else (),
            fin.handed_off,
            tl.handed_in,
            tl.prefill_kept,
            tl.kv_done,
            tl.kv_bytes,
            steps,
            stalls,
            engine_time,
        )
    )


def _failure(reason: str, error: Any) -> tuple[str, str]:
    """(``error.type``, status text) of a failed request: the exception's class and ``Type: message``,
    else the reason (or the text given as ``error=``)."""
    if isinstance(error, BaseException):
        return type(error).__qualname__, f"{type(error).__name__}: {error}"
    return reason, (reason if error is None else str(error))
