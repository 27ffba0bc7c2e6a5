"""Test-only probe, loaded by every Python process of a ``vllm serve`` whose PYTHONPATH holds this folder:
in the process that runs vLLM's scheduler (the engine core), it writes down each rescheduling of a
preempted request as vLLM's own ``Request`` holds it right after ``Scheduler.schedule()``, one JSON line
per rescheduling in the file ``RESCHEDULING_PROBE_OUT`` names (with the writer's pid):

- ``cached``: ``num_computed_tokens`` less the tokens the step scheduled for it (what the prefix cache gave);
- ``to_compute``: ``num_tokens`` less that (what the engine must compute again);
- ``ts``: the timestamp of the request's SCHEDULED event, as vLLM sends it to the frontend;
- ``client``: the request's ``client_index``, the API server it came through.

It reads vLLM's objects independently of otel_llm (which this probe never imports), so the test compares
otel_llm's figures, carried from the engine core to the frontend, with vLLM's own state.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys

_TARGET = "vllm.v1.core.sched.scheduler"
_OUT = os.environ.get("RESCHEDULING_PROBE_OUT")


def _patch(module) -> None:
    original = module.Scheduler.schedule

    def schedule(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        resumed = set(getattr(output.scheduled_cached_reqs, "resumed_req_ids", ()) or ())
        resumed |= {n.req_id for n in output.scheduled_new_reqs if self.requests[n.req_id].num_preemptions}
        lines = []
        for rid in sorted(resumed):
            request = self.requests[rid]
            cached = request.num_computed_tokens - output.num_scheduled_tokens[rid]
            events = request.events or []
            lines.append(
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "id": rid,
                        "ts": events[-1].timestamp if events else None,
                        "cached": cached,
                        "to_compute": request.num_tokens - cached,
                        "preemptions": request.num_preemptions,
                        "client": request.client_index,  # which API server's frontend has it
                    }
                )
            )
        if lines:
            with open(_OUT, "a") as out:
                out.write("\n".join(lines) + "\n")
        return output

    module.Scheduler.schedule = schedule


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if _OUT:
    sys.meta_path.insert(0, _Finder())
