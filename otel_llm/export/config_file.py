"""Providers from OpenTelemetry's declarative configuration file (``OTEL_CONFIG_FILE``), where the SDK's
``opentelemetry-configuration`` package is installed: the file then decides exporters, processors,
readers, samplers and views, as it does for ``opentelemetry-instrument``."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import SERVICE_NAME, Resource

from otel_llm.export.telemetry import Telemetry

ENV_CONFIG_FILE = "OTEL_CONFIG_FILE"  # OpenTelemetry's declarative configuration (YAML)

_logger = logging.getLogger(__name__)


def declarative_config_file() -> str | None:
    """The ``OTEL_CONFIG_FILE`` path that ``configure()`` builds from, or None (unset, or not readable by
    this OpenTelemetry install: then the ``OTEL_*`` variables are used)."""
    path = os.environ.get(ENV_CONFIG_FILE, "").strip()
    return path if path and declarative_support() else None


def declarative_support() -> bool:
    """Whether the SDK's declarative configuration package is installed (and imports)."""
    try:
        import opentelemetry.configuration.file  # noqa: F401
    except ImportError:
        return False
    return True


def from_config_file(
    path: str,
    service_name: str | None,
    resource_attributes: Mapping[str, Any] | None,
    timeout_s: float,
    views: Sequence[View],
) -> Telemetry:
    """Providers built from the declarative configuration file at ``path``, as opentelemetry-instrument
    builds them: the file decides exporters, processors, readers, samplers and views, and the ``OTEL_*``
    exporter variables are not read. Its pipeline is the SDK's own, so ``Telemetry.drops`` and
    ``delivery()`` count nothing; ``shutdown()`` is still bounded.

    ``service_name`` and ``resource_attributes`` are the fallback under the file's resource.
    Raises ValueError naming the variable when the file cannot be read or used.
    """
    from opentelemetry.configuration.file import (
        ConfigurationError,
        create_meter_provider,
        create_resource,
        create_tracer_provider,
        load_config_file,
    )

    try:
        config = load_config_file(path)
        code: dict[str, Any] = dict(resource_attributes or {})
        if service_name:
            code[SERVICE_NAME] = service_name
        resource = Resource(code).merge(create_resource(config.resource))
        tracer_provider = create_tracer_provider(config.tracer_provider, resource)
        meter_provider = create_meter_provider(config.meter_provider, resource)
    except (OSError, ConfigurationError, ValueError) as exc:
        raise ValueError(f"{ENV_CONFIG_FILE}={path!r}: {exc}") from None
    if views:
        _logger.warning("otel_llm.configure(views=...) is not applied: %s sets the views", ENV_CONFIG_FILE)
    _logger.info("otel_llm: providers built from %s=%s", ENV_CONFIG_FILE, path)
    return Telemetry(tracer_provider, meter_provider, shutdown_timeout_s=timeout_s)
