"""Results and their rendering: one Markdown table per section (measure / ours / peers / ratio)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

SECTIONS = {
    "hook": "1. Hook cost per request-token (decode loop)",
    "finish": "2. Finishing a request (spans + events + all metrics)",
    "e2e": "3. End to end through configure() to an OTLP gRPC receiver on loopback",
    "memory": "4. Memory per in-flight request (tracemalloc)",
    "engine": "5. Reference engine",
    "collect": "6. One metric collection (InMemoryMetricReader) with otel_llm's histograms",
    "sampling": "7. Tail sampling and trace detail levels",
    "sglang": "8. SGLang's real offline engine (tiny model, CPU)",
    "export": "9. A finished request's CPU with the export process, engine's and export process's",
}
OPTIONAL = frozenset({"sglang"})  # sections that report nothing where they cannot run (reason printed)


@dataclass
class Measure:
    """One measured value of ours, and the same measure for each peer (same unit)."""

    section: str
    name: str
    unit: str  # "ns", "B", "req/s", "steps/s", "tok/s", "fraction", "count"
    ours: float
    peers: dict[str, float] = field(default_factory=dict)
    spread: tuple[float, float] | None = None  # min and max over rounds, when timed
    note: str = ""

    def ratio(self, peer: str) -> float:
        """ours / peer: below 1 means ours is smaller (cheaper, or for rates, slower)."""
        value = self.peers[peer]
        return self.ours / value if value else math.inf

    def is_finite(self) -> bool:
        return all(math.isfinite(v) for v in (self.ours, *self.peers.values()))


def fmt(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return str(value)
    if unit == "ns":
        if value < 1_000:
            return f"{value:.1f} ns"
        if value < 1_000_000:
            return f"{value / 1e3:.2f} µs"
        return f"{value / 1e6:.2f} ms"
    if unit == "B":
        return f"{value:.0f} B" if value < 10 * 1024 else f"{value / 1024:.1f} KiB"
    if unit == "fraction":
        return f"{value * 100:.2f} %"
    if unit == "B/s":
        return f"{value / 1024:,.1f} KiB/s"
    if unit in ("req/s", "steps/s", "spans/s", "tok/s"):
        return f"{value:,.1f} {unit}"
    return f"{value:g} {unit}"


def ratio_text(r: float) -> str:
    if not math.isfinite(r):
        return "—"
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.3f}x (1/{1 / r:.0f})"


def section_tables(measures: Sequence[Measure]) -> list[str]:
    lines: list[str] = []
    for key, title in SECTIONS.items():
        rows = [m for m in measures if m.section == key]
        if not rows:
            continue
        lines += [f"### {title}", "", "| measure | ours | peers | ratio (ours ÷ peer) |", "|---|---|---|---|"]
        for m in rows:
            ours = fmt(m.ours, m.unit)
            if m.spread is not None:
                ours += f" ({fmt(m.spread[0], m.unit)} – {fmt(m.spread[1], m.unit)})"
            if m.peers:
                peers = "<br>".join(f"{name}: {fmt(v, m.unit)}" for name, v in m.peers.items())
                ratios = "<br>".join(f"vs {name}: {ratio_text(m.ratio(name))}" for name in m.peers)
            else:
                peers, ratios = "—", "—"
            name = m.name + (f" ({m.note})" if m.note else "")
            lines.append(f"| {name} | {ours} | {peers} | {ratios} |")
        lines.append("")
    return lines
