"""The hand-written end of a generated report, kept when the report is written again.

A full run of ``python -m benchmarks`` writes BENCHMARKS.md whole. Some figures are read off its tables
by hand for the docs (per step, per request), and the docs link to them. They sit below ``MARKER`` at
the file's end; writing the report again keeps everything from the marker on, so regenerating never
drops them silently. Their figures still have to be redone by hand from the new tables.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["MARKER", "hand_written_tail", "with_hand_written_tail"]

MARKER = "<!-- Hand-written from here to the end: python -m benchmarks keeps it. -->"


def hand_written_tail(text: str) -> str:
    """The part of a report's text from the marker line to the end, or "" when it has no marker."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.strip() == MARKER:
            return "".join(lines[i:])
    return ""


def with_hand_written_tail(generated: str, previous: Path) -> str:
    """The generated report followed by the hand-written tail of the file it replaces, if any."""
    try:
        tail = hand_written_tail(previous.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return generated
    if not tail:
        return generated
    return generated.rstrip("\n") + "\n\n" + tail
