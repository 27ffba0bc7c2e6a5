"""Saying a problem once: a warning per kind of trouble, however many requests meet it."""

from __future__ import annotations

import logging
import threading
from typing import Any

_log = logging.getLogger("otel_llm")
_lock = threading.Lock()
_warned: set[str] = set()  # keys already logged in this process


def warn_once(
    key: str, message: str, *args: Any, exc_info: bool = False, log: logging.Logger | None = None
) -> bool:
    """Log ``message`` at WARNING (on ``log``, else ``otel_llm``) the first time ``key`` is seen in this
    process; True when it was logged now."""
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
    (log or _log).warning(message, *args, exc_info=exc_info)
    return True
