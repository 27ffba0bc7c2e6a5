"""The vLLM instrumentor in the development environment, where vLLM is not installed.

vLLM cannot be installed here (it lives in its own virtualenv, see test_vllm_integration.py), so the
"unknown vLLM version" cases use a stand-in ``vllm`` package written to a temporary folder: only module
and class shapes, which is all the instrumentor looks at before it patches. The real vLLM is exercised
by test_vllm_integration.py.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_llm import RequestTracker
from otel_llm.integrations import import_hook, patching
from otel_llm.integrations.vllm import VLLMInstrumentor
from otel_llm.integrations.vllm.identity import identify
from otel_llm.integrations.vllm.state import log

LOGGER = log.name  # every message of the integration

ENGINE_INIT = """
import enum
from dataclasses import dataclass
class EngineCoreEventType(enum.IntEnum):
    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3
@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list
    finish_reason: object = None
    events: object = None
"""
ENGINES = {
    "llm_engine.py": """
class LLMEngine:
    def __init__(self, vllm_config=None):
        pass
""",
    "async_llm.py": """
class AsyncLLM:
    def __init__(self, vllm_config=None):
        pass
    async def add_request(self, request_id, prompt, params, arrival_time=None, trace_headers=None):
        pass
""",
}
OUTPUT_PROCESSOR = """
class _Base:
    def abort_requests(self, request_ids, internal):
        for rid in request_ids:
            self.request_states.pop(rid, None)
        return list(request_ids)

class OutputProcessor(_Base):
    def __init__(self):
        self.request_states = {}
    def add_request(self, request, prompt=None, parent_req=None, request_index=0):
        self.request_states[request.request_id] = request
    def process_outputs(self, engine_core_outputs, engine_core_timestamp=None, iteration_stats=None):
        return "processed"
    def update_scheduler_stats(self, scheduler_stats):
        return "updated"
    def do_tracing(self, engine_core_output, req_state, iteration_stats):
        return None
"""
SCHEDULER = """
class Scheduler:
    def __init__(self, vllm_config, log_stats=False):
        self.log_stats = log_stats
    def schedule(self):
        return None
"""
SCHEDULER_OUTPUT = """
from dataclasses import dataclass
@dataclass
class CachedRequestData:
    req_ids: list
    resumed_req_ids: set
    num_computed_tokens: list
@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
"""


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(patching, "_warned", set())
    yield
    VLLMInstrumentor().uninstrument()
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


def stand_in_vllm(root: Path, monkeypatch: pytest.MonkeyPatch, engine: str, processor: str) -> None:
    files = {
        "vllm/__init__.py": "",
        "vllm/v1/__init__.py": "",
        "vllm/v1/engine/__init__.py": engine,
        "vllm/v1/engine/output_processor.py": processor,
        "vllm/v1/core/__init__.py": "",
        "vllm/v1/core/sched/__init__.py": "",
        "vllm/v1/core/sched/scheduler.py": SCHEDULER,
        "vllm/v1/core/sched/output.py": SCHEDULER_OUTPUT,
        **{f"vllm/v1/engine/{name}": text for name, text in ENGINES.items()},
    }
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_without_vllm_instrument_logs_once_and_does_nothing(caplog: pytest.LogCaptureFixture) -> None:
    spec = importlib.util.find_spec("vllm")  # this test folder itself may show up as a namespace package
    if spec is not None and spec.origin is not None:
        pytest.skip("vLLM is installed in this environment; this test needs it absent")
    caplog.set_level(logging.WARNING, logger=LOGGER)
    instrumentor = VLLMInstrumentor()
    instrumentor.instrument()
    instrumentor.instrument(model="m")
    instrumentor.uninstrument()
    assert not instrumentor.is_instrumented
    (message,) = warnings_of(caplog)
    assert "not installed" in message
    assert "vllm" not in sys.modules


def test_unknown_vllm_shape_logs_what_is_missing_and_patches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    old_engine = ENGINE_INIT.replace("    PREEMPTED = 3\n", "")
    old_processor = OUTPUT_PROCESSOR.replace("def process_outputs", "def process")
    stand_in_vllm(tmp_path, monkeypatch, old_engine, old_processor)
    from vllm.v1.engine.output_processor import OutputProcessor

    before = dict(vars(OutputProcessor))
    caplog.set_level(logging.WARNING, logger=LOGGER)
    VLLMInstrumentor().instrument()
    VLLMInstrumentor().instrument()
    assert not VLLMInstrumentor().is_instrumented
    assert dict(vars(OutputProcessor)) == before
    (message,) = warnings_of(caplog)
    assert "process_outputs" in message and "PREEMPTED" in message


def test_uninstrument_restores_the_classes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_vllm(tmp_path, monkeypatch, ENGINE_INIT, OUTPUT_PROCESSOR)
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.output_processor import OutputProcessor

    processor_before, scheduler_before = dict(vars(OutputProcessor)), dict(vars(Scheduler))
    VLLMInstrumentor().instrument(tracker=_RaisingTracker())
    assert VLLMInstrumentor().is_instrumented
    for name in ("add_request", "process_outputs", "abort_requests", "update_scheduler_stats"):
        assert vars(OutputProcessor)[name] is not processor_before.get(name)
    assert Scheduler(vllm_config=None).log_stats is True  # stats logging forced on
    VLLMInstrumentor().uninstrument()
    assert dict(vars(OutputProcessor)) == processor_before  # abort_requests (inherited) is gone again
    assert dict(vars(Scheduler)) == scheduler_before
    assert Scheduler(vllm_config=None).log_stats is False


def test_telemetry_failure_never_reaches_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stand_in_vllm(tmp_path, monkeypatch, ENGINE_INIT, OUTPUT_PROCESSOR)
    from vllm.v1.engine.output_processor import OutputProcessor

    VLLMInstrumentor().instrument(tracker=_RaisingTracker())
    caplog.set_level(logging.WARNING, logger=LOGGER)
    processor = OutputProcessor()
    request = _Request("r1")
    processor.add_request(request)
    event = _Event("QUEUED", 1.0)
    output = _Output("r1", [7], [event])
    stats = _SchedulerStats()
    for _ in range(3):
        assert processor.process_outputs([output], 2.0, None) == "processed"
        assert processor.update_scheduler_stats(stats) == "updated"
    assert processor.abort_requests(["r1"], internal=True) == ["r1"]
    assert len(warnings_of(caplog)) >= 1
    assert len(set(warnings_of(caplog))) == len(warnings_of(caplog))  # each problem logged once


def test_a_vllm_without_scheduler_stats_warns_once_and_traces_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Older vLLM frontends have no update_scheduler_stats: no engine-state metrics, a warning that says
    so, and every other wrapper in place."""
    older = OUTPUT_PROCESSOR.replace("def update_scheduler_stats", "def _not_it")
    stand_in_vllm(tmp_path, monkeypatch, ENGINE_INIT, older)
    from vllm.v1.engine.output_processor import OutputProcessor

    caplog.set_level(logging.WARNING, logger=LOGGER)
    VLLMInstrumentor().instrument()
    assert VLLMInstrumentor().is_instrumented
    assert hasattr(OutputProcessor.process_outputs, "__wrapped__")
    assert "update_scheduler_stats" not in vars(OutputProcessor)
    (message,) = warnings_of(caplog)
    assert "update_scheduler_stats" in message and "KV-cache usage" in message


class _SchedulerStats:
    """vLLM's SchedulerStats, as far as the adapter reads it."""

    num_running_reqs = 1
    num_waiting_reqs = 0
    kv_cache_usage = 0.5


class _RaisingTracker:
    """A tracker whose every hook fails: stands in for any telemetry bug."""

    def __getattr__(self, name: str):
        def fail(*args, **kwargs):
            raise RuntimeError(f"tracker.{name} broke")

        return fail


class _Request:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.prompt_token_ids = [1, 2, 3]
        self.arrival_time = 0.0
        self.trace_headers = None


class _Kind:
    def __init__(self, name: str) -> None:
        self.name = name


class _Event:
    def __init__(self, kind: str, timestamp: float) -> None:
        self.type = _Kind(kind)
        self.timestamp = timestamp


class _Output:
    def __init__(self, request_id: str, new_token_ids: list[int], events: list[_Event]) -> None:
        self.request_id = request_id
        self.new_token_ids = new_token_ids
        self.events = events
        self.finish_reason = None
        self.error = None


def test_instrument_waits_for_vllm_to_be_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed but not imported (every process opentelemetry-instrument starts): nothing of vLLM is
    imported until the application imports it; then the classes are patched at once."""
    stand_in_vllm(tmp_path, monkeypatch, ENGINE_INIT, OUTPUT_PROCESSOR)
    VLLMInstrumentor().instrument()
    assert "vllm" not in sys.modules
    assert not VLLMInstrumentor().is_instrumented
    import vllm  # noqa: F401  (the application's import)

    assert VLLMInstrumentor().is_instrumented
    from vllm.v1.engine.output_processor import OutputProcessor

    assert OutputProcessor.process_outputs.__wrapped__  # type: ignore[attr-defined]


def test_uninstrument_before_vllm_is_imported_removes_the_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_vllm(tmp_path, monkeypatch, ENGINE_INIT, OUTPUT_PROCESSOR)
    VLLMInstrumentor().instrument()
    VLLMInstrumentor().uninstrument()
    import vllm  # noqa: F401

    assert not VLLMInstrumentor().is_instrumented
    assert not any(type(f).__module__ == import_hook.__name__ for f in sys.meta_path)


def test_warnings_show_when_the_root_logger_hides_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """As under `vllm serve`: root logger and its handlers at ERROR. otel_llm's warnings still show."""
    root = logging.getLogger()
    package = logging.getLogger("otel_llm")
    monkeypatch.setattr(root, "level", logging.ERROR)
    monkeypatch.setattr(root, "handlers", [logging.StreamHandler()])
    root.handlers[0].setLevel(logging.ERROR)
    monkeypatch.setattr(package, "level", logging.NOTSET)
    monkeypatch.setattr(package, "handlers", [])
    stand_in_vllm(tmp_path, monkeypatch, ENGINE_INIT, OUTPUT_PROCESSOR)
    from vllm.v1.engine.output_processor import OutputProcessor

    VLLMInstrumentor().instrument(tracker=RequestTracker())
    processor = OutputProcessor()
    processor.add_request(_Request("r1"))
    processor.process_outputs([_Output("r1", [7], [])], 2.0, None)  # no events: the engine core is bare
    err = capfd.readouterr().err
    assert "WARNING" in err and "VLLM_PLUGINS" in err


def test_client_ids_and_operations_from_vllms_request_names() -> None:
    def named(internal: str, external: str | None) -> Any:
        return type("R", (), {"request_id": internal, "external_req_id": external})()

    completion = identify(named("cmpl-5f2a-0-8281c457", "cmpl-5f2a-0"))
    assert (completion.client_id, completion.operation) == ("cmpl-5f2a", "text_completion")
    assert completion.internal_id == "cmpl-5f2a-0-8281c457"
    second_prompt = identify(named("cmpl-my-id-1-1234abcd", "cmpl-my-id-1"))
    assert second_prompt.client_id == "cmpl-my-id"
    chat = identify(named("1_chatcmpl-77-aa", "chatcmpl-77"), choice=1)
    assert (chat.client_id, chat.operation, chat.choice) == ("chatcmpl-77", "chat", 1)
    offline = identify(named("3-abcdef12", "3"))
    assert (offline.client_id, offline.operation) == ("3", "text_completion")
    assert identify(named("x", None)).client_id == "x"
