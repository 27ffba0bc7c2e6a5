"""collector-config/scaled/ on one machine: two agents route by trace id to two tail-sampling gateways.

Each gateway loads ``gateway.yaml`` with its listen addresses on loopback and its environment naming where
its traces and metrics go: its ``TEMPO_OTLP_ENDPOINT`` is a real OTLP receiver of the tests (one per
gateway, so a test sees which gateway kept which trace; Tempo is AGPL and not built) and its
``PROMETHEUS_REMOTE_WRITE_URL`` a real Prometheus with its remote-write receiver on. Each agent loads
``agent.yaml`` with its listen addresses on loopback and one change a single machine forces: its
``dns`` resolver (a headless service: one name, one address per gateway, all on port 4317) becomes the
``static`` resolver listing the two gateways' loopback ports; ``routing_key: traceID`` is kept.
Several Collectors on one machine also need their own telemetry port: it is switched off with one
``--config=yaml:`` override (the files leave it at its default, port 8888).

A gateway can be killed (SIGKILL, a crash), stopped (SIGTERM, as Kubernetes stops a pod) and started
again with the same file and ports, as a restarted pod would be.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from tests.collector.local_stack import replace_exactly_once
from tests.collector.processes import COLLECTOR, PROMETHEUS, Proc, poll, promql
from tests.otlp_receivers import GrpcReceiver
from tests.ports import free_port

SCALED = Path(__file__).resolve().parents[2] / "collector-config" / "scaled"
NO_SELF_METRICS = "--config=yaml:service::telemetry::metrics::level: none"
READY = "Everything is ready"


def loopback_listeners(text: str, source: Path, grpc: int, http: int) -> str:
    return replace_exactly_once(
        text,
        {
            "endpoint: 0.0.0.0:4317": f"endpoint: 127.0.0.1:{grpc}",
            "endpoint: 0.0.0.0:4318": f"endpoint: 127.0.0.1:{http}",
        },
        source,
    )


def agent_config(grpc: int, http: int, gateways: list[int]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(the agent's file as the test runs it, the shipped file parsed, the run file parsed)."""
    source = SCALED / "agent.yaml"
    shipped = yaml.safe_load(source.read_text())
    config = yaml.safe_load(loopback_listeners(source.read_text(), source, grpc, http))
    resolver = config["exporters"]["load_balancing"]["resolver"]
    assert set(resolver) == {"dns"}, resolver
    config["exporters"]["load_balancing"]["resolver"] = {
        "static": {"hostnames": [f"127.0.0.1:{port}" for port in gateways]}
    }
    return yaml.safe_dump(config), shipped, config


def what_changed(shipped: dict[str, Any], run: dict[str, Any]) -> set[str]:
    """Dotted paths where two parsed configs differ."""
    changed: set[str] = set()

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in set(a) | set(b):
                walk(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        elif a != b:
            changed.add(path)

    walk(copy.deepcopy(shipped), run, "")
    return changed


class ScaledStack:
    """Prometheus, two gateways, two agents; ``stop()`` ends them in reverse order."""

    def __init__(self, work: Path, trace_stores: list[str] | None = None) -> None:
        """``trace_stores``: the two gateways' ``TEMPO_OTLP_ENDPOINT`` (``host:port``, OTLP/gRPC); by
        default a real OTLP receiver of the tests for each (``stores``)."""
        self.work = work
        self.procs: list[Proc] = []
        self.prometheus_port = free_port()
        prom_config = work / "prometheus-scaled.yaml"
        prom_config.write_text("global:\n  scrape_interval: 10s\n")
        self.prometheus = self._start(
            "prometheus-scaled",
            [
                PROMETHEUS,
                f"--config.file={prom_config}",
                "--web.enable-remote-write-receiver",
                f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                f"--storage.tsdb.path={work / 'prometheus-scaled-data'}",
            ],
        )
        self.prometheus.wait_ready(f"{self.prometheus_url}/-/ready")
        self.stores = [] if trace_stores else [GrpcReceiver(), GrpcReceiver()]
        for store in self.stores:
            store.start()
        trace_stores = trace_stores or [f"127.0.0.1:{store.port}" for store in self.stores]
        self.gateway_ports: list[int] = []
        self.gateways: list[Proc] = []
        self._gateway_runs: list[tuple[Path, dict[str, str]]] = []  # config file, environment
        self._starts = 0
        for index, store in enumerate(trace_stores):
            grpc, http = free_port(), free_port()
            path = work / f"gateway-{index}.yaml"
            source = SCALED / "gateway.yaml"
            path.write_text(loopback_listeners(source.read_text(), source, grpc, http))
            env = {
                "TEMPO_OTLP_ENDPOINT": store,
                "PROMETHEUS_REMOTE_WRITE_URL": f"{self.prometheus_url}/api/v1/write",
                "HOSTNAME": f"gateway-{index}",
            }
            self.gateways.append(self.collector(f"gateway-{index}", path, env))
            self._gateway_runs.append((path, env))
            self.gateway_ports.append(grpc)
        self.agent_ports: list[int] = []
        self.agents: list[Proc] = []
        self.agent_changes: set[str] = set()
        for index in range(2):
            grpc, http = free_port(), free_port()
            text, shipped, run = agent_config(grpc, http, self.gateway_ports)
            self.agent_changes |= what_changed(shipped, run)
            path = work / f"agent-{index}.yaml"
            path.write_text(text)
            env = {"GATEWAY_SERVICE": f"127.0.0.1:{self.gateway_ports[0]}"}
            self.agents.append(self.collector(f"agent-{index}", path, env))
            self.agent_ports.append(grpc)

    def _start(self, name: str, argv: list, env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, self.work, env)
        self.procs.append(proc)
        return proc

    def collector(self, name: str, config: Path, env: dict[str, str]) -> Proc:
        proc = self._start(name, [COLLECTOR, f"--config={config}", NO_SELF_METRICS], env)
        poll(f"{name} to start", proc.log, lambda log: READY in log or not proc.alive(), timeout_s=60)
        assert proc.alive(), proc.log()
        return proc

    def kill_gateway(self, index: int) -> int:
        """SIGKILL gateway ``index``: it flushes nothing. Returns its exit status."""
        return self.gateways[index].kill()

    def stop_gateway(self, index: int) -> int:
        """SIGTERM gateway ``index`` and wait for it to exit (SIGKILL after 30 s). Returns its exit status."""
        return self.gateways[index].stop(timeout_s=30)

    def restart_gateway(self, index: int) -> None:
        """Start gateway ``index`` again: same file, same ports, same environment, empty memory."""
        assert not self.gateways[index].alive()
        self._starts += 1
        path, env = self._gateway_runs[index]
        self.gateways[index] = self.collector(f"gateway-{index}.{self._starts}", path, env)

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    def promql(self, expr: str, at: float | None = None) -> list[dict]:
        return promql(self.prometheus_url, expr, at)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        for store in self.stores:
            store.stop()
