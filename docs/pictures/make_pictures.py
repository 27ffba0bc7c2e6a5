"""Draw the pictures of the documentation from what the code produces today.

``python docs/pictures/make_pictures.py [OUT_DIR]`` runs ``otel-llm demo`` into a temporary folder, then
``otel-llm view`` on its files, and writes what the viewer prints as ``waterfall.svg`` (default OUT_DIR:
this folder). The viewer's own code picks the request (the most preempted one) and draws every line;
only its last step, printing the lines with rich, prints into a recording rich console instead of the
terminal, which rich then exports as SVG. Needs the ``torch`` extra (the demo's engine, and rich).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent  # the checkout: its otel_llm is the one drawn
WIDTH = 100  # the viewer's width when it is not run in a terminal
TITLE = "otel-llm view"
DEMO = "import sys; from otel_llm.cli import main; sys.exit(main(sys.argv[1:]))"


def run_demo(output_dir: Path) -> tuple[Path, str]:
    """Run ``otel-llm demo`` with its files in ``output_dir``: the run folder it wrote, what it printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", DEMO, "demo", "--output-dir", str(output_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        said = f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        raise SystemExit(f"otel-llm demo exited {done.returncode}:\n{said}")
    (run,) = [p for p in output_dir.iterdir() if p.is_dir()]
    return run, done.stdout


def view_svg(files: Sequence[str], width: int = WIDTH) -> str:
    """What ``otel-llm view FILES --width WIDTH`` prints, as an SVG of rich's terminal export."""
    from rich.console import Console
    from rich.text import Text

    from otel_llm.cli import main
    from otel_llm.commands import view

    console = Console(record=True, width=width, file=open(os.devnull, "w"), soft_wrap=True)  # noqa: SIM115

    def emit(lines: Sequence[Sequence[tuple[str, str | None]]], file: object = None) -> None:
        for line in lines:  # as otel_llm.waterfall_render.emit prints them
            console.print(Text.assemble(*[(t, s or "") for t, s in line]))

    drawn = view.emit
    view.emit = emit  # type: ignore[assignment]
    try:
        status = main(["view", *files, "--width", str(width)])
    finally:
        view.emit = drawn  # type: ignore[assignment]
    if status != 0:
        raise SystemExit(f"otel-llm view exited {status}")
    return console.export_svg(title=TITLE)


def make(out_dir: Path = HERE) -> Path:
    """Write ``waterfall.svg`` into ``out_dir`` from a fresh demo run; its path."""
    with tempfile.TemporaryDirectory(prefix="otel-llm-pictures-") as tmp:
        run, _ = run_demo(Path(tmp))
        svg = view_svg([str(run)])
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "waterfall.svg"
    target.write_text(svg, encoding="utf-8")
    return target


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    print(make(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE))
