"""The package's layout, as its imports draw it (DESIGN.md, "Layout: the instrumentation and the kit").

Two parts. The instrumentation is what a user installs into an engine: the hook side (``hooks/``)
produces one record per finished request (``record/``), the emit side (``emit/``) turns records into spans
and metric values, ``export/`` encodes and sends them, ``integrations/`` plug engines into the hook, and a
few top-level modules tie them together (``setup.configure()``, ``tracker.RequestTracker``). The try-out kit
(``kit/``: reference engine, server, commands, viewer) uses the instrumentation as an engine would. The
instrumentation never imports the kit.

Every module of the package belongs to exactly one place below, so a new folder cannot escape the rules.
Read from the source with ``ast``, so an import hidden in a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "otel_llm"
# Leaf modules any place may import: names, the version, the log-once helper.
SHARED = ("otel_llm.semconv", "otel_llm._version", "otel_llm.logs")

# Each place of the instrumentation, and what of the rest of the package it may import besides itself and
# SHARED. The arrows run hooks -> record -> emit -> export, never back.
RULES: dict[str, tuple[str, ...]] = {
    "hooks": ("otel_llm.record",),
    "record": (),
    "emit": ("otel_llm.record",),
    # The export process builds, in the child, the same pipeline configure() builds in the engine's
    # process: one builder for both (export/process.py's child entry imports setup.build_export_pipeline).
    "export": ("otel_llm.record", "otel_llm.emit", "otel_llm.setup"),
    # Integrations reach the instrumentation as an engine author would: the hook, configure(), the
    # server attributes; plus the hook side's options and identity helpers they hand to the tracker.
    "integrations": (
        "otel_llm.hooks",
        "otel_llm.tracker",
        "otel_llm.setup",
        "otel_llm.server_attributes",
        "otel_llm.RequestTracker",
        "otel_llm.configure",
        # The integrations' own self-metric (otel_llm.integration.errors) is observed the way the
        # trackers' are, through the emit side's per-provider observables.
        "otel_llm.emit.observables",
    ),
}
# Top-level modules of the instrumentation: the glue, free to import any of it (never the kit).
GLUE = (
    "__init__.py",
    "_moved.py",
    "_version.py",
    "logs.py",
    "semconv.py",
    "setup.py",
    "tracker.py",
    "server_attributes.py",
)
KIT = "kit"


def module_imports(path: Path) -> set[str]:
    """The otel_llm names one file imports (``from otel_llm.a import b`` counts as otel_llm.a.b)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("otel_llm"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("otel_llm"):
            # Each name counts as module.name: ``from otel_llm.emit import observables`` is a use of
            # otel_llm.emit.observables (a rule may allow one module of a place without the rest).
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def imports(folder: str) -> dict[str, set[str]]:
    """Module file (relative to the package) -> the otel_llm modules it imports."""
    return {
        str(path.relative_to(PACKAGE)): module_imports(path)
        for path in sorted((PACKAGE / folder).rglob("*.py"))
    }


def _within(name: str, allowed: tuple[str, ...]) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


def outside(found: dict[str, set[str]], own: str, allowed: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """The imports of each module that are neither of its own place, nor allowed, nor shared."""
    ok = (f"otel_llm.{own}", *allowed, *SHARED)
    bad = {module: {n for n in names if not _within(n, ok)} for module, names in found.items()}
    return {module: names for module, names in bad.items() if names}


def instrumentation_files() -> list[Path]:
    """Every module of the package outside the kit."""
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] != KIT]


def test_every_module_has_a_place() -> None:
    placed = {*RULES, KIT}
    loose = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.relative_to(PACKAGE).parts[0] not in placed and p.name not in GLUE
    ]
    assert loose == [], "each new module goes in a folder of RULES, the kit, or GLUE (with a reason)"


@pytest.mark.parametrize("place", sorted(RULES))
def test_each_place_imports_only_what_its_rule_allows(place: str) -> None:
    assert outside(imports(place), place, RULES[place]) == {}


def test_the_instrumentation_never_imports_the_kit() -> None:
    into_kit = {
        str(path.relative_to(PACKAGE)): sorted(
            n for n in module_imports(path) if _within(n, ("otel_llm.kit",))
        )
        for path in instrumentation_files()
    }
    assert {k: v for k, v in into_kit.items() if v} == {}


def test_the_hook_side_loads_no_sdk() -> None:
    sdk = {
        module
        for path in (PACKAGE / "hooks").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for module in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
        if module.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))
    }
    assert sdk == set()


def test_a_broken_layout_is_seen(tmp_path: Path) -> None:
    """The checks themselves: an emit-side import in a hook-side module, and a kit import in the core."""
    found = {"hooks/x.py": {"otel_llm.hooks.timeline", "otel_llm.emit.spans", "otel_llm.record"}}
    assert outside(found, "hooks", RULES["hooks"]) == {"hooks/x.py": {"otel_llm.emit.spans"}}
    # One module of a place allowed is not the whole place.
    found = {"integrations/x.py": {"otel_llm.emit.observables", "otel_llm.emit.spans.SpanBuilder"}}
    assert outside(found, "integrations", RULES["integrations"]) == {
        "integrations/x.py": {"otel_llm.emit.spans.SpanBuilder"}
    }
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from otel_llm.kit.engine import LLMEngine\n")
    assert _within(next(iter(module_imports(probe))), ("otel_llm.kit",))
