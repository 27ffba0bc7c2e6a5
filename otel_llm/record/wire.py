"""The record's wire form: what crosses from the engine's process to the export process.

A message is one ``marshal`` payload of plain values (``None``, bools, ints, floats, strings, tuples,
lists and dicts of them): ``(VERSION, kind, body)``. ``marshal`` is CPython's own encoder of exactly these
types, written in C and without pickle's object model (nothing in a message can name code to run); its
format may differ between Python versions, which is why a message goes only between two processes of one
interpreter (the export process is started from ``sys.executable``) and carries the record layout's
``VERSION``, checked on the way in. Each record, tracker description and set of figures travels as a tuple
of its fields in the order of its ``FIELDS``; a record is marshalled on its own as it is made
(``record_bytes``), and a batch carries those bytes.

Kinds (engine -> export process): ``start`` (the pipeline's settings, once), ``batch`` (new trackers,
records, figures), ``flush`` and ``stop``; (export process -> engine): ``ack`` (how far it got, what it
delivered), ``flushed`` and ``stopped``. ``otel_llm.export.process`` documents each body.
"""

from __future__ import annotations

import marshal
from operator import attrgetter
from typing import Any

from otel_llm.record import VERSION, Figures, RequestRecord, TrackerInfo

_dumps = marshal.dumps
# marshal's format 2: no back-references between the objects of one record (a record repeats none worth
# it), which makes it a third cheaper to write than the default format 4.
_RECORD_FORMAT = 2

_figures_fields = attrgetter(*Figures.FIELDS)


class WireError(ValueError):
    """A message that is not of this version's wire form."""


def record_bytes(rec: RequestRecord) -> bytes:
    """One record's wire form: its fields, in ``RequestRecord.FIELDS`` order, marshalled. Made on the
    thread that finished the request, while the record's data is still in that CPU's caches (encoding it
    later, on the sender's thread, measured four times the cost)."""
    return _dumps(tuple(rec), _RECORD_FORMAT)


def record_from(data: bytes) -> RequestRecord:
    fields = marshal.loads(data)
    return tuple.__new__(RequestRecord, fields)


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
