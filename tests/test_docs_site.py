"""The documentation site builds strictly: no broken link or anchor, no page under docs/ left out of nav.

``python -m mkdocs build --strict`` is the build (mkdocs.yml makes each of those a warning, which
``--strict`` turns into an error); the last two tests show that it really fails on a page left out of
nav and on a broken link, on a copy of the site.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TIMEOUT_S = 120


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def nav_pages(nav: object) -> list[str]:
    """Every page file the nav of mkdocs.yml lists, nested sections included."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    raise AssertionError(f"an entry of nav that is not a page or a section: {nav!r}")


def config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, f"mkdocs build --strict exited {done.returncode}:\n{done.stderr[-4000:]}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_nav_lists_every_page_once_and_nothing_else() -> None:
    listed = nav_pages(config()["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert len(listed) == len(set(listed)), f"a page listed twice: {listed}"
    unlisted, unknown = set(pages) - set(listed), set(listed) - set(pages)
    assert sorted(listed) == pages, f"not in nav: {unlisted}; not a page: {unknown}"


def test_the_strict_build_is_the_one_that_checks() -> None:
    cfg = config()
    assert cfg["docs_dir"] == "docs" and cfg["strict"] is True
    checks = cfg["validation"]
    assert checks["nav"]["omitted_files"] == "warn" and checks["nav"]["not_found"] == "warn"
    assert checks["links"]["not_found"] == "warn" and checks["links"]["anchors"] == "warn"


def copy_of_the_site(tmp_path: Path) -> Path:
    root = tmp_path / "copy"
    shutil.copytree(DOCS, root / "docs")
    shutil.copy(ROOT / "mkdocs.yml", root / "mkdocs.yml")
    return root


def test_a_page_left_out_of_nav_fails_the_build(tmp_path: Path) -> None:
    root = copy_of_the_site(tmp_path)
    (root / "docs" / "left-out.md").write_text("# Left out\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0 and "left-out.md" in done.stderr, done.stderr[-2000:]


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    for number, link in enumerate(("[gone](no-such-page.md)", "[gone](hooks.md#no-such-heading)")):
        root = copy_of_the_site(tmp_path / str(number))
        with (root / "docs" / "index.md").open("a") as f:
            f.write(f"\n{link}\n")
        done = build(root, tmp_path / "site")
        assert done.returncode != 0 and "index.md" in done.stderr, (link, done.stderr[-2000:])
