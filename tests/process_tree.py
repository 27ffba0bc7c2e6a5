"""Processes below a process, read from ``/proc`` (Linux): which export processes an engine started."""

from __future__ import annotations

from pathlib import Path

EXPORT_PROCESS = b"otel_llm.export.process"  # in the command line of ``python -m otel_llm.export.process``


def _parents() -> dict[int, int]:
    """Every live process's parent pid, by pid."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # The command name in parentheses may hold spaces: the fields after its ")" are plain.
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # ended while being read
    return parents


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, at any depth."""
    parents = _parents()
    found = []
    for child in parents:
        up = child
        while up in parents and up > 1:
            up = parents[up]
            if up == pid:
                found.append(child)
                break
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone: it has ended, only unreaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def export_processes_below(pid: int) -> list[int]:
    """otel-llm's export processes among ``pid``'s descendants, at any depth."""
    parents = _parents()

    def below(child: int) -> bool:
        while child in parents and child > 1:
            child = parents[child]
            if child == pid:
                return True
        return False

    found = []
    for child in parents:
        try:
            if EXPORT_PROCESS in Path(f"/proc/{child}/cmdline").read_bytes() and below(child):
                found.append(child)
        except OSError:
            continue
    return found
