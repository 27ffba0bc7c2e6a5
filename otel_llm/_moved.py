"""Old import names of modules that moved, kept working for one minor release with a DeprecationWarning.

In 0.2.0 the try-out kit (reference engine, server, commands, viewer) moved under ``otel_llm.kit`` so that
the instrumentation and the kit are visibly apart. ``import otel_llm.engine`` still works until 0.3.0:
it warns once per name and gives the module at its new place (the same module object, so types and state
are shared). The policy is in docs/development.md, "Deprecations".

Only names are mapped here; nothing of the kit is imported until a caller asks for an old name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "REMOVED_IN", "install"]

# Old module name -> new module name. Submodules follow their package (otel_llm.engine.engine too).
MOVED: dict[str, str] = {
    "otel_llm.engine": "otel_llm.kit.engine",
    "otel_llm.server": "otel_llm.kit.server",
    "otel_llm.commands": "otel_llm.kit.commands",
    "otel_llm.cli": "otel_llm.kit.cli",
    "otel_llm.waterfall": "otel_llm.kit.waterfall",
    "otel_llm.waterfall_render": "otel_llm.kit.waterfall_render",
    "otel_llm.trace_runs": "otel_llm.kit.trace_runs",
}
REMOVED_IN = "0.3.0"


def new_name(old: str) -> str | None:
    """The module's new name, or None when ``old`` did not move."""
    for before, after in MOVED.items():
        if old == before or old.startswith(before + "."):
            return after + old[len(before) :]
    return None


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new name, after one DeprecationWarning."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.target}; the old name stops working in otel-llm {REMOVED_IN}",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.target)
        self._spec = module.__spec__  # the import system sets the alias's spec on it: put it back after
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # already run at its new name; only its own spec is restored

    def get_code(self, fullname: str) -> object:
        """What ``python -m OLD_NAME`` runs: the new module's code, after the same warning."""
        warnings.warn(
            f"{fullname} moved to {self.target}; the old name stops working in otel-llm {REMOVED_IN}",
            DeprecationWarning,
            stacklevel=2,
        )
        spec = importlib.util.find_spec(self.target)
        assert spec is not None and spec.loader is not None
        return spec.loader.get_code(self.target)  # type: ignore[attr-defined]


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        after = new_name(fullname)
        if after is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(after))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once), ahead of the path finder, so that a submodule of
    an old package name is mapped too rather than loaded a second time from the new package's folder."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
