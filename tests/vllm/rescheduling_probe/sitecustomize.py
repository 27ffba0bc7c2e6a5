"""Test-only probe, loaded by every Python process of a ``vllm serve`` whose PYTHONPATH holds this folder:
in the process that runs vLLM's scheduler (the engine core), it writes down each rescheduling of a
preempted request as vLLM's own ``Request`` holds it right after ``Scheduler.schedule()``, one JSON line
per rescheduling in the file ``RESCHEDULING_PROBE_OUT`` names (with the writer's pid):

- ``cached``: ``num_computed_tokens`` less the tokens the step scheduled for it (what the prefix cache gave);
- ``to_compute``: ``num_tokens`` less that (what the engine must compute again);
- ``ts``: the timestamp of the request's SCHEDULED event, as vLLM sends it to the frontend;
- ``client``: the request's ``client_index``, the API server it came through.

It also writes down each step (``"kind": "step"``): its ``num_scheduled_tokens`` as ``schedule()``
returned it, the client index of each of its requests, and the requests whose tokens vLLM's ``Request``
says are a recompute (re-admitted after a preemption, from that ``schedule()`` until its
``num_computed_tokens`` reaches ``num_tokens`` or it is preempted again).

With each step go when its scheduling began (``at``) and, as ``"kind": "outputs"``, the timestamp of the
``EngineCoreOutputs`` its ``update_from_output`` made (None when it made none): its start and its end.

And vLLM's own prefix-cache counts of preempted requests' lookups (``"kind": "prefix_cache"``: the
``preempted_queries`` / ``preempted_hits`` of each ``PrefixCacheStats`` the engine core's KV-cache manager
hands its scheduler's stats; vLLM 0.32 exports them nowhere itself).

In the processes that serve requests (the frontends) it writes down every call of the tracker's
``batch()`` (``"kind": "batch"``): the mapping and the recompute argument it got, which tracker, and which
of the step's requests that tracker had in flight.

It reads vLLM's objects independently of otel_llm and never imports otel_llm (the frontend's tracker
class is patched when otel_llm itself imports it), so the test compares what otel_llm carried from the
engine core to the frontend with vLLM's own state.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

_TARGET = "vllm.v1.core.sched.scheduler"
_TRACKER = "otel_llm.hooks.tracker"
_KV_CACHE = "vllm.v1.core.kv_cache_manager"
_OUT = os.environ.get("RESCHEDULING_PROBE_OUT")


def _write(lines: list[str]) -> None:
    if lines:
        with open(_OUT, "a") as out:
            out.write("\n".join(lines) + "\n")


def _patch(module) -> None:
    original = module.Scheduler.schedule
    update = module.Scheduler.update_from_output

    recomputing: set[str] = set()  # re-admitted after a preemption, recompute not done

    def schedule(self, *args, **kwargs):
        at = time.monotonic()
        output = original(self, *args, **kwargs)
        resumed = set(getattr(output.scheduled_cached_reqs, "resumed_req_ids", ()) or ())
        resumed |= {n.req_id for n in output.scheduled_new_reqs if self.requests[n.req_id].num_preemptions}
        for rid in list(recomputing):
            request = self.requests.get(rid)
            if request is None or request.status.name == "PREEMPTED":
                recomputing.discard(rid)
        recomputing.update(resumed)
        scheduled = dict(output.num_scheduled_tokens)
        step = {
            "kind": "step",
            "pid": os.getpid(),
            "scheduled": scheduled,
            "clients": {rid: self.requests[rid].client_index for rid in scheduled},
            "recompute": sorted(rid for rid in scheduled if rid in recomputing),
            "at": at,  # when its scheduling began (otel_llm stamps its batch() a few µs before)
            "output": id(output),  # to pair it with its outputs (``outputs`` below)
        }
        for rid in list(recomputing):
            request = self.requests[rid]
            if request.num_computed_tokens >= request.num_tokens:  # this step ends the recompute
                recomputing.discard(rid)
        lines = [json.dumps(step)] if scheduled else []
        for rid in sorted(resumed):
            request = self.requests[rid]
            cached = request.num_computed_tokens - output.num_scheduled_tokens[rid]
            events = request.events or []
            lines.append(
                json.dumps(
                    {
                        "kind": "rescheduling",
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
        _write(lines)
        return output

    def update_from_output(self, scheduler_output, *args, **kwargs):
        outputs = update(self, scheduler_output, *args, **kwargs)
        stamps = [o.timestamp for o in outputs.values()] if outputs else []
        record = {
            "kind": "outputs",
            "pid": os.getpid(),
            "output": id(scheduler_output),
            "at": stamps[0] if stamps else None,  # the step's EngineCoreOutputs' timestamp: its end
        }
        _write([json.dumps(record)])
        return outputs

    module.Scheduler.schedule = schedule
    module.Scheduler.update_from_output = update_from_output


def _patch_tracker(module) -> None:
    original = module.Tracker.batch

    def batch(self, scheduled, ts=None, recompute=None):
        call = {
            "kind": "batch",
            "pid": os.getpid(),
            "tracker": id(self),
            "scheduled": dict(scheduled),
            "recompute": sorted(recompute or ()),
            # The step's requests this tracker has in flight (its private state, read by this test-only
            # probe: no public figure says which requests a tracker holds).
            "own": sorted(rid for rid in scheduled if rid in getattr(self, "_inflight", {})),
        }
        _write([json.dumps(call)])
        return original(self, scheduled, ts=ts, recompute=recompute)

    module.Tracker.batch = batch


def _patch_kv_cache(module) -> None:
    original = module.KVCacheManager.make_prefix_cache_stats

    def make_prefix_cache_stats(self):
        stats = original(self)
        queries, hits = getattr(stats, "preempted_queries", 0), getattr(stats, "preempted_hits", 0)
        if queries or hits:
            record = {"kind": "prefix_cache", "pid": os.getpid(), "queries": queries, "hits": hits}
            _write([json.dumps(record)])
        return stats

    module.KVCacheManager.make_prefix_cache_stats = make_prefix_cache_stats


_PATCHES = {_TARGET: _patch, _TRACKER: _patch_tracker, _KV_CACHE: _patch_kv_cache}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module) -> None:
            exec_module(module)
            _PATCHES[name](module)

        spec.loader.exec_module = exec_and_patch
        return spec


if _OUT:
    sys.meta_path.insert(0, _Finder())
