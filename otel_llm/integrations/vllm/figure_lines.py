"""The lines a vLLM engine core writes to its frontend in another process (``engine_core_figures``), and
the address the frontend listens at.

The frontend listens on a Unix stream socket in the abstract namespace, named after the process that
started the engine cores and the frontend's client index (``address``). What is written is text, a line
each:

- a rescheduling: ``<SCHEDULED timestamp!r> <cached tokens> <request id>`` (the timestamp is the engine
  core's ``time.monotonic()`` value vLLM also puts on the event, so the two match exactly);
- a step: ``S <monotonic seconds its scheduling began!r> <requests> <tokens> <recomputing> <ids>``, where
  ``<tokens>`` is ``-`` when every request computes one token (a decode step) or the counts in the ids'
  order, comma-separated, ``<recomputing>`` is ``-`` or the positions of the requests whose tokens are a
  recompute, and ``<ids>`` the request ids, space-separated, or ``=`` for the same ids in the same
  order as the step line before it on that connection (a decode batch that did not change: the engine
  core skips writing them, the frontend reuses what it decoded). A request id with a space in it makes
  the count disagree, and the step is dropped.

Any local process can connect to an abstract address, so what arrives is parsed strictly: a line that
does not parse is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from otel_llm.integrations.vllm.compositions import Step

NAME = "otel-llm-vllm-figures-{pid}-{client}"
# Bytes an engine core keeps for a stream that is full, and the longest line a frontend reads: a step of
# a few thousand requests with vLLM's ids of about 50 characters is some 200 KB.
MAX_UNSENT = 1 << 20
SAME = "="  # a step line's ids: the same as the step line before it on the connection


def address(pid: int, client_index: int) -> bytes:
    """The abstract-namespace address of the frontend with this client index under this pid."""
    return b"\0" + NAME.format(pid=pid, client=client_index).encode()


def encode(figures: Iterable[tuple[str, float, int]]) -> bytes:
    """A line per (request id, SCHEDULED timestamp, cached tokens)."""
    return "".join(f"{ts!r} {cached} {rid}\n" for rid, ts, cached in figures if "\n" not in rid).encode()


def encode_step(
    ts: float,
    scheduled: Mapping[str, int],
    total: Any,
    recompute: list[str] | None,
    ids: list[str] | None = None,
    same: bool = False,
) -> bytes:
    """One step's line: ``scheduled`` is its ``num_scheduled_tokens`` (request id -> tokens), ``total``
    their sum as vLLM gives it (``total_num_scheduled_tokens``: equal to the count of requests in a decode
    step, which is then written without counts), ``recompute`` the requests among them that recompute.
    ``ids``: ``list(scheduled)`` when the caller has it; ``same``: they are the previous line's (``=``)."""
    if ids is None:
        ids = list(scheduled)
    tokens = "-" if total == len(ids) else ",".join(map(str, scheduled.values()))
    at = "-" if not recompute else ",".join(str(ids.index(rid)) for rid in recompute if rid in scheduled)
    named = SAME if same else " ".join(ids)
    return f"S {ts!r} {len(ids)} {tokens} {at or '-'} {named}\n".encode()


class PreviousStep:
    """A connection's last step as decoded: its ids and, for a decode step, its mapping (reused)."""

    __slots__ = ("decode", "ids")

    def __init__(self) -> None:
        self.ids: list[str] | None = None
        self.decode: dict[str, int] | None = None


def _decode_step(line: str, previous: PreviousStep | None = None) -> Step | None:
    parts = line.split(" ", 5)
    if len(parts) != 6:
        return None
    decoded = previous.decode if previous is not None else None
    if decoded is not None and parts[5] == SAME and parts[3] == "-" and parts[4] == "-":
        # The common line: the same decode batch as the last one, whose mapping is reused.
        try:
            ts, count = float(parts[1]), int(parts[2])
        except ValueError:
            return None
        if ts != ts or count != len(decoded):
            return None
        return ts, decoded, None
    try:
        ts, count = float(parts[1]), int(parts[2])
        if parts[5] == SAME:
            ids = previous.ids if previous is not None else None
            if ids is None:
                return None
        else:
            ids = parts[5].split(" ")
        plain = parts[3] == "-"
        counts = [1] * count if plain else [int(n) for n in parts[3].split(",")]
        at = None if parts[4] == "-" else [int(i) for i in parts[4].split(",")]
    except ValueError:
        return None
    if ts != ts or len(ids) != count or len(counts) != count or min(counts, default=1) < 1:
        return None
    if at is not None and not all(0 <= i < count for i in at):
        return None
    recompute = None if at is None else [ids[i] for i in at]
    if previous is None:
        return ts, dict(zip(ids, counts)), recompute
    if plain and parts[5] == SAME and previous.decode is not None:
        return ts, previous.decode, recompute  # the same decode batch: one mapping, read only by its takers
    scheduled = dict(zip(ids, counts))
    previous.ids, previous.decode = ids, scheduled if plain else None
    return ts, scheduled, recompute


def decode(
    lines: bytes, steps: list[Step] | None = None, previous: PreviousStep | None = None
) -> list[tuple[str, float, int]]:
    """The (request id, timestamp, cached tokens) of whole lines; the step lines go to ``steps`` (dropped
    when it is None); lines that do not parse are dropped. ``previous``: the connection's last step, for
    a step line that names the same requests (``=``; dropped without it)."""
    found = []
    for line in lines.decode("utf-8", "replace").split("\n"):
        if line.startswith("S "):
            step = _decode_step(line, previous) if steps is not None else None
            if step is not None and steps is not None:
                steps.append(step)
            continue
        parts = line.split(" ", 2)
        if len(parts) != 3 or not parts[2]:
            continue
        try:
            ts, cached = float(parts[0]), int(parts[1])
        except ValueError:
            continue
        if cached >= 0 and ts == ts:  # not NaN
            found.append((parts[2], ts, cached))
    return found
