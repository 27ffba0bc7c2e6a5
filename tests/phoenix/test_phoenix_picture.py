"""The documentation's picture of a demo trace in a real trace UI is what the code produces today.

``docs/pictures/make_pictures.py`` replays a fresh demo run's files into a new Arize Phoenix server over
OTLP/HTTP (``examples/replay_files.py``, as a user would send them to a collector) and takes a
screenshot of Phoenix's page for the request the demo's waterfall shows, with headless Chromium. Here
it does that again: the PNG must be a whole picture of the window's size with something drawn in it,
and the page Chromium rendered (its DOM) must show that trace's id and every span of the trace, as
many times as the trace has them. The picture in the repository must be such a PNG too, and the README
must show it. The same holds for the picture of a trace through vllm-router (``fleet-trace.png``), drawn
in the same Phoenix from the trace stored beside it, which tests/router keeps the shape of a fresh one.

Phoenix comes from ``.venv-phoenix`` (``bash tests/phoenix/make_env.sh``; ``OTEL_LLM_PHOENIX``) and
Chromium from Debian's package (``apt-get install chromium``; ``OTEL_LLM_CHROMIUM``): without them these
tests are skipped and say which is missing. Nothing is compared byte for byte: times differ by run.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections import Counter

import pytest
from pictures import PICTURES, ROOT, make_pictures, spans_by_trace

pictures = make_pictures()
missing = pictures.phoenix_can_run()
pytestmark = pytest.mark.skipif(missing is not None, reason=str(missing))

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FLEET = PICTURES / "fleet-trace"  # one stored trace through vllm-router (docs/pictures/make_pictures.py)


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """A PNG's chunks, (type, body), each one's CRC checked: a cut-off or garbled file fails here."""
    assert data.startswith(PNG_SIGNATURE), data[:8]
    chunks, at = [], len(PNG_SIGNATURE)
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in chunk {kind!r}"
        chunks.append((kind, body))
        at += 12 + length
    assert chunks[-1][0] == b"IEND", "the PNG does not end"
    return chunks


def png_size_and_pixels(data: bytes) -> tuple[tuple[int, int], bytes]:
    """(width, height) and the decompressed scanlines (each row's filter byte first)."""
    chunks = png_chunks(data)
    assert chunks[0][0] == b"IHDR"
    width, height = struct.unpack(">II", chunks[0][1][:8])
    pixels = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    return (width, height), pixels


def assert_a_drawn_window(data: bytes) -> None:
    size, pixels = png_size_and_pixels(data)
    assert size == pictures.WINDOW, size
    # A blank or one-colour page (Phoenix not drawn yet, an error page) has a handful of byte values;
    # a drawn trace view, with its text and icons, has far more.
    assert len(set(pixels)) > 64, f"the picture looks blank: {len(set(pixels))} byte values"


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, list[str]], str, bytes, str]]:
    """In one Phoenix: a fresh demo run's trace that its waterfall shows (``demo``), and the stored trace
    through vllm-router (``fleet``); for each, the run's spans by trace, the trace's id, and Phoenix's
    page of it: the screenshot's bytes and the rendered DOM."""
    run, printed = pictures.run_demo(tmp_path_factory.mktemp("demo"))
    folder = tmp_path_factory.mktemp("picture")
    runs = {"demo": (run, pictures.shown_trace(printed)), "fleet": (FLEET, pictures.fleet_trace_id())}
    shots = [(run, trace_id, folder / f"{name}.png") for name, (run, trace_id) in runs.items()]
    doms = pictures.phoenix_pictures(shots)
    return {
        name: (spans_by_trace(run), trace_id, target.read_bytes(), dom)
        for (name, (run, trace_id)), (_, _, target), dom in zip(runs.items(), shots, doms)
    }


@pytest.fixture(scope="module")
def taken(
    both: dict[str, tuple[dict[str, list[str]], str, bytes, str]],
) -> tuple[dict[str, list[str]], str, bytes, str]:
    return both["demo"]


def test_the_screenshot_is_a_drawn_window(taken: tuple[dict[str, list[str]], str, bytes, str]) -> None:
    assert_a_drawn_window(taken[2])


def test_phoenix_shows_the_trace_with_every_span(taken: tuple[dict[str, list[str]], str, bytes, str]) -> None:
    spans, trace_id, _, dom = taken
    assert trace_id in spans, "the waterfall's trace is not in the run's files"
    assert trace_id in dom, "Phoenix's page does not show the trace's id"
    wanted = Counter(spans[trace_id])
    assert wanted["llm.preempted"] >= 1, wanted  # the demo's waterfall shows its most preempted request
    # Each span is one row of Phoenix's span tree, its name the row's text. llm.request is also every
    # row of the traces table behind the trace's panel, so it is only required once.
    shown = Counter(re.findall(r">(llm\.[a-z_]+)<", dom))
    for name, count in wanted.items():
        assert shown[name] >= (1 if name == "llm.request" else count), (name, count, shown)


def test_the_picture_in_the_repository_is_such_a_screenshot_and_the_readme_shows_it() -> None:
    assert_a_drawn_window((PICTURES / "phoenix-trace.png").read_bytes())
    assert "](docs/pictures/phoenix-trace.png)" in (ROOT / "README.md").read_text()


def test_phoenix_shows_the_fleet_trace_with_the_router_and_engine_spans(
    both: dict[str, tuple[dict[str, list[str]], str, bytes, str]],
) -> None:
    spans, trace_id, picture, dom = both["fleet"]
    assert_a_drawn_window(picture)
    assert trace_id in dom, "Phoenix's page does not show the trace's id"
    wanted = Counter(spans[trace_id])
    assert wanted["POST /v1/completions"] == 2 and wanted["llm.request"] == 1, (
        wanted
    )  # router: server, client
    shown = Counter(re.findall(r">((?:llm\.[a-z_]+)|(?:POST /v1/completions))<", dom))
    for name, count in wanted.items():
        assert shown[name] >= (1 if name in ("llm.request", "POST /v1/completions") else count), (name, shown)


def test_the_fleet_picture_in_the_repository_is_such_a_screenshot_and_the_fleet_page_shows_it() -> None:
    assert_a_drawn_window((PICTURES / "fleet-trace.png").read_bytes())
    assert "](pictures/fleet-trace.png)" in (ROOT / "docs" / "fleet.md").read_text()
