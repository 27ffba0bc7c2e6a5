"""The kit's old module names (before it moved under otel_llm.kit) keep working for one minor release,
each with a DeprecationWarning that names the new place (otel_llm/_moved.py, docs/development.md).

Each case runs in a fresh interpreter: in this one the kit is already imported by other tests.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from otel_llm import _moved

PROBE = """
import importlib, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    old = importlib.import_module({old!r})
new = importlib.import_module({new!r})
print(old is new, old.__spec__.name)
print("|".join(str(w.message) for w in caught if w.category is DeprecationWarning))
"""


def run(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.splitlines()


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("otel_llm.engine", "otel_llm.kit.engine"),
        ("otel_llm.engine.scheduler", "otel_llm.kit.engine.scheduler"),
        ("otel_llm.waterfall", "otel_llm.kit.waterfall"),
        ("otel_llm.commands.view", "otel_llm.kit.commands.view"),
    ],
)
def test_an_old_name_gives_the_same_module_and_warns(old: str, new: str) -> None:
    same, warned = run(PROBE.format(old=old, new=new))
    assert same == f"True {new}"  # one module object, keeping its own name: no second copy is loaded
    assert f"{old} moved to {new}" in warned
    assert _moved.REMOVED_IN in warned


def test_python_dash_m_with_the_old_cli_name_still_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-m", "otel_llm.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("otel-llm ")
    assert "otel_llm.cli moved to otel_llm.kit.cli" in done.stderr


def test_names_that_did_not_move_are_left_alone() -> None:
    assert _moved.new_name("otel_llm.tracker") is None
    assert _moved.new_name("otel_llm.server_attributes") is None  # a prefix of a moved name, but not it
    assert _moved.new_name("otel_llm.engines") is None
    (same,) = run("import otel_llm.tracker as t, sys; print(t.__spec__.origin.endswith('tracker.py'))")[:1]
    assert same == "True"


def test_every_old_name_points_at_a_module_that_exists() -> None:
    import importlib.util

    missing = [new for new in _moved.MOVED.values() if importlib.util.find_spec(new) is None]
    assert missing == []
