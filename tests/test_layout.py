"""The package's two halves, as their imports draw them: the hook side produces records, the emit side
consumes them, and only the record is between them (DESIGN.md, "Two halves and the record between them").

Read from the source with ``ast``, so an import hidden in a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "otel_llm"
# What either half may import of the rest of the package: the record, and the leaf modules of names,
# the version and the log-once helper.
SHARED = ("otel_llm.record", "otel_llm.semconv", "otel_llm._version", "otel_llm.logs")


def imports(folder: str) -> dict[str, set[str]]:
    """Module file -> the otel_llm modules it imports (``from otel_llm import x`` counts as otel_llm.x)."""
    found: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names if a.name.startswith("otel_llm"))
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("otel_llm"):
                if node.module == "otel_llm":
                    names.update(f"otel_llm.{a.name}" for a in node.names)
                else:
                    names.add(node.module)
        found[str(path.relative_to(PACKAGE))] = names
    return found


def outside(found: dict[str, set[str]], own: str) -> dict[str, set[str]]:
    """The imports of each module that are neither of its own half nor shared."""
    allowed = (f"otel_llm.{own}", *SHARED)
    return {
        module: {n for n in names if not any(n == a or n.startswith(a + ".") for a in allowed)}
        for module, names in found.items()
        if any(not any(n == a or n.startswith(a + ".") for a in allowed) for n in names)
    }


def test_the_hook_side_imports_only_itself_and_the_record() -> None:
    assert outside(imports("hooks"), "hooks") == {}


def test_the_emit_side_imports_only_itself_and_the_record() -> None:
    assert outside(imports("emit"), "emit") == {}


def test_the_record_imports_nothing_of_either_half() -> None:
    assert outside(imports("record"), "record") == {}


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


def test_a_broken_layout_is_seen() -> None:
    """The check itself: an emit-side import in a hook-side module is found."""
    found = {"hooks/x.py": {"otel_llm.hooks.timeline", "otel_llm.emit.spans", "otel_llm.record"}}
    assert outside(found, "hooks") == {"hooks/x.py": {"otel_llm.emit.spans"}}
