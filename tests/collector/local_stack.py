"""collector-config/local/ without containers: the real Collector, Jaeger v2 and Prometheus on loopback.

The Collector loads ``collector-config/local/otelcol.yaml`` with only its listen and service addresses
replaced (compose service names and 0.0.0.0 become 127.0.0.1 and ports the test picks); Prometheus loads
``prometheus.yaml`` with only its scrape targets replaced, and starts with the flags ``compose.yaml``
gives it. Tempo (AGPL) stays out: the Collector's Tempo exporter sends to a real OTLP receiver of the
tests instead (``otlp_receivers.GrpcReceiver``), which so also records what the Collector forwarded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.collector.processes import COLLECTOR, HERE, JAEGER, PROMETHEUS, Proc, promql
from tests.ports import free_port

REPO = HERE.parents[1]
LOCAL = REPO / "collector-config" / "local"


def replace_exactly_once(text: str, replacements: dict[str, str], source: Path, times: int = 1) -> str:
    """Each key must occur ``times`` times in ``text``: an address the file lost fails the test loudly."""
    for old, new in replacements.items():
        count = text.count(old)
        assert count == times, f"{source.name}: expected {old!r} {times} times, found it {count} times"
        text = text.replace(old, new)
    return text


@dataclass
class Ports:
    otlp_grpc: int = field(default_factory=free_port)
    otlp_http: int = field(default_factory=free_port)
    prometheus_exporter: int = field(default_factory=free_port)
    health: int = field(default_factory=free_port)
    self_metrics: int = field(default_factory=free_port)
    jaeger_otlp: int = field(default_factory=free_port)
    jaeger_query: int = field(default_factory=free_port)
    jaeger_query_grpc: int = field(default_factory=free_port)
    jaeger_health: int = field(default_factory=free_port)
    prometheus: int = field(default_factory=free_port)


def collector_config(ports: Ports, tempo_port: int) -> str:
    source = LOCAL / "otelcol.yaml"
    return replace_exactly_once(
        source.read_text(),
        {
            "endpoint: 0.0.0.0:4317": f"endpoint: 127.0.0.1:{ports.otlp_grpc}",
            "endpoint: 0.0.0.0:4318": f"endpoint: 127.0.0.1:{ports.otlp_http}",
            "endpoint: 0.0.0.0:8889": f"endpoint: 127.0.0.1:{ports.prometheus_exporter}",
            "endpoint: 0.0.0.0:13133": f"endpoint: 127.0.0.1:{ports.health}",
            "host: 0.0.0.0\n                port: 8888": (
                f"host: 127.0.0.1\n                port: {ports.self_metrics}"
            ),
            "endpoint: jaeger:4317": f"endpoint: 127.0.0.1:{ports.jaeger_otlp}",
            "endpoint: tempo:4317": f"endpoint: 127.0.0.1:{tempo_port}",
        },
        source,
    )


def prometheus_config(ports: Ports) -> str:
    source = LOCAL / "prometheus.yaml"
    return replace_exactly_once(
        source.read_text(),
        {
            '"otel-collector:8889"': f'"127.0.0.1:{ports.prometheus_exporter}"',
            '"otel-collector:8888"': f'"127.0.0.1:{ports.self_metrics}"',
        },
        source,
    )


def tls_overlay(ports: Ports, cert: Path, key: Path) -> str:
    """``otelcol-tls.yaml`` with its listen addresses and certificate paths replaced."""
    source = LOCAL / "otelcol-tls.yaml"
    text = replace_exactly_once(
        source.read_text(),
        {
            "endpoint: 0.0.0.0:4317": f"endpoint: 127.0.0.1:{ports.otlp_grpc}",
            "endpoint: 0.0.0.0:4318": f"endpoint: 127.0.0.1:{ports.otlp_http}",
        },
        source,
    )
    return replace_exactly_once(
        text,
        {"/etc/otelcol/certs/collector.crt": str(cert), "/etc/otelcol/certs/collector.key": str(key)},
        source,
        times=2,
    )


def compose_prometheus_flags() -> list[str]:
    """Prometheus's flags from compose.yaml, less the config path (the test writes its own copy)."""
    compose = yaml.safe_load((LOCAL / "compose.yaml").read_text())
    flags = compose["services"]["prometheus"]["command"]
    return [f for f in flags if not f.startswith("--config.file=")]


class LocalStack:
    """Jaeger, then the Collector, then Prometheus; ``stop()`` ends them in reverse order."""

    def __init__(self, work: Path, tempo_port: int, tls: tuple[Path, Path] | None = None) -> None:
        self.ports = Ports()
        self.work = work
        self.scheme = "http" if tls is None else "https"
        self.procs: list[Proc] = []
        p = self.ports
        jaeger_env = {
            "JAEGER_OTLP_GRPC_PORT": str(p.jaeger_otlp),
            "JAEGER_QUERY_HTTP_PORT": str(p.jaeger_query),
            "JAEGER_QUERY_GRPC_PORT": str(p.jaeger_query_grpc),
            "JAEGER_HEALTH_PORT": str(p.jaeger_health),
        }
        self.jaeger = self._start("jaeger", [JAEGER, f"--config={HERE / 'jaeger.yaml'}"], jaeger_env)
        self.jaeger.wait_ready(f"{self.jaeger_url}/api/services")
        config = work / "otelcol.yaml"
        config.write_text(collector_config(p, tempo_port))
        configs = [f"--config={config}"]
        if tls is not None:  # the overlay, merged over the base file as README.md shows
            overlay = work / "otelcol-tls.yaml"
            overlay.write_text(tls_overlay(p, *tls))
            configs.append(f"--config={overlay}")
        self.collector = self._start("otelcol", [COLLECTOR, *configs])
        self.collector.wait_ready(f"http://127.0.0.1:{p.health}/")
        prom_config = work / "prometheus.yaml"
        prom_config.write_text(prometheus_config(p))
        self.prometheus = self._start(
            "prometheus",
            [
                PROMETHEUS,
                f"--config.file={prom_config}",
                *compose_prometheus_flags(),
                f"--web.listen-address=127.0.0.1:{p.prometheus}",
                f"--storage.tsdb.path={work / 'prometheus-data'}",
            ],
        )
        self.prometheus.wait_ready(f"{self.prometheus_url}/-/ready")

    def _start(self, name: str, argv: list, env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, self.work, env)
        self.procs.append(proc)
        return proc

    @property
    def otlp_grpc(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.ports.otlp_grpc}"

    @property
    def jaeger_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.jaeger_query}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.prometheus}"

    def promql(self, expr: str) -> list[dict]:
        return promql(self.prometheus_url, expr)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
