"""The package as users get it: an sdist and a wheel built by the standard front end, installed for real.

Every other test runs the checkout installed editable, where a file left out of the wheel, an entry point
dropped from pyproject.toml or a missing ``py.typed`` goes unnoticed. Here ``python -m build`` makes the
sdist and, from it, the wheel (as a release would) out of a copy of what the build reads; ``twine check``
reads their metadata; pip installs the wheel (not editable) with its dependencies into a fresh virtualenv,
and every command below runs there, outside the checkout, so nothing can be imported from it. torch comes
from the folder the environment scripts share (``torch_tree`` in tests/venv_tools.sh), installed
once and hard-linked into each new virtualenv (see ``installed_torch``): no download after the first run.
About a minute on a busy 2-core machine once torch is installed there; the first run adds the download.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_llm import semconv as sc

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "otel_llm"
# What the build reads from a clone: the package, its metadata and the README that is its description.
BUILD_INPUTS = ("pyproject.toml", "README.md", "MANIFEST.in")
TIMEOUT_S = 900  # a first run downloads torch's wheels into the shared folder (about 3 GB)
DEMO_REQUESTS = 4
# The entry point groups the engines read, and the libraries opentelemetry-instrument must be able to
# instrument: facts of vLLM, SGLang and OpenTelemetry, which the README's sections on them rely on.
ENGINE_PLUGIN_GROUPS = ("vllm.general_plugins", "sglang.srt.plugins")
INSTRUMENTOR_GROUP = "opentelemetry_instrumentor"
INSTRUMENTED = {"vllm", "sglang"}


def run(args: list[object], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a command to completion and return its stdout; fails the test with its output when it fails."""
    words = [str(a) for a in args]
    done = subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    said = f"{' '.join(words)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, said
    return done.stdout


def package_files() -> set[str]:
    """Every file of the package in the checkout (what the installed package may read), as wheel paths."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel, built from a copy of the checkout (the build writes beside its input)."""
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(PACKAGE, source / PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in BUILD_INPUTS:
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", out, source], cwd=source)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would point a command at the checkout or a collector."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(extra)
    return env


def installed_torch() -> Path:
    """A folder holding TORCH_PIN and what it needs, installed by pip once (``torch_tree`` in
    tests/venv_tools.sh, the folder every torch virtualenv of the test tiers links its torch from).

    Unpacking torch with its CUDA libraries writes 4.7 GB, a minute or two of this test on a busy
    2-core machine; the fresh virtualenv gets this folder as hard links instead (a second), which is
    the same files pip would have written. ``torch_tree`` runs this interpreter's pip (``--target``) and
    first fills the wheel folder from PyPI when it lacks the wheels.
    """
    env = clean_env(VENV=sys.prefix)
    if os.environ.get("OTEL_LLM_WHEEL_CACHE"):  # clean_env leaves out every OTEL_ variable
        env["OTEL_LLM_WHEEL_CACHE"] = os.environ["OTEL_LLM_WHEEL_CACHE"]
    return Path(run(["bash", "-c", ". tests/venv_tools.sh && torch_tree"], cwd=ROOT, env=env).strip())


def link_or_copy(source: str, dest: str) -> None:
    try:
        os.link(source, dest)
    except OSError:  # another file system
        shutil.copy2(source, dest)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, dist: dict[str, Path]) -> Iterator[Path]:
    """A fresh virtualenv holding the wheel with its torch extra and opentelemetry-distro; its bin folder."""
    where = tmp_path_factory.mktemp("venv")
    torch_site = installed_torch()
    venv.create(where, with_pip=False)
    bin_dir = where / "bin"
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site_packages = subprocess.check_output([bin_dir / "python", "-c", purelib], text=True).strip()
    shutil.copytree(torch_site, site_packages, dirs_exist_ok=True, copy_function=link_or_copy)
    run([bin_dir / "python", "-m", "ensurepip"], cwd=where, env=clean_env())  # keeps torch's newer setuptools
    distro = f"opentelemetry-distro=={importlib.metadata.version('opentelemetry-distro')}"  # the dev pin
    pip = [bin_dir / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run([*pip, f"{dist['wheel']}[torch]", distro], cwd=where, env=clean_env())
    yield bin_dir
    shutil.rmtree(where)  # gigabytes where the links fell back to copies


def in_venv(bin_dir: Path, code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by the virtualenv's python, outside the checkout; fails the test if it fails."""
    done = subprocess.run(
        [str(bin_dir / "python"), "-c", code, *args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_twine_finds_the_metadata_of_the_sdist_and_the_wheel_valid(dist: dict[str, Path]) -> None:
    said = run([sys.executable, "-m", "twine", "check", "--strict", dist["sdist"], dist["wheel"]], cwd=ROOT)
    assert said.count("PASSED") == 2, said


def test_the_sdist_and_the_wheel_hold_every_file_of_the_package(dist: dict[str, Path]) -> None:
    # Every file under otel_llm/ is one the installed package may import or open (a data file read
    # relative to its module, py.typed for type checkers, a new subpackage); none may stay behind.
    expected = package_files()
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        in_wheel = {name for name in wheel.namelist() if name.startswith(f"{PACKAGE.name}/")}
    with tarfile.open(dist["sdist"]) as sdist:
        in_sdist = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    missing = sorted(expected - in_wheel)
    assert not missing, (
        f"not in the wheel: {missing} (a data file goes in [tool.setuptools.package-data] of pyproject.toml)"
    )
    assert not sorted(expected - in_sdist), sorted(expected - in_sdist)
    assert f"{PACKAGE.name}/py.typed" in in_wheel


# A module that finds a file from its own location (Path(__file__).parent..., os.path.dirname(__file__)).
_FROM_OWN_FILE = re.compile(
    r"((?:os\.path\.dirname\()*)(?:Path\()?__file__\)?(?:\.resolve\(\)|\.absolute\(\))?"
    r"((?:\.parent\b)*)(?:\.parents\[(\d+)\])?"
)


def test_no_module_reads_a_file_from_outside_the_package() -> None:
    # Every file inside otel_llm/ is in the wheel (above); one that a module finds by climbing out of
    # the package from its own location (the checkout's other folders) is not, and fails once installed.
    outside = []
    for module in sorted(PACKAGE.rglob("*.py")):
        depth = len(module.relative_to(ROOT).parts) - 1  # folders it may climb and stay in otel_llm/
        for found in _FROM_OWN_FILE.finditer(module.read_text()):
            dirnames, parents, index = found.groups()
            climbs = dirnames.count("dirname") + parents.count(".parent") + (int(index) + 1 if index else 0)
            if climbs > depth:
                line = module.read_text()[: found.start()].count("\n") + 1
                outside.append(f"{module.relative_to(ROOT)}:{line}")
    assert not outside, f"these read from outside otel_llm/, which the wheel does not hold: {outside}"


_TYPED_PROBE = """
import importlib.metadata as md, importlib.resources as res, json, otel_llm
record = [str(f) for f in md.files("otel-llm")]
print(json.dumps({
    "module": otel_llm.__file__,
    "typed": res.files("otel_llm").joinpath("py.typed").is_file(),
    "recorded": "otel_llm/py.typed" in record,
    "editable": any("__editable__" in f for f in record),
}))
"""


def test_the_installed_package_is_the_wheel_with_its_type_information(
    installed: Path, tmp_path: Path
) -> None:
    found = json.loads(in_venv(installed, _TYPED_PROBE, tmp_path).stdout)
    assert Path(found["module"]).is_relative_to(installed.parent), found  # not the checkout
    assert not found["editable"], found
    assert found["typed"] and found["recorded"], f"py.typed is not installed with the package: {found}"


def test_the_demo_and_view_run_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = clean_env()
    assert (installed / "otel-llm").is_file(), "the wheel installs no otel-llm command"
    demo = [installed / "otel-llm", "demo", "--requests", DEMO_REQUESTS, "--output-dir", out]
    run(demo, cwd=tmp_path, env=env)
    (run_dir,) = out.iterdir()  # the demo's own run folder
    traces = run_dir / "traces.jsonl"
    ids = set()
    for line in traces.read_text().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    if span["name"] == sc.SPAN_REQUEST:
                        attrs = {a["key"]: a["value"] for a in span["attributes"]}
                        ids.add(attrs[sc.LLM_REQUEST_ID]["stringValue"])
    assert len(ids) == DEMO_REQUESTS, ids
    listed = run([installed / "otel-llm", "view", "--list", run_dir], cwd=tmp_path, env=env)
    assert all(request_id in listed for request_id in ids), listed
    waterfall = run([installed / "otel-llm", "view", traces], cwd=tmp_path, env=env)
    assert sc.SPAN_REQUEST in waterfall and any(f"request {i} " in waterfall for i in ids), waterfall


# Loads every entry point of otel-llm in the groups the engines and opentelemetry-instrument read, as
# they load them, in a process with neither vLLM nor SGLang installed.
_ENTRY_POINTS_PROBE = """
import importlib.metadata as md, json, logging, sys
logging.basicConfig(level=logging.WARNING)
groups = json.loads(sys.argv[1])
found = {}
for group in groups:
    for ep in md.entry_points(group=group):
        if ep.dist.name != "otel-llm":
            continue
        loaded = ep.load()
        if group == "opentelemetry_instrumentor":
            instrumentor = loaded()
            instrumentor.instrument()
            what = [instrumentor.instrumentation_dependencies(), instrumentor.is_instrumented]
        else:
            what = loaded()
        found.setdefault(group, []).append([ep.name, sys.modules[loaded.__module__].__file__, what])
engines = sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "sglang"))
print(json.dumps({"found": found, "engines_imported": engines}))
"""


def test_the_engine_and_instrumentor_entry_points_load_from_the_wheel(
    installed: Path, tmp_path: Path
) -> None:
    groups = [*ENGINE_PLUGIN_GROUPS, INSTRUMENTOR_GROUP]
    done = in_venv(installed, _ENTRY_POINTS_PROBE, tmp_path, json.dumps(groups))
    report = json.loads(done.stdout)
    for group in groups:
        assert report["found"].get(group), f"no entry point of otel-llm in {group}: {report['found']}"
        for name, module_file, _ in report["found"][group]:
            assert Path(module_file).is_relative_to(installed.parent), (group, name, module_file)
    for name, _, returned in [e for g in ENGINE_PLUGIN_GROUPS for e in report["found"][g]]:
        assert returned is None, (name, returned)
    instrumentors = report["found"][INSTRUMENTOR_GROUP]
    covered = {dep.split()[0] for _, _, (deps, _) in instrumentors for dep in deps}
    assert covered == INSTRUMENTED, f"the instrumentors cover {covered}, not {INSTRUMENTED}"
    assert not any(on for _, _, (_, on) in instrumentors), instrumentors  # nothing to instrument here
    # As without the wheel: each integration says once that its engine is missing and imports none of it.
    assert report["engines_imported"] == [], report
    assert done.stderr.count("vLLM is not installed") == 1, done.stderr
    assert done.stderr.count("SGLang is not installed") == 1, done.stderr


_INSTRUMENTED_SCRIPT = """
import json, sys
before = sorted(m for m in sys.modules if m.split(".")[0] == "otel_llm")
from opentelemetry import trace
import otel_llm
tracker = otel_llm.RequestTracker(model="package-test")  # the global providers: the distro's
tracker.queued("pkg-1", prompt_tokens=5)
tracker.scheduled(["pkg-1"])
tracker.tokens(["pkg-1"])
tracker.tokens(["pkg-1"])
tracker.finished("pkg-1", reason="stop")
provider = type(trace.get_tracer_provider())
print(json.dumps({"before": before, "provider": provider.__module__ + "." + provider.__name__}))
"""


def test_opentelemetry_instrument_runs_a_script_that_uses_the_wheel(installed: Path, tmp_path: Path) -> None:
    script = tmp_path / "traced.py"
    script.write_text(_INSTRUMENTED_SCRIPT)
    env = clean_env(OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    said = run([installed / "opentelemetry-instrument", installed / "python", script], cwd=tmp_path, env=env)
    decoder, objects, at = json.JSONDecoder(), [], said.find("{")
    while at >= 0:  # the console exporter's spans (JSON objects, one after another) and the report
        try:
            found, at = decoder.raw_decode(said, at)
            objects.append(found)
        except ValueError:
            at += 1
        at = said.find("{", at)
    (report,) = [o for o in objects if "before" in o]
    # The instrumentors wait for vLLM or SGLang (their instruments-any extra in the wheel's metadata):
    # without either, opentelemetry-instrument imports nothing of otel_llm.
    assert report["before"] == [], report
    assert report["provider"].startswith("opentelemetry.sdk."), report  # the distro built the providers
    spans = [o for o in objects if o.get("name") == sc.SPAN_REQUEST]
    assert [s["attributes"].get(sc.LLM_REQUEST_ID) for s in spans] == ["pkg-1"], said[-3000:]
