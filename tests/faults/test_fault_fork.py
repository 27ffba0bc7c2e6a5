"""``os.fork()`` after the tracker started, while another thread hammers the hooks (engines fork workers).

Runs in a fresh interpreter (forking the test runner itself would copy its threads and state). The child
builds its own telemetry and tracker, as a forked worker should (the SDK empties the queue of the span
processor it inherited; in a trial run, a child that recorded through the inherited providers hung
intermittently), exports and exits 0 within a deadline; the parent carries on exporting.
Export threads are counted in both: each batch span processor and metric reader has exactly one worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from otlp_receivers import GrpcReceiver, HttpReceiver, attributes

from otel_llm import semconv as sc

CHILD_DEADLINE_S = 30  # the parent script kills a child still running after this: a hang fails the test

SCRIPT = r"""
import json, os, sys, threading, time, traceback
import otel_llm
from otel_llm import RequestTracker

EXPORT_THREADS = ("OtelBatchSpanRecordProcessor", "OtelPeriodicExportingMetricReader")


def export_threads():
    names = [t.name for t in threading.enumerate() if t.is_alive()]
    return {kind: names.count(kind) for kind in EXPORT_THREADS}


def serve(tracker, ids):
    for rid in ids:
        tracker.queued(rid, prompt_tokens=3)
        tracker.scheduled([rid])
        tracker.tokens([rid])
        tracker.finished(rid)


def build(name):
    telemetry = otel_llm.configure(set_global=False, service_name=name)
    tracker = RequestTracker(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider, model="fork"
    )
    return telemetry, tracker


telemetry, tracker = build("parent")
stop = threading.Event()
hammered = [0]


def hammer():
    # Busy enough that the fork lands mid-hook, paced so the parent's queue stays small enough to flush
    # promptly on a loaded machine (the promise under test is the fork, not throughput).
    while not stop.is_set():
        serve(tracker, [f"hammer-{hammered[0]}"])
        hammered[0] += 1
        time.sleep(0.001)


thread = threading.Thread(target=hammer, daemon=True)
thread.start()
while hammered[0] < 50:
    time.sleep(0.01)
before = export_threads()
pid = os.fork()
if pid == 0:
    try:
        child_telemetry, child_tracker = build("child")
        serve(child_tracker, [f"child-{i}" for i in range(20)])
        flushed = child_telemetry.force_flush(timeout_s=20)
        threads = export_threads()
        with open(sys.argv[1], "w") as out:
            json.dump({"flushed": flushed, "threads": threads}, out)
        child_telemetry.shutdown(timeout_s=5)
        os._exit(0)
    except BaseException:
        traceback.print_exc()
        os._exit(3)

deadline = time.monotonic() + float(sys.argv[2])
status = None
while time.monotonic() < deadline:
    done, raw = os.waitpid(pid, os.WNOHANG)
    if done:
        status = os.waitstatus_to_exitcode(raw)
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
stop.set()
thread.join(10)
serve(tracker, [f"parent-after-{i}" for i in range(20)])
print(json.dumps({
    "child_exit": status,
    "before": before,
    "after": export_threads(),
    "flushed": telemetry.force_flush(timeout_s=20),
    "hammered": hammered[0],
}))
telemetry.shutdown(timeout_s=5)
"""


@pytest.mark.parametrize(
    ("receiver_type", "protocol"),
    [pytest.param(GrpcReceiver, "grpc", id="grpc"), pytest.param(HttpReceiver, "http/protobuf", id="http")],
)
def test_fork_while_hooks_run_child_exports_parent_unaffected(
    tmp_path: Path, receiver_type, protocol
) -> None:
    child_out = tmp_path / "child.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "5",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",
        }
    )
    with receiver_type() as receiver:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(child_out), str(CHILD_DEADLINE_S)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=CHILD_DEADLINE_S + 60,
        )
        assert done.returncode == 0, done.stderr
        parent = json.loads(done.stdout.strip().splitlines()[-1])
        assert parent["child_exit"] == 0, done.stderr
        child = json.loads(child_out.read_text())
        assert child["flushed"], "the child's telemetry did not flush"
        assert parent["flushed"], "the parent's telemetry did not flush after the fork"

        # One worker per processor / reader: the parent's as before the fork; the child's own, plus the
        # one the SDK re-creates for the processor it inherited.
        one_each = {"OtelBatchSpanRecordProcessor": 1, "OtelPeriodicExportingMetricReader": 1}
        assert parent["before"] == one_each and parent["after"] == one_each
        assert child["threads"] == {kind: 2 for kind in one_each}

        def arrived() -> dict[str, str]:
            return {
                attributes(s.attributes)[sc.LLM_REQUEST_ID]: attributes(resource.attributes)["service.name"]
                for resource, s in receiver.collected.spans()
                if s.name == sc.SPAN_REQUEST
            }

        wanted = {f"child-{i}" for i in range(20)} | {f"parent-after-{i}" for i in range(20)}
        assert receiver.collected.wait_until(lambda _: wanted <= set(arrived())), sorted(
            wanted - set(arrived())
        )
        by_id = arrived()
        assert all(by_id[f"child-{i}"] == "child" for i in range(20))
        assert all(by_id[f"parent-after-{i}"] == "parent" for i in range(20))
        assert sum(rid.startswith("hammer-") for rid in by_id) >= min(parent["hammered"], 50)
