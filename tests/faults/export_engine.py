"""An engine process for the export-process fault tests: ``configure()`` from the environment (export mode
``process``), a burst of finished requests, then it waits to be signalled.

Run as ``python export_engine.py REQUESTS``. It prints one JSON line once every request has finished
(``{"engine_pid", "export_pids", "queued"}``: its export processes, and how many records still waited
in its queue then), another once they are all handed to the export process (``{"handed": n}``), and
exits on SIGTERM the way a server does (its handler raises SystemExit, so the telemetry's shutdown runs
at exit), printing a last line ``{"shutdown": bool}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import otel_llm
from otel_llm import RequestTracker


def export_processes(pid: int) -> list[int]:
    """The export processes of process ``pid`` (its children running ``otel_llm.export.process``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"otel_llm.export.process" in cmdline:
            found.append(int(entry.name))
    return found


def main() -> None:
    requests = int(sys.argv[1])
    telemetry = otel_llm.configure(set_global=False, service_name="export-engine")

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    tracker = RequestTracker(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider, model="burst"
    )
    for start in range(0, requests, 64):
        ids = [f"burst-{i}" for i in range(start, min(start + 64, requests))]
        for rid in ids:
            tracker.queued(rid, prompt_tokens=8)
        tracker.scheduled(ids)
        for _ in range(4):
            tracker.tokens(ids)
        for rid in ids:
            tracker.finished(rid)
    queued = len(telemetry.channel._queue)  # a diagnostic only: how much the shutdown has to send
    deadline = time.monotonic() + 10
    while not export_processes(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.01)
    ready = {"engine_pid": os.getpid(), "export_pids": export_processes(os.getpid()), "queued": queued}
    try:  # from here on a SIGTERM ends the wait below and the shutdown's line is printed
        print(json.dumps(ready), flush=True)
        # A diagnostic only: every record written whole into the export process's pipe (there it stays
        # for the export process to read, whatever happens to this process).
        while telemetry.channel._sent < requests:
            time.sleep(0.01)
        print(json.dumps({"handed": requests}), flush=True)
        while True:
            time.sleep(1)
    finally:
        print(json.dumps({"shutdown": telemetry.shutdown()}), flush=True)


if __name__ == "__main__":
    main()
