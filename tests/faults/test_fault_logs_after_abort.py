"""What otel_llm hides after giving up on a pipeline, and what it still lets through.

Once a shutdown gave up on its exporters (the collector never answered), the lines those exporters log
about being stopped repeat a loss the handle already reported, and are dropped. A pipeline made later in
the same process (a test suite, a server that reconfigures) has its own threads: its export failures,
worded the same, must still be logged. This is about pipelines sharing one process's loggers, so it runs
in export mode ``in_process``: in mode ``process`` each pipeline's exporters log in an export process of
their own.
"""

from __future__ import annotations

import logging

from fault_tools import build, dropped_spans, on_thread, serve, wait_for
from otlp_receivers import HttpReceiver, Mode

EXPORTERS = "opentelemetry.exporter.otlp"  # where the SDK's OTLP exporters log


def use(env, receiver: HttpReceiver) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")


def test_a_later_pipeline_still_logs_its_export_failures(env, started, caplog) -> None:
    env.setenv("OTEL_LLM_EXPORT_MODE", "in_process")
    caplog.set_level(logging.DEBUG)

    # A collector that takes the last batch and never answers: shutdown gives up on the exporters.
    silent = HttpReceiver(mode=Mode.BLACK_HOLE)
    silent.start()
    started.append(silent)
    use(env, silent)
    first, tracker, _ = build(started)
    on_thread(lambda: serve(tracker, range(4)))
    gave_up = []
    on_thread(lambda: gave_up.append(first.shutdown(timeout_s=0.2)))
    assert gave_up == [False], "the shutdown should have given up on a collector that never answers"
    silent.stop()  # the stopped pipeline's last export returns; its lines come before the mark below

    mark = len(caplog.records)
    refusing = HttpReceiver(mode=Mode.REFUSE)
    refusing.start()
    started.append(refusing)
    use(env, refusing)
    second, tracker, produced = build(started)
    on_thread(lambda: serve(tracker, range(4)))
    assert wait_for(lambda: dropped_spans(second) == produced.count > 0)

    # The exporter's last word on a batch it gives up on is an error; its wording differs between SDK
    # releases (1.45: "... due to timeout, max retries or shutdown", one of the lines hidden after an
    # abort; 1.35: "... code: 503"), so the level and the logger are what is checked.
    later = [r for r in caplog.records[mark:] if r.name.startswith(EXPORTERS)]
    assert any(r.levelno >= logging.ERROR for r in later), [(r.levelname, r.msg) for r in later]
