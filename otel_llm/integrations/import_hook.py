"""Run a callback once a module has been imported, without importing it.

``opentelemetry-instrument`` switches every installed instrumentor on in every Python process it starts,
most of which never import vLLM or SGLang. Importing them (and torch) there would cost seconds and
hundreds of MB, so the vLLM and SGLang instrumentors wait: a finder placed first on ``sys.meta_path``
notices when the module is imported, lets the normal import finish, then calls back. The finder removes
itself after one use.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the loader protocol, for the type checker only (importlib.abc costs start-up time)
    from importlib.abc import Loader as _LoaderProtocol
else:
    _LoaderProtocol = object


class _AfterImport:  # a sys.meta_path finder (importlib.abc is not imported: start-up cost)
    """Finds nothing itself; for ``name`` it wraps the real loader so ``callback`` runs after it."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self.callback = callback
        self._busy = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or getattr(self._busy, "on", False):
            return None
        self._busy.on = True  # find the real spec with the other finders, not with this one again
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
            if spec is None:
                for finder in sys.meta_path:
                    if finder is not self and hasattr(finder, "find_spec"):
                        spec = finder.find_spec(fullname, path, target)
                        if spec is not None:
                            break
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self)
        return spec


class _Loader(_LoaderProtocol):  # an importlib loader
    def __init__(self, inner: Any, finder: _AfterImport) -> None:
        self.inner = inner
        self.finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module's spec keeps the real loader (importlib.reload and resources use it).
        module.__spec__.loader = self.inner  # type: ignore[union-attr]
        module.__loader__ = self.inner
        self.inner.exec_module(module)
        remove(self.finder)
        self.finder.callback()


def when_imported(name: str, callback: Callable[[], None]) -> object:
    """Call ``callback()`` right after the module ``name`` is first imported; returns a removal handle.

    If the module is already imported, ``callback`` runs now. The callback must not raise.
    """
    if name in sys.modules:
        callback()
        return None
    finder = _AfterImport(name, callback)
    sys.meta_path.insert(0, finder)
    return finder


def remove(handle: object) -> None:
    """Stop waiting (a handle from ``when_imported``); harmless if it already fired."""
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(handle)  # type: ignore[arg-type]
