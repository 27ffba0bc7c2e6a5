"""CPU clocks in nanoseconds, for one thread, one process, another process and every thread by name.

All readings are CPU time (user + system) that the kernel accounts to the thread or process, in
nanoseconds, from clocks with nanosecond resolution: ``CLOCK_THREAD_CPUTIME_ID`` and
``CLOCK_PROCESS_CPUTIME_ID`` for this thread and process, the process CPU clock of another process
(Linux's ``clock_getcpuclockid``), and each task's ``sum_exec_runtime`` from
``/proc/self/task/<tid>/schedstat``. The tick-based ``utime``/``stime`` of ``/proc/.../stat`` count in
10 ms steps, too coarse for a round of about a second. Linux only.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

# Linux encodes the CPU clock of process ``pid`` as ((~pid) << 3) | CPUCLOCK_SCHED, which is what glibc's
# clock_getcpuclockid() returns; Python exposes clock_gettime_ns() but not clock_getcpuclockid().
_CPUCLOCK_SCHED = 2


def thread_ns() -> int:
    """CPU nanoseconds of the calling thread (``CLOCK_THREAD_CPUTIME_ID``)."""
    return time.thread_time_ns()


def process_ns() -> int:
    """CPU nanoseconds of this whole process, every thread, those that ended included."""
    return time.process_time_ns()


def other_process_ns(pid: int) -> int:
    """CPU nanoseconds of process ``pid`` (all its threads, ended ones included); 0 once it is gone."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | _CPUCLOCK_SCHED)
    except OSError:
        return 0


def threads_ns() -> dict[int, tuple[str, int]]:
    """Each live thread of this process: native thread id -> (name, CPU nanoseconds so far).

    Python threads carry their ``threading`` name (the SDK's ``OtelBatchSpanRecordProcessor``, vLLM's
    output-socket thread); threads Python did not start (ZeroMQ's I/O threads, gRPC's core threads,
    torch's pool) carry the kernel's ``comm`` name. A thread that ended is not listed: its CPU is still
    in ``process_ns()``.
    """
    python_names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    found: dict[int, tuple[str, int]] = {}
    for task in Path("/proc/self/task").iterdir():
        tid = int(task.name)
        try:
            runtime_ns = int((task / "schedstat").read_text().split()[0])
            name = python_names.get(tid) or (task / "comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            continue  # ended while we read it
        found[tid] = (name, runtime_ns)
    return found


def thread_deltas(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> dict[str, int]:
    """CPU nanoseconds each thread name spent between two ``threads_ns()`` readings, summed over the
    threads of one name; a thread born in between counts from zero."""
    spent: dict[str, int] = {}
    for tid, (name, runtime_ns) in after.items():
        start = before.get(tid, (name, 0))[1]
        spent[name] = spent.get(name, 0) + runtime_ns - start
    return spent


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children, their children, ...), from ``/proc/<pid>/stat``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (2nd field) may hold spaces and parentheses: fields resume after the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
