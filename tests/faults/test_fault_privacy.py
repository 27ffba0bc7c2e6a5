"""Privacy: the core never takes prompt or output text, and metric attributes stay a fixed allow-list
(no request ids, no user attributes) however many distinct ids and attribute values requests carry."""

from __future__ import annotations

import inspect

from otel_llm import RequestTracker

HOOKS = ("queued", "scheduled", "tokens", "preempted", "finished")


def test_hooks_take_no_text() -> None:
    for name in HOOKS:
        params = set(inspect.signature(getattr(RequestTracker, name)).parameters) - {"self"}
        assert not {p for p in params if p in {"prompt", "text", "output", "messages", "completion"}}, name


def test_metric_attributes_never_carry_request_ids_or_user_attributes(harness) -> None:
    t = harness.tracker
    n = 300
    for i in range(n):
        rid = f"req-{i:05d}"
        t.queued(
            rid, prompt_tokens=3, attributes={"user.id": f"user-{i}", "session": i, "gen_ai.prompt": "hi"}
        )
        t.scheduled([rid])
        t.tokens([rid])
        t.tokens([rid])
        t.finished(rid, reason="stop" if i % 2 else "length")
    attribute_sets = set()
    for points in harness.metrics().values():
        for p in points:
            attrs = dict(p.attributes)
            assert not {"user.id", "session", "gen_ai.prompt"} & set(attrs)
            assert not any(isinstance(v, str) and v.startswith(("req-", "user-")) for v in attrs.values())
            attribute_sets.add(tuple(sorted(attrs.items())))
    # Bounded: a handful of sets (finish reasons, token types, states), nowhere near one per request.
    assert len(attribute_sets) < 20
