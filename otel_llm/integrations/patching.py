"""What the engine integrations share: wrapping a library's classes in place, and keeping telemetry
trouble away from the library.

An integration replaces a few methods on the library's classes (``Patch``), remembers exactly what it
replaced so ``uninstrument()`` puts the very same objects back, runs each of its own steps through
``guarded`` (an exception is logged once and swallowed: the engine's call always proceeds), and says
each problem once (``warn_once``), however many requests hit it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

_warned: set[str] = set()  # messages already logged once in this process


def warn_once(log: logging.Logger, message: str, *args: Any, exc_info: bool = False) -> None:
    """Log ``message`` at WARNING on ``log`` the first time it is seen in this process."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message, *args, exc_info=exc_info)


def guarded(log: logging.Logger, library: str, what: str, call: Callable[..., None], *args: Any) -> None:
    """Run one integration step; an exception is logged once and never reaches ``library``."""
    try:
        call(*args)
    except Exception:
        message = f"otel_llm: {library} integration failed in %s; {library} is unaffected"
        warn_once(log, message, what, exc_info=True)


class Patch:
    """The attributes one active instrumentation replaced, with what each class itself defined before
    (None: the attribute was inherited, or absent, and is deleted again on restore)."""

    def __init__(self) -> None:
        self.originals: dict[tuple[type, str], Any] = {}

    def replace(self, cls: type, name: str, value: Any) -> None:
        self.originals[(cls, name)] = cls.__dict__.get(name)
        setattr(cls, name, value)

    def restore(self) -> None:
        for (cls, name), original in self.originals.items():
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        self.originals.clear()
