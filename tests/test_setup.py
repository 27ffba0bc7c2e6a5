"""configure(): validation, bounded shutdown, OTEL_SDK_DISABLED, output directory, globals, exit.

Shutdown is checked against a real closed port and a real receiver that never answers (a "black hole").
Its bound is asserted only as "returns at all" (a thread join with a generous deadline), never as a time.
Behaviour that touches OpenTelemetry's process-wide globals or process exit runs in a child process.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from otlp_receivers import GrpcReceiver, HttpReceiver, Mode, closed_port, drive_scenario

from otel_llm import RequestTracker
from otel_llm.setup import configure

# Every test here in both export modes (OTEL_LLM_EXPORT_MODE): configure()'s export process, and none.
pytestmark = pytest.mark.both_modes


@pytest.fixture(autouse=True)
def _export_mode(env: pytest.MonkeyPatch, export_mode: str) -> None:
    env.setenv("OTEL_LLM_EXPORT_MODE", export_mode)


RETURNS_WITHIN_S = 30.0  # "it returns": far above the configured 1 s bound, far below a hang


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grcp"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift"),
        ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "HTTP"),
    ],
)
def test_bad_protocol_is_a_value_error_naming_the_fix(env, tmp_path: Path, variable: str, value: str) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    env.setenv(variable, value)
    with pytest.raises(ValueError) as raised:
        configure(set_global=False)
    message = str(raised.value)
    assert variable in message and repr(value) in message
    assert "'grpc'" in message and "'http/protobuf'" in message
    assert not (tmp_path / "otel-llm-output").exists()


def test_bad_protocol_fails_even_when_files_would_be_used(env) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "udp")  # no endpoint: a typo must still surface at start-up
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        configure(set_global=False)


@pytest.mark.parametrize("variable", ["OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"])
def test_unknown_exporter_kind_is_a_value_error(env, variable: str) -> None:
    env.setenv(variable, "zipkin")
    with pytest.raises(ValueError, match=f"{variable}='zipkin'.*'otlp'.*'file'.*'none'"):
        configure(set_global=False)


@pytest.mark.parametrize("value", ["soon", "0", "-3", "nan"])
def test_bad_shutdown_timeout_is_a_value_error(env, value: str) -> None:
    env.setenv("OTEL_LLM_SHUTDOWN_TIMEOUT", value)
    with pytest.raises(ValueError, match=r"OTEL_LLM_SHUTDOWN_TIMEOUT.*positive number of seconds"):
        configure(set_global=False)


def test_shutdown_timeout_from_env_and_argument(env) -> None:
    env.setenv("OTEL_LLM_SHUTDOWN_TIMEOUT", "2.5")
    from_env = configure(set_global=False)
    from_arg = configure(set_global=False, shutdown_timeout_s=0.5)
    assert (from_env.shutdown_timeout_s, from_arg.shutdown_timeout_s) == (2.5, 0.5)
    assert from_env.shutdown() and from_arg.shutdown()


def shutdown_in_thread(telemetry: Any) -> tuple[threading.Thread, list[bool]]:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(telemetry.shutdown()), daemon=True)
    thread.start()
    thread.join(RETURNS_WITHIN_S)
    return thread, result


def telemetry_with_pending_data() -> Any:
    telemetry = configure(set_global=False, shutdown_timeout_s=1.0)
    tracker = RequestTracker(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
    )
    drive_scenario(tracker, time.monotonic() - 5.0)
    return telemetry


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_shutdown_returns_when_the_collector_port_is_closed(env, protocol: str) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    telemetry = telemetry_with_pending_data()

    thread, result = shutdown_in_thread(telemetry)
    assert not thread.is_alive(), "shutdown() did not return"
    assert len(result) == 1
    assert telemetry.shutdown() is result[0]  # idempotent: same answer, no second attempt


def test_delivery_counts_what_the_collector_received(env) -> None:
    with HttpReceiver() as receiver:
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        telemetry = telemetry_with_pending_data()
        # A budget a shutdown right after the start can keep (an export process is still starting then).
        assert telemetry.shutdown(timeout_s=10)
        received = len(receiver.collected.spans())
        points = sum(
            len(getattr(m, m.WhichOneof("data")).data_points) for _, m in receiver.collected.metrics()
        )
    assert received > 0
    assert telemetry.delivery("spans") == (received, {})
    assert telemetry.delivery("metric_points") == (points, {})


def test_delivery_accounts_for_every_span_with_no_collector(env) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    telemetry = telemetry_with_pending_data()
    telemetry.shutdown()
    ended = telemetry.drops.spans_ended  # in export mode process, as the export process last said
    delivered, lost = telemetry.delivery("spans")
    assert ended > 0 and delivered == 0
    assert sum(lost.values()) == ended, lost  # each one lost, under a reason
    # Export mode process: the requests whose spans were still in the export process when the shutdown's
    # time ran out are counted as such too, and no other way.
    assert set(telemetry.delivery("requests")[1]) <= {"unsent_at_shutdown"}


@pytest.mark.parametrize(
    ("receiver_type", "protocol"), [(GrpcReceiver, "grpc"), (HttpReceiver, "http/protobuf")]
)
def test_shutdown_returns_when_the_collector_never_answers(env, caplog, receiver_type, protocol: str) -> None:
    with receiver_type(mode=Mode.BLACK_HOLE) as receiver:
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        # Seconds the SDK exporters would wait for an answer: a shutdown that waited for them would hang.
        env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "120")
        telemetry = telemetry_with_pending_data()
        with caplog.at_level(logging.WARNING, logger="otel_llm"):
            thread, result = shutdown_in_thread(telemetry)
        assert not thread.is_alive(), "shutdown() did not return"
        assert result == [False]  # nothing was acknowledged in time, and the handle says so
        assert receiver.collected.received() == []
    gave_up = [
        r for r in caplog.records if r.name.startswith("otel_llm") and "did not finish" in r.getMessage()
    ]
    assert len(gave_up) == 1


def test_the_give_up_line_names_the_budget_the_user_set(env, caplog, capfd) -> None:
    """Nothing listens at the start (a command's check said so) nor at shutdown: the shutdown gives up
    at once, and says so against the 5 s the user set, not against a slice of it."""
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    telemetry = configure(set_global=False, shutdown_timeout_s=5.0)
    tracker = RequestTracker(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
    )
    drive_scenario(tracker, time.monotonic() - 5.0)
    telemetry.endpoint_unreachable()
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        thread, result = shutdown_in_thread(telemetry)
    assert not thread.is_alive() and len(result) == 1
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("otel_llm")]
    said = "\n".join(ours) + capfd.readouterr().err  # the export process writes to this stderr
    gave_up = [line for line in said.splitlines() if "shutdown" in line and "otel_llm" in line]
    # SDK 1.35's HTTP exporter fails a refused connection at once, so its shutdown can end in time.
    if result == [False]:
        assert len(gave_up) == 1 and "5 s" in gave_up[0], said  # one line, in the user's terms
    assert not re.search(r"within 0\.\d+ s", said), said


def test_sdk_disabled_gives_working_no_op_providers_and_no_files(env, tmp_path: Path) -> None:
    env.setenv("OTEL_SDK_DISABLED", "true")
    telemetry = configure(set_global=False)
    span = telemetry.tracer_provider.get_tracer("t").start_span("s")
    assert not span.is_recording()
    tracker = RequestTracker(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
    )
    drive_scenario(tracker, time.monotonic() - 5.0)  # hooks work against no-op providers
    assert telemetry.force_flush() and telemetry.shutdown()
    assert telemetry.output_dir is None
    assert list(tmp_path.iterdir()) == []


def test_output_dir_argument_beats_env(env, tmp_path: Path) -> None:
    env.setenv("OTEL_LLM_OUTPUT_DIR", str(tmp_path / "from-env"))
    telemetry = configure(set_global=False, output_dir=tmp_path / "from-arg")
    tracer = telemetry.tracer_provider.get_tracer("t")
    tracer.start_span("s").end()
    assert telemetry.shutdown()
    assert telemetry.output_dir == tmp_path / "from-arg"
    assert (tmp_path / "from-arg" / "traces.jsonl").stat().st_size > 0
    assert not (tmp_path / "from-env").exists()
    assert not (tmp_path / "otel-llm-output").exists()


def test_files_are_not_created_until_something_is_exported(env, tmp_path: Path) -> None:
    telemetry = configure(set_global=False)
    assert telemetry.output_dir == tmp_path / "otel-llm-output"
    assert not (tmp_path / "otel-llm-output").exists()
    assert telemetry.shutdown()


def test_service_name_argument_is_the_fallback_for_the_environment(env) -> None:
    named_in_code = configure(set_global=False, service_name="from-code")
    env.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-env,team=inference")
    named_in_env = configure(set_global=False, service_name="from-code", resource_attributes={"team": "code"})
    assert named_in_code.tracer_provider.resource.attributes["service.name"] == "from-code"
    assert named_in_env.tracer_provider.resource.attributes["service.name"] == "from-env"
    assert named_in_env.tracer_provider.resource.attributes["team"] == "inference"
    assert named_in_code.shutdown() and named_in_env.shutdown()


def run_child(code: str, env_vars: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (fresh OpenTelemetry globals); OTEL_* only from ``env_vars``."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    child_env.update(env_vars)
    child_env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), *sys.path])
    return subprocess.run(
        [sys.executable, "-c", code], env=child_env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_second_configure_returns_the_global_handle_and_says_so(tmp_path: Path) -> None:
    code = """
import json, logging
from opentelemetry import metrics, trace
import otel_llm
records = []

class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())

logging.getLogger().setLevel(logging.INFO)
logging.getLogger().addHandler(Keep())
first = otel_llm.configure()
second = otel_llm.configure(output_dir="elsewhere")
print(json.dumps({
    "same": first is second,
    "global_tracer": trace.get_tracer_provider() is first.tracer_provider,
    "global_meter": metrics.get_meter_provider() is first.meter_provider,
    "logged": [m for m in records if "already" in m],
}))
first.shutdown()
"""
    done = run_child(code, {}, tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["same"] and result["global_tracer"] and result["global_meter"]
    assert len(result["logged"]) == 1


def test_process_exit_flushes_the_file_default(tmp_path: Path) -> None:
    code = """
import otel_llm
telemetry = otel_llm.configure(set_global=False)
telemetry.tracer_provider.get_tracer("exit-test").start_span("written-at-exit").end()
# no shutdown(): the handle's exit hook must flush
"""
    done = run_child(code, {"OTEL_BSP_SCHEDULE_DELAY": "600000"}, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "otel-llm-output" / "traces.jsonl").read_text().splitlines()
    names = [
        span["name"]
        for line in lines
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]
    assert names == ["written-at-exit"]


def test_process_exit_is_not_held_by_an_unanswering_collector(tmp_path: Path) -> None:
    code = """
import otel_llm
telemetry = otel_llm.configure(set_global=False, shutdown_timeout_s=1)
telemetry.tracer_provider.get_tracer("exit-test").start_span("lost").end()
"""
    with GrpcReceiver(mode=Mode.BLACK_HOLE) as receiver:
        env_vars = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        done = run_child(code, env_vars, tmp_path)  # subprocess timeout: a hang fails the test
    assert done.returncode == 0, done.stderr
