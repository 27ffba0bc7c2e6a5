"""What each engine step computed, per request: the optional ``batch()`` hook's log.

An engine that calls ``RequestTracker.batch(scheduled)`` once per step (vLLM's
``SchedulerOutput.num_scheduled_tokens``: request id -> tokens the step computes for it) lets the tracker
say why a request's tokens stalled (``otel_llm.hooks.stalls``) and what each request cost the engine
(``otel_llm.hooks.engine_time``). Each call becomes one ``BatchStep`` in a bounded log; the next
``tokens()`` call sets its end. An engine that never calls it pays one ``None`` check per ``tokens()``
call and nothing else.

Kinds of work, decided here from the request's own timeline (the tracker knows its phase; the engine
only counts tokens): ``prefill`` (its prompt, before the first token), ``recompute`` (after a
rescheduling, until the token that follows it), ``decode`` (one token of a request past its first) and
``spec`` (more than one: speculative decoding). A step in which every request computes one token (a pure
decode batch, the common case) is told apart with two C-level passes over the counts and nothing per
request; other steps look up only the requests with more than one token.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Mapping, Sequence
from itertools import accumulate, compress, islice, repeat
from operator import attrgetter, mul, sub, truediv
from typing import Any

from otel_llm.hooks.timeline import Timeline

BATCH_LOG_SIZE = 4096  # engine steps remembered (up to twice as many): about 150 bytes each
# Gaps up to this long are not indexed by class: the stall floor (``stalls.STALL_FLOOR_S``) is above it.
MIN_INDEXED_GAP_S = 0.001
# A step's heavy entries (prefill and recompute) kept by request: the largest, by tokens.
MAX_HEAVY = 8

PREFILL, RECOMPUTE, DECODE, SPEC = "prefill", "recompute", "decode", "spec"

_START, _TOKENS = attrgetter("start"), attrgetter("tokens")


class BatchStep:
    """One ``batch()`` call: when the step began and ended (monotonic seconds; ``end`` None until the next
    ``tokens()``), the tokens it computed by kind, the requests with prefill or recompute work
    (``heavy``: (request id, tokens, kind), largest first, at most ``MAX_HEAVY``), and which requests it
    held when it did not hold every running one (``members``; None: every running request). ``tokens``:
    the step's tokens in all (at least 1), and ``counts`` the requests for which it computed other than
    one token, as (request id, tokens) pairs (a dict once a finished request has looked one up in it),
    for the engine time of each (``otel_llm.hooks.engine_time``)."""

    __slots__ = (
        "counts",
        "decode",
        "end",
        "heavy",
        "members",
        "prefill",
        "recompute",
        "requests",
        "spec",
        "start",
        "tokens",
    )

    def __init__(self, start: float, requests: int, tokens: int = 1) -> None:
        self.start = start
        self.end: float | None = None
        self.requests = requests
        self.tokens = tokens if tokens > 0 else 1  # a divisor: a step that computed nothing splits nothing
        self.prefill = self.recompute = self.spec = 0
        self.decode = requests  # one token each until told otherwise
        self.heavy: tuple[tuple[Any, int, str], ...] = ()
        self.members: frozenset[Any] | None = None
        self.counts: Sequence[tuple[Any, int]] | dict[Any, int] = ()

    def holds(self, request_id: Any) -> bool:
        members = self.members
        return members is None or request_id in members


def kind_of(tl: Timeline | None) -> str:
    """The kind of the tokens (more than one) a step computed for the request of ``tl``."""
    if tl is None:
        return PREFILL
    preemptions = tl.preemptions
    if preemptions and preemptions[-1].recomputed is None and preemptions[-1].rescheduled is not None:
        return RECOMPUTE
    if tl.first_token is None:
        return PREFILL
    return SPEC


def check_scheduled(scheduled: Any) -> tuple[int, int]:
    """(requests, tokens) of one ``batch()`` argument, or TypeError saying what to pass.

    Ints (numpy's too) pass with one C-level pass, ``sum``; anything else is named. Negative counts are
    refused where the step is told apart (``BatchLog.add``): a pure decode step sums to its size."""
    if scheduled.__class__ is dict:  # the common argument: a plain dict of ints, one check of the sum
        try:
            quick = sum(scheduled.values())
        except TypeError:
            pass  # named below
        else:
            if quick.__class__ is int:
                return len(scheduled), quick
    if not isinstance(scheduled, Mapping):
        raise TypeError(
            "batch() takes a mapping of request id -> tokens the step computes for it "
            f"(vLLM's SchedulerOutput.num_scheduled_tokens), got {type(scheduled).__name__}"
        )
    values = scheduled.values()
    try:
        total = sum(values)
    except TypeError:
        total = None
    if total.__class__ is not int:
        if total is None or isinstance(total, float) or not hasattr(total, "__index__"):
            odd = (v for v in values if isinstance(v, (bool, float)) or not hasattr(v, "__index__"))
            bad = next(odd, total)
            raise TypeError(f"batch() token counts must be ints, got {bad!r}")
        total = int(total)
    return len(scheduled), total


def size_class(gap: float) -> int:
    """A gap's class (gap > 0): four per doubling, in the gaps' order (a larger gap, a class at least as
    high). One class holds gaps within 19 % of each other."""
    return math.floor(math.log2(gap) * 4)


class BatchLog:
    """The last ``size`` steps (at least; up to twice as many are kept between trims), in time order, as
    parallel lists: the ``BatchStep`` objects and their ends (``math.inf`` until ended), so that a finished
    request's steps are found by bisection (C-level work, no per-step Python loop).

    For the stall finder (``otel_llm.hooks.stalls``), the log also keeps each ended step's gap (its end
    minus the previous step's end), and the steps by the class of their gap (``size_class``), filled in
    as requests finish, for every step ended since the last finish: so a request finds its gaps that
    stand out by looking at the classes above its threshold, not at each of its steps. A step's number
    (``base`` + its index) does not change when the log is trimmed. Every method: caller holds the
    tracker's lock."""

    def __init__(self, size: int = BATCH_LOG_SIZE) -> None:
        self.size = size
        self.steps: list[BatchStep] = []
        self.ends: list[float] = []
        self.partials: list[BatchStep] = []  # the logged steps that left a running request out (rare)
        self.partial_numbers: list[int] = []  # their numbers (``base`` + index), for bisection
        self.partial_members: list[frozenset[Any]] = []  # and which requests each held
        self.base = 0  # steps trimmed off so far: the number of steps[0]
        self.gaps: list[float] = []  # gaps[i]: ends[i] - ends[i - 1] (seconds), for the steps indexed so far
        self.by_class: dict[
            int, list[int]
        ] = {}  # gap class -> numbers of the steps with such a gap, in order
        self.classes: list[int] = []  # the classes in by_class, ascending
        # A stall's explanation over one step (its number -> what ``stalls`` worked out), shared by every
        # request held in that step: a batch's requests stall on the same steps.
        self.explained: dict[int, Any] = {}
        # For engine time (``otel_llm.hooks.engine_time``), filled in as requests finish like ``gaps``:
        # each step's time per token (seconds), and their running sums (cum[i]: the steps before index i).
        self.weights: list[float] = []
        self.cum: list[float] = []
        self.spec_numbers: list[int] = []  # the numbers of the steps with speculative tokens (rare)

    def add(
        self,
        ts: float,
        scheduled: Mapping[Any, int],
        requests: int,
        total: int,
        running: int,
        get: Any,
        recompute: Collection[Any] | None = None,
    ) -> None:
        """One step's composition; ``running``: requests the tracker has running, ``get``: its
        registry's lookup (request id -> Timeline or None); ``recompute``: requests whose tokens the
        engine says are a recompute (``RequestTracker.batch``)."""
        step = BatchStep(ts, requests, total)
        unknown = False
        if total != requests:  # not every request computes one token: look at those that do not
            unknown = self._classify(step, scheduled, get, recompute)
            if step.spec:
                self.spec_numbers.append(self.base + len(self.steps))
        # A running request sat this step out (fewer requests than running), or may have: the step holds
        # a request the tracker has not heard of yet (an engine that reports new requests late), or one
        # no longer running (more requests than running: an engine that reports a step after it evicted
        # one of its requests), so the count proves nothing. Say which ones it held.
        steps, ends = self.steps, self.ends
        if requests != running or unknown:
            members = step.members = frozenset(scheduled)
            self.partials.append(step)
            self.partial_numbers.append(self.base + len(steps))
            self.partial_members.append(members)
        if steps and steps[-1].end is None:  # a step with no tokens() call (prefill chunks only)
            steps[-1].end = ends[-1] = max(ts, steps[-1].start)
        steps.append(step)
        ends.append(math.inf)
        if len(steps) > 2 * self.size:  # trim in one go: amortised, a slice deletion per ``size`` steps
            self._trim(len(steps) - self.size)

    def _trim(self, cut: int) -> None:
        """Forget the oldest ``cut`` steps, and what was indexed of them."""
        del self.steps[:cut]
        del self.ends[:cut]
        del self.gaps[:cut]
        self.base = base = self.base + cut
        kept = bisect_left(self.partial_numbers, base)
        del self.partials[:kept]
        del self.partial_numbers[:kept]
        del self.partial_members[:kept]
        for size in self.classes:
            numbers = self.by_class[size]
            del numbers[: bisect_left(numbers, base)]
            if not numbers:
                del self.by_class[size]
        self.classes = sorted(self.by_class)
        self.explained = {n: e for n, e in self.explained.items() if n >= base}
        if len(self.weights) >= cut:
            del self.weights[:cut]
            del self.cum[:cut]
        else:  # weighed less far than the cut: start afresh at the oldest step kept
            self.weights, self.cum = [], []
        del self.spec_numbers[: bisect_left(self.spec_numbers, base)]

    def weigh(self, upto: int) -> None:
        """Each step's time per token, for the steps before index ``upto`` (all ended) not weighed yet,
        and their running sums: in passes at C speed over those steps. A step's time runs from its start,
        or from the end of the step before it if that is later (an engine that schedules a step while the
        one before it runs), to its end; never below 0."""
        weights = self.weights
        start = len(weights)
        if upto <= start:
            return
        steps, ends = self.steps[start:upto], self.ends
        starts = list(map(_START, steps))
        before = ends[start - 1 : upto - 1] if start else [starts[0], *ends[: upto - 1]]
        times = map(max, map(sub, ends[start:upto], map(max, starts, before)), repeat(0.0))
        new = list(map(truediv, times, map(_TOKENS, steps)))
        weights.extend(new)
        cum = self.cum
        if not cum:
            cum.append(0.0)
        cum.extend(islice(accumulate(new, initial=cum[-1]), 1, None))

    def index(self, upto: int) -> None:
        """Index the gaps of the steps before index ``upto`` (all ended) not indexed yet: each step once,
        as the first request that finishes after it needs it, in passes at C speed over those steps and
        one per class among them. Gaps of at most ``MIN_INDEXED_GAP_S`` are never stalls: not classed."""
        gaps, ends = self.gaps, self.ends
        start = len(gaps)
        if upto <= start:
            return
        if start == 0:
            gaps.append(0.0)  # the oldest step's gap goes back past the log: never a request's gap
            start = 1
        new = list(map(sub, ends[start:upto], ends[start - 1 : upto - 1]))
        gaps.extend(new)
        numbers = list(
            compress(range(self.base + start, self.base + upto), map(MIN_INDEXED_GAP_S.__lt__, new))
        )
        if not numbers:
            return
        # size_class of each, at C speed
        kept = compress(new, map(MIN_INDEXED_GAP_S.__lt__, new))
        sizes = list(map(math.floor, map(mul, map(math.log2, kept), repeat(4.0))))
        by_class = self.by_class
        for size in set(sizes):
            found = list(compress(numbers, map(size.__eq__, sizes))) if len(sizes) > 1 else numbers
            known = by_class.get(size)
            if known is None:
                by_class[size] = found
                self.classes = sorted(by_class)
            else:
                known.extend(found)

    def at_least(self, threshold: float, lo: int, hi: int) -> list[int]:
        """The indexes (in ``steps``) of the steps ``lo`` to ``hi - 1`` whose gap is at least
        ``threshold`` seconds (more than ``MIN_INDEXED_GAP_S``), in order; indexed up to ``hi``."""
        self.index(hi)
        base, gaps = self.base, self.gaps
        first, last = base + lo, base + hi
        lowest = size_class(threshold)
        found: list[int] = []
        for size in self.classes[bisect_left(self.classes, lowest) :]:
            numbers = self.by_class[size]
            part = numbers[bisect_left(numbers, first) : bisect_left(numbers, last)]
            if size == lowest:  # the class of the threshold itself: its gaps one by one
                part = [n for n in part if gaps[n - base] >= threshold]
            found.extend(part)
        found.sort()
        return [n - base for n in found]

    @staticmethod
    def _classify(
        step: BatchStep, scheduled: Mapping[Any, int], get: Any, told: Collection[Any] | None
    ) -> bool:
        """Tokens by kind, and the heavy entries; raises ValueError (storing nothing) on a negative
        count. ``told``: requests the engine says recompute (None: none). Returns whether one of the
        requests with more than one token is unknown to the tracker."""
        others = [(rid, n) for rid, n in scheduled.items() if n != 1]  # a comprehension: the fast loop
        prefill = recompute = spec = 0
        heavy: list[tuple[Any, int, str]] = []
        unknown = False
        for rid, n in others:
            if n > 1:
                tl = get(rid)
                if tl is None:
                    unknown = True
                kind = RECOMPUTE if told and rid in told else kind_of(tl)
                if kind == SPEC:
                    spec += n
                    continue
                heavy.append((rid, n, kind))
                if kind == PREFILL:
                    prefill += n
                else:
                    recompute += n
            elif n < 0:
                raise ValueError(f"batch() token counts must be >= 0, got {n!r} for {rid!r}")
        heavy.sort(key=lambda entry: entry[1], reverse=True)
        step.counts = others
        step.decode = step.requests - len(others)
        step.prefill, step.recompute, step.spec = prefill, recompute, spec
        step.heavy = tuple(heavy[:MAX_HEAVY])
        return unknown

    def ended(self, ts: float) -> None:
        """A ``tokens()`` call at ``ts``: the latest step that has no end yet ends there."""
        steps = self.steps
        if steps:
            latest = steps[-1]
            if latest.end is None:
                latest.end = ts
                self.ends[-1] = ts

    def between(self, start: float, end: float) -> tuple[list[BatchStep], list[float], list[BatchStep]]:
        """Copies of the steps that ended after ``start`` and by ``end`` (monotonic seconds), of their
        ends, and of those of them that left a running request out, in time order: two bisections and
        slices (the partial steps are few)."""
        ends = self.ends
        lo, hi = bisect_right(ends, start), bisect_right(ends, end)
        return self.steps[lo:hi], ends[lo:hi], self.partials_in(lo, hi)

    def partials_in(self, lo: int, hi: int) -> list[BatchStep]:
        """The partial steps among the steps of index ``lo`` to ``hi - 1``: two bisections."""
        numbers, base = self.partial_numbers, self.base
        return self.partials[bisect_left(numbers, base + lo) : bisect_left(numbers, base + hi)]

    def all_hold(self, request_id: Any, lo: int, hi: int) -> bool:
        """Whether every step of index ``lo`` to ``hi - 1`` held ``request_id``: a pass at C speed over
        the partial steps among them (in a preempting engine, most steps may be partial)."""
        numbers, base = self.partial_numbers, self.base
        members = self.partial_members[bisect_left(numbers, base + lo) : bisect_left(numbers, base + hi)]
        return all(map(frozenset.__contains__, members, repeat(request_id)))

    def oldest_start(self) -> float | None:
        """When the oldest logged step began (None: nothing logged)."""
        return self.steps[0].start if self.steps else None
