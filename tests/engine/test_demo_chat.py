"""The demo's chat traffic: a shared system prompt, single questions and multi-turn conversations whose
next turn resends the history with the answer's own tokens; and, run as ``otel-llm demo``, spans that
carry cache reads on most requests and the recompute figures, and a waterfall that states them.

The demo's file is read with ``json`` alone (not otel_llm's reader), and the waterfall's numbers are
checked against the sums of that file's ``llm.recompute`` spans.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from otel_llm.kit.commands.chat import (
    MIN_ROOM,
    SYSTEM_PROMPT,
    TURNS,
    ChatClient,
    ChatRequest,
    make_chat_workload,
)
from otel_llm.kit.commands.demo import chat_question
from otel_llm.kit.engine import ByteTokenizer

ENCODE = ByteTokenizer().encode


def test_the_workload_has_conversations_and_single_questions() -> None:
    workload = make_chat_workload(32, 0, 384, chat_question)
    assert len(workload) == 32
    later = [i for i, r in enumerate(workload) if r.follows is not None]
    assert len(later) == (32 // 8) * (TURNS - 1)
    for i in later:  # each later turn follows the turn just before it
        assert workload[i].follows == i - 1
    for r in workload:
        if r.follows is None:  # a first turn or single question fits with the system prompt
            assert len(SYSTEM_PROMPT) + len("User: ") + len(r.text) + r.max_tokens <= 384


def test_a_later_turn_resends_the_history_with_the_answer() -> None:
    workload = [ChatRequest(0, "hello", 4), ChatRequest(3, "and then?", 4, follows=0)]
    client = ChatClient(workload, ENCODE, max_len=384)
    ((rid, first, _),) = client.arrivals(0)
    assert first == ENCODE(SYSTEM_PROMPT + "User: hello")
    assert client.next_arrival() is None and not client.done  # the next turn waits for the answer
    client.delivered(rid, [65, 66], finished=False, step=1)
    client.delivered(rid, [67], finished=True, step=2)
    assert client.arrivals(4) == []  # it arrives 3 steps after the answer finished
    ((rid2, second, _),) = client.arrivals(5)
    assert rid2 == "req-001" and client.done
    assert second == [*first, 65, 66, 67, *ENCODE("\nUser: and then?")]


def test_a_history_that_no_longer_fits_starts_over_from_the_system_prompt() -> None:
    workload = [ChatRequest(0, "x" * 40, 8), ChatRequest(1, "short", 8, follows=0)]
    max_len = len(SYSTEM_PROMPT) + MIN_ROOM
    client = ChatClient(workload, ENCODE, max_len)
    ((rid, first, _),) = client.arrivals(0)
    assert first[: len(SYSTEM_PROMPT)] == ENCODE(SYSTEM_PROMPT)
    client.delivered(rid, [70] * 16, finished=True, step=0)
    ((_, prompt, max_tokens),) = client.arrivals(1)
    assert prompt == ENCODE(SYSTEM_PROMPT + "User: short")
    assert len(prompt) + max_tokens <= max_len


def test_a_tiny_cache_gets_no_system_prompt() -> None:
    max_len = len(SYSTEM_PROMPT) + MIN_ROOM - 1
    workload = make_chat_workload(16, 1, max_len, chat_question)
    client = ChatClient(workload, ENCODE, max_len)
    prompts = client.arrivals(10**6)
    assert prompts and all(p[: len("User: ")] == ENCODE("User: ") for _, p, _ in prompts)
    assert all(len(p) + m <= max_len for _, p, m in prompts)


def test_chat_questions_fit_their_room() -> None:
    rng = random.Random(3)
    for room in (1, 5, 40, 200):
        for _ in range(50):
            assert 1 <= len(chat_question(rng, room)) <= room


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for a in span.get("attributes", []):
        value = a["value"]
        out[a["key"]] = int(value["intValue"]) if "intValue" in value else next(iter(value.values()))
    return out


def test_the_demos_spans_carry_cache_reads_and_recompute_figures(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # the file default
    env["COLUMNS"] = "160"
    demo = subprocess.run(
        [sys.executable, "-m", "otel_llm.kit.cli", "demo", "--requests", "24", "--output-dir", "out"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert demo.returncode == 0, demo.stderr
    (traces,) = (tmp_path / "out").glob("*/traces.jsonl")
    spans = [
        span
        for line in traces.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]
    roots = {s["traceId"]: _attrs(s) for s in spans if s["name"] == "llm.request"}
    assert len(roots) == 24
    cached = [a["gen_ai.usage.cache_read.input_tokens"] for a in roots.values()]
    assert sum(1 for c in cached if c > 0) >= 0.75 * len(cached), cached  # the shared system prompt

    recomputes: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        if s["name"] == "llm.recompute":
            recomputes.setdefault(s["traceId"], []).append(_attrs(s))
    assert recomputes, "the demo must preempt"
    for trace_id, found in recomputes.items():
        root = roots[trace_id]
        assert root["llm.preemptions.recompute.tokens"] == sum(a["llm.recompute.tokens"] for a in found)
        assert root["llm.preemptions.recompute.cached_tokens"] == sum(
            a["llm.recompute.cached_tokens"] for a in found
        )
    assert any(a["llm.recompute.cached_tokens"] > 0 for found in recomputes.values() for a in found)

    # The waterfall printed is the most preempted request's, and says what its recomputes cost and saved.
    shown = re.search(r"request (\S+)\s+trace ([0-9a-f]{32})", demo.stdout)
    assert shown is not None, demo.stdout
    root = roots[shown.group(2)]
    assert root["llm.request.id"] == shown.group(1)
    assert root["llm.preemptions"] == max(a["llm.preemptions"] for a in roots.values())
    stated = (
        f"recomputes: {root['llm.preemptions.recompute.tokens']} tokens computed again, "
        f"{root['llm.preemptions.recompute.cached_tokens']} read from the prefix cache"
    )
    assert stated in demo.stdout
