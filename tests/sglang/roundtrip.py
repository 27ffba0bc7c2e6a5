"""instrument() / uninstrument() on SGLang's real classes, in the SGLang virtualenv; prints a JSON report.

Run by test_sglang_engine.py: ``python roundtrip.py``. Imports SGLang's scheduler, output streamer,
tokenizer manager and time-stats classes (no engine is started: these are the classes its processes
use), records every attribute the integration replaces, then instruments, uninstruments and instruments
again, and reports what it saw at each step.
"""

from __future__ import annotations

import json

from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.observability.req_time_stats import APIServerReqTimeStats, SchedulerReqTimeStats

from otel_llm.integrations.sglang import SGLangInstrumentor
from otel_llm.integrations.sglang.adapter import CARRIED

PATCHED = [
    (Scheduler, "_add_request_to_queue"),
    (Scheduler, "get_new_batch_prefill"),
    (Scheduler, "on_idle"),
    (SchedulerOutputStreamer, "stream_output"),
    (TokenizerManager, "_init_req_state"),
    (APIServerReqTimeStats, "__getstate__"),
]


def snapshot() -> dict[str, object]:
    """Each patched attribute as its class defines it, and whether the scheduler stats carry ours."""
    found: dict[str, object] = {f"{c.__name__}.{n}": c.__dict__.get(n) for c, n in PATCHED}
    found["carried"] = CARRIED in SchedulerReqTimeStats.__dict__
    return found


def main() -> None:
    original = snapshot()
    tool = SGLangInstrumentor()
    tool.instrument()
    wrapped = snapshot()
    unwraps = {
        f"{c.__name__}.{n}": getattr(c.__dict__[n], "__wrapped__", None) is original[f"{c.__name__}.{n}"]
        for c, n in PATCHED
    }
    tool.instrument()  # a second call while active does nothing
    twice = snapshot() == wrapped
    tool.uninstrument()
    restored = snapshot()
    tool.instrument()
    again = snapshot()
    tool.uninstrument()
    print(
        json.dumps(
            {
                "instrumented_changed": [k for k in original if original[k] is not wrapped[k]],
                "wraps_original": unwraps,
                "second_instrument_kept": twice,
                "restored_identical": [k for k in original if original[k] is restored[k]],
                "reinstrumented_changed": [k for k in original if original[k] is not again[k]],
                "attributes": sorted(original),
            }
        )
    )


if __name__ == "__main__":
    main()
