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


_ABSENT = object()  # the owner did not define the attribute itself (inherited, or not there at all)


class Patch:
    """The attributes one active instrumentation replaced, each with what its owner (a class, or a
    module) itself defined before, so ``restore()`` puts back the very same objects.

    An attribute the owner only inherited is deleted again on restore, so the owner's own namespace is
    exactly as it was. wrapt would do the replacing as well, but its unwrapping sets the original on the
    owner instead of deleting what was inherited, and its wrappers cost a call more on vLLM's per-step
    path; this class is tested to leave every patched attribute the original object."""

    def __init__(self) -> None:
        self.originals: dict[tuple[Any, str], Any] = {}
        self._wrappers: dict[tuple[Any, str], Any] = {}

    def replace(self, owner: Any, name: str, value: Any) -> None:
        """Set ``owner.name`` to ``value``, remembering what ``owner`` itself held under ``name``."""
        key = (owner, name)
        if key not in self.originals:
            self.originals[key] = vars(owner).get(name, _ABSENT)
        self._wrappers[key] = value
        setattr(owner, name, value)

    @property
    def points(self) -> list[str]:
        """The patched attributes as ``Owner.name``, in the order they were patched."""
        return [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name in self.originals]

    def restore(self) -> list[str]:
        """Put every original back; returns the points another library had wrapped again since (their
        wrapper is replaced too: it called ours, which is gone)."""
        rewrapped = []
        for (owner, name), original in self.originals.items():
            if vars(owner).get(name, _ABSENT) is not self._wrappers[(owner, name)]:
                rewrapped.append(f"{getattr(owner, '__name__', owner)}.{name}")
            if original is _ABSENT:
                if name in vars(owner):
                    delattr(owner, name)
            else:
                setattr(owner, name, original)
        self.originals.clear()
        self._wrappers.clear()
        return rewrapped
