"""Shared by the tests of the documentation's pictures (tests/test_docs_pictures.py, tests/phoenix/):
the script that draws them, loaded from docs/pictures/, and a run's spans read from its files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
PICTURES = ROOT / "docs" / "pictures"


def make_pictures() -> ModuleType:
    """docs/pictures/make_pictures.py as a module (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("make_pictures", PICTURES / "make_pictures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spans_by_trace(run: Path) -> dict[str, list[str]]:
    """The names of every span in the run's traces.jsonl files, by trace id (hex), one per span."""
    names: dict[str, list[str]] = {}
    for path in run.rglob("traces.jsonl"):
        for line in path.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        names.setdefault(span["traceId"], []).append(span["name"])
    return names
