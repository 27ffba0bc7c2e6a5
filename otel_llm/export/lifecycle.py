"""The export process's life, seen from the engine: started, restarted after a back-off, stopped by a
deadline.

One ``ExportProcess`` holds at most one child at a time: a new interpreter, ``sys.executable -m
otel_llm.export.process READ_FD WRITE_FD`` (never a fork of the engine), with the environment the
engine's ``configure()`` saw, and two pipes: messages to it (blocking writes) and its answers (read
without blocking, through a ``FrameReader``).

- When it dies it is started again after a back-off: 0.5 s, doubling to 30 s; once one has lived a
  minute the next restart is quick again. One warning says the first death.
- ``stop`` waits for its last answer until ``STOP_GRACE_S`` seconds past the caller's deadline, then
  kills it.

All times are ``time.monotonic()`` seconds. Only the channel's sender thread calls these methods.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from otel_llm.export.frames import FrameReader, readable, write_frame

__all__ = ["RESTART_FIRST_S", "RESTART_MAX_S", "STOP_GRACE_S", "ExportProcess", "stop_budget"]

_log = logging.getLogger("otel_llm")

RESTART_FIRST_S = 0.5  # back-off before the first restart
RESTART_MAX_S = 30.0  # the back-off doubles up to this
SETTLED_S = 60.0  # an export process that lived this long resets the back-off
# How long past the shutdown's deadline the export process may take to stop its exporters and say what it
# delivered (its own shutdown's grace is 1 s), before it is killed. The caller is not held that long:
# Telemetry.shutdown returns within its own grace, and this wait goes on in the sender thread.
STOP_GRACE_S = 3.0


def stop_budget(left_s: float) -> float:
    """The seconds the export process's own shutdown is given when ``left_s`` remain of the caller's:
    half, or all but a second, whichever is more. Its shutdown takes its budget and up to a second's grace
    to stop its exporters, so its answer still comes in time."""
    left_s = max(0.0, left_s)
    return max(left_s - 1.0, left_s / 2)


class ExportProcess:
    """The current export process (``child``, None while there is none) and when the next may start."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = dict(environ)
        self.child: subprocess.Popen[bytes] | None = None
        self._to_child = -1  # its stdin, in effect: our messages
        self.answers_fd = -1  # its answers to us (non-blocking), -1 while there is no child
        self.reader: FrameReader | None = None
        self._started_at = 0.0
        self._restart_at = 0.0
        self._backoff = RESTART_FIRST_S
        self._warned = False

    @property
    def backing_off(self) -> bool:
        """A restart is held until the back-off after the last death has passed."""
        return self._restart_at > time.monotonic()

    def start(self) -> str | None:
        """Start a child; None when it started, else why it could not (the caller counts that as a
        death: ``ended``)."""
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "otel_llm.export.process", str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w),
                env=self._environ,
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError as exc:
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                os.close(fd)
            return f"it could not be started: {exc}"
        os.close(to_child_r)
        os.close(from_child_w)
        flags = fcntl.fcntl(from_child_r, fcntl.F_GETFL)
        fcntl.fcntl(from_child_r, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self.child, self._to_child, self.answers_fd = child, to_child_w, from_child_r
        self.reader = FrameReader(from_child_r)
        self._started_at = time.monotonic()
        return None

    def write(self, message: bytes) -> None:
        """One framed message to the child, whole (may block on a full pipe); OSError when it is gone."""
        write_frame(self._to_child, message)

    def exited(self) -> str | None:
        """How the child ended, when it has (None while it runs or there is none). A child that has run a
        minute resets the back-off here."""
        child = self.child
        if child is None:
            return None
        if child.poll() is not None:
            return _exit_words(child.returncode)
        if time.monotonic() - self._started_at > SETTLED_S:
            self._backoff = RESTART_FIRST_S
        return None

    def ended(self, why: str, lost: int) -> None:
        """The child is gone or broke its pipe (``why``): reap or kill it, close its pipes, hold the next
        start for the back-off, and warn the first time, naming the ``lost`` records."""
        child, self.child = self.child, None
        if child is not None:  # how it ended says more than the broken pipe that showed it
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(0.2)
            if child.returncode is not None:
                why = _exit_words(child.returncode)
        self._close_pipes()
        if child is not None and child.poll() is None:
            with contextlib.suppress(OSError):
                child.kill()
        self._restart_at = time.monotonic() + self._backoff
        if not self._warned:
            self._warned = True
            _log.warning(
                "otel_llm: the export process stopped (%s); %d finished requests' telemetry in flight was "
                "lost (counted in otel_llm.export.records.dropped); starting it again in %.1f s",
                why,
                lost,
                self._backoff,
            )
        self._backoff = min(self._backoff * 2, RESTART_MAX_S)

    def stop(
        self, child: subprocess.Popen[bytes], deadline: float, take_answers: Callable[[], bool | None]
    ) -> bool:
        """After the ``stop`` message: wait for the child's last answer until ``STOP_GRACE_S`` past
        ``deadline``, then kill it; reap it and close its pipes. ``take_answers`` reads what it said and
        returns what its ``stopped`` answer said (None: none yet). True when it answered by ``deadline``
        that it exported everything."""
        until = deadline + STOP_GRACE_S
        stopped: bool | None = None
        while stopped is None and self.child is not None:
            left = until - time.monotonic()
            if left <= 0:
                break
            if readable([self.answers_fd], min(left, 0.1)):
                stopped = take_answers()
            elif child.poll() is not None:
                stopped = take_answers()
                break
        in_time = stopped is not None and time.monotonic() <= deadline
        if stopped is None:
            child.kill()
        child.wait()
        self._close_pipes()
        self.child = None
        return bool(stopped) and in_time

    def close_after_fork(self) -> None:
        """In a forked engine: the parent's pipes are not this process's; close its copies."""
        self._close_pipes()
        self.child = None

    def _close_pipes(self) -> None:
        for fd in (self._to_child, self.answers_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._to_child = self.answers_fd = -1
        self.reader = None


def _exit_words(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        return f"killed by signal {-code}"
    return f"it exited with status {code}"
