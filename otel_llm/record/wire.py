"""The record's wire form: what crosses from the engine's process to the export process.

A message is one ``marshal`` payload of plain values (``None``, bools, ints, floats, strings, tuples,
lists and dicts of them): ``(VERSION, kind, body)``. ``marshal`` is CPython's own encoder of exactly these
types, written in C and without pickle's object model (nothing in a message can name code to run); its
format may differ between Python versions, which is why a message goes only between two processes of one
interpreter (the export process is started from ``sys.executable``) and carries the record layout's
``VERSION``, checked on the way in. Each record, tracker description and set of figures travels as a tuple
of its fields in the order of its ``FIELDS``.

Kinds (engine -> export process): ``start`` (the pipeline's settings, once), ``batch`` (new trackers,
records, figures), ``flush`` and ``stop``; (export process -> engine): ``ack`` (how far it got, what it
delivered), ``flushed`` and ``stopped``. ``otel_llm.export.process`` documents each body.
"""

from __future__ import annotations

import marshal
from operator import attrgetter
from typing import Any

from otel_llm.record import VERSION, Figures, RequestRecord, TrackerInfo

_record_fields = attrgetter(*RequestRecord.FIELDS)
_figures_fields = attrgetter(*Figures.FIELDS)


class WireError(ValueError):
    """A message that is not of this version's wire form."""


def record_tuple(rec: RequestRecord) -> tuple[Any, ...]:
    """The record's fields, in ``RequestRecord.FIELDS`` order."""
    return _record_fields(rec)


def record_from(fields: tuple[Any, ...] | list[Any]) -> RequestRecord:
    return RequestRecord(*fields)


def info_tuple(info: TrackerInfo) -> tuple[Any, ...]:
    return (info.base, info.detail, info.role, info.clock_offset_ns)


def info_from(fields: tuple[Any, ...] | list[Any]) -> TrackerInfo:
    base, detail, role, offset = fields
    return TrackerInfo(dict(base), detail, role, offset)


def figures_tuple(figures: Figures) -> tuple[Any, ...]:
    return _figures_fields(figures)


def figures_from(fields: tuple[Any, ...] | list[Any]) -> Figures:
    return Figures(*fields)


def encode(kind: str, body: Any) -> bytes:
    """One message of ``kind``; ``body`` must be plain values only."""
    return marshal.dumps((VERSION, kind, body))


def decode(data: bytes) -> tuple[str, Any]:
    """(kind, body) of one message; ``WireError`` when it is not of this version's form."""
    try:
        message = marshal.loads(data)
    except (EOFError, ValueError, TypeError) as exc:
        raise WireError(f"not a record message: {exc}") from None
    if not (isinstance(message, tuple) and len(message) == 3):
        raise WireError("not a record message")
    version, kind, body = message
    if version != VERSION:
        raise WireError(f"record layout version {version!r}, this otel_llm reads {VERSION}")
    return kind, body
