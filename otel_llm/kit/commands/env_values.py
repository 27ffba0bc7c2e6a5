"""How ``env_check`` parses an environment value: the rule of one variable, and the parsers it uses.

A parser takes the raw value and raises ``Unusable`` with a short why (``is not a number``) when its
reader could not use it; ``Rule.problem`` turns that into the one line the user sees,
``NAME='value' why: what would work``. Where the OpenTelemetry SDK or its OTLP exporters have a parser
that refuses a value, or a list of the values they know, the parser here calls it (``compression``,
``headers``, ``span_limit``, ``exemplar_filter``, ``sampler``); the others check what the SDK reads
with a logged warning and a fallback, or not at all (an endpoint's URL).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

SDK = "sdk"  # read by the OpenTelemetry SDK's providers and exporters, when the SDK is on
API = "api"  # read by the OpenTelemetry API when it is imported, whatever the SDK does
OTEL_LLM = "otel_llm"  # read by otel_llm itself


class Unusable(ValueError):
    """A value its reader cannot use: ``why`` (``is not a number``) and, when the rule's hint is not
    enough, a ``hint`` of its own (the value with its scheme added)."""

    def __init__(self, why: str, hint: str | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.hint = hint


Parse = Callable[[str], None]  # raises Unusable for a value that cannot be used


@dataclass(frozen=True, slots=True)
class Rule:
    names: tuple[str, ...]  # the variables read this way
    parse: Parse
    hint: str  # what would work, in a user's words
    reader: str = SDK
    empty_ok: bool = True  # whether the reader takes an empty value as unset

    def problem(self, name: str, raw: str) -> str | None:
        """The one-line complaint about ``name=raw``, or None when the reader can use it."""
        if not raw.strip():
            return None if self.empty_ok else f"{name} is set but empty: {self.hint}, or unset it"
        try:
            self.parse(raw)
        except Unusable as exc:
            return f"{name}={raw!r} {exc.why}: {exc.hint or self.hint}"
        return None


# --- how values are parsed -------------------------------------------------------------------------------


def _trimmed_lower(raw: str) -> str:
    return raw.strip().lower()


def _either(values: Sequence[str]) -> str:
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def choice(*allowed: str, fold: Callable[[str], str] = _trimmed_lower) -> Parse:
    """One of ``allowed`` once ``fold`` (how the reader normalises it) is applied."""

    def parse(raw: str) -> None:
        if fold(raw) not in allowed:
            raise Unusable(f"is not {_either(allowed)}")

    return parse


def boolean(fold: Callable[[str], str] = _trimmed_lower) -> Parse:
    return choice("true", "false", fold=fold)


def number(
    low: float, *, above: bool = False, high: float | None = None, whole: bool = False, infinite: bool = False
) -> Parse:
    """A number >= ``low`` (> with ``above``), <= ``high``; ``whole``: an int as ``int()`` reads it;
    ``infinite``: ``inf`` allowed (the reader takes it as never). NaN never is."""

    def parse(raw: str) -> None:
        try:
            value = float(int(raw)) if whole else float(raw)
        except ValueError:
            raise Unusable("is not a whole number" if whole else "is not a number") from None
        if math.isnan(value) or (math.isinf(value) and not infinite):
            raise Unusable("is not a finite number")
        if value < low or (above and value == low) or (high is not None and value > high):
            raise Unusable("is out of range")

    return parse


def endpoint(raw: str) -> None:
    """An OTLP endpoint URL: http:// or https://, a host, a port from 1 to 65535 if any."""
    if raw != raw.strip():
        raise Unusable("has spaces around it", "remove them (the exporter sends to the URL as written)")
    if "://" not in raw:
        raise Unusable("has no scheme", f"add http:// (or https:// for TLS): 'http://{raw}'")
    parts = urlsplit(raw)
    if parts.scheme.lower() not in ("http", "https"):
        raise Unusable(f"has the scheme {parts.scheme}://", "use http:// (plaintext) or https:// (TLS)")
    if not parts.hostname:
        raise Unusable("has no host", "name the collector's host, e.g. http://localhost:4318")
    try:
        port = parts.port  # None when the URL names none (the scheme's default)
    except ValueError:  # not a number, or past 65535
        port = 0
    if port == 0:
        raise Unusable(
            "has a port that is not 1 to 65535", "pass the collector's port, e.g. http://localhost:4318"
        )


def generic_endpoint(raw: str) -> None:
    """``endpoint``, and not a signal's URL: the OTLP/HTTP exporter appends ``/v1/<signal>`` itself."""
    from otel_llm.export import otlp

    endpoint(raw)
    mistake = otlp.signal_path_mistake(raw)
    if mistake is not None:
        why, _, hint = mistake.partition(": ")
        raise Unusable(why, hint)


def headers(raw: str) -> None:
    """``name=value`` pairs separated by commas, as the OTLP exporters' parser
    (``opentelemetry.util.re.parse_env_headers``, liberal) takes them: it skips, with a warning, a pair it
    cannot read; here that pair is refused."""
    from opentelemetry.util.re import _DELIMITER_PATTERN, _LIBERAL_HEADER_PATTERN

    for item in _DELIMITER_PATTERN.split(raw):
        if item and not _LIBERAL_HEADER_PATTERN.fullmatch(item.strip()):
            raise Unusable(f"has {item.strip()!r}, not a name=value header")


def key_values(raw: str) -> None:
    """``key=value`` pairs separated by commas, each key non-empty."""
    for item in raw.split(","):
        key, equals, _ = item.partition("=")
        if not equals or not key.strip():
            raise Unusable(f"has {item.strip()!r}, not a key=value pair")


def readable_file(raw: str) -> None:
    path = os.path.expanduser(raw)
    if not os.path.isfile(path):
        raise Unusable("is not a file" if os.path.exists(path) else "does not exist")
    if not os.access(path, os.R_OK):
        raise Unusable("cannot be read")


def entry_points(group: str, *also: str, many: bool = False) -> Parse:
    """The name of an installed entry point of ``group`` (or one of ``also``); ``many``: a comma list."""

    def parse(raw: str) -> None:
        from importlib.metadata import entry_points as installed

        known = set(installed(group=group).names) | set(also)
        names = [n.strip() for n in raw.split(",")] if many else [raw.strip()]
        for name in names:
            if name and name not in known:
                listed = ", ".join(sorted(known)) or "none installed"
                raise Unusable(f"names {name!r}, which is not installed", f"use one of: {listed}")

    return parse


def grpc_status_codes(raw: str) -> None:
    """gRPC status code names separated by commas (``UNAVAILABLE,DEADLINE_EXCEEDED``)."""
    from grpc import StatusCode

    for name in raw.split(","):
        if name.strip() and name.strip().upper() not in StatusCode.__members__:
            raise Unusable(f"names {name.strip()!r}, not a gRPC status code")


def compression(name: str, signals: Sequence[str]) -> Parse:
    """What the signals' exporters take, by their own parsers: the gRPC exporter's
    ``environ_to_compression`` (gzip only: it raises on none and deflate) and the HTTP exporter's
    ``Compression`` (gzip, deflate or none). ``name``: the variable the gRPC exporter reads."""

    def parse(raw: str) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.exporter import (
            InvalidCompressionValueException,
            environ_to_compression,
        )
        from opentelemetry.exporter.otlp.proto.http import Compression

        from otel_llm.export import otlp

        grpc = [s for s in signals if otlp.protocol(s) == otlp.PROTOCOL_GRPC]  # type: ignore[arg-type]
        if grpc:
            try:
                environ_to_compression(name)
            except InvalidCompressionValueException:
                raise Unusable(
                    f"is not gzip, the only compression the gRPC exporter ({', '.join(grpc)}) takes",
                    "set gzip, or unset it for none",
                ) from None
        try:
            Compression(raw.strip().lower())
        except ValueError:
            raise Unusable("is not gzip, deflate or none") from None

    return parse


def span_limit(name: str) -> Parse:
    """A span limit as the SDK's ``SpanLimits`` reads ``name``: a whole number from 0, or ``unset``."""

    def parse(raw: str) -> None:
        from opentelemetry.sdk.trace import SpanLimits

        try:
            SpanLimits._from_env_if_absent(None, name)
        except ValueError:
            raise Unusable("is not a whole number from 0") from None

    return parse


def exemplar_filter(raw: str) -> None:
    """One of the exemplar filters the SDK's meter provider knows (it compares the value as is)."""
    from opentelemetry.sdk.metrics._internal import _get_exemplar_filter

    try:
        _get_exemplar_filter(raw)
    except ValueError:
        raise Unusable("is not trace_based, always_on or always_off") from None


def sampler(raw: str) -> None:
    """One of the samplers the SDK's tracer provider knows by name (it lower-cases, and does not trim)."""
    from opentelemetry.sdk.trace.sampling import _KNOWN_SAMPLERS

    choice(*_KNOWN_SAMPLERS, fold=str.lower)(raw)


def batch_size(raw: str) -> None:
    number(1, whole=True)(raw)
    queue = os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE", "").strip() or "2048"
    if queue.isdigit() and int(raw) > int(queue):
        raise Unusable(f"is more than the queue holds (OTEL_BSP_MAX_QUEUE_SIZE: {queue})")
