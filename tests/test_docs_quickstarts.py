"""The quick starts on the first page of the docs (docs/index.md): one per audience, each opening with its
command, short enough to read in two minutes, and with the same commands as the pages that test them.

The vLLM and SGLang commands are the ones docs/vllm.md and docs/sglang.md give (the engine tiers run
those); the files the other two name exist. tests/test_docs_code.py runs the page's Python block, and
tests/test_install_lines.py its install lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INDEX = ROOT / "docs" / "index.md"
AUDIENCES = ["your own engine", "vLLM", "SGLang", "operator"]
MAX_WORDS = 300  # about two minutes of reading, code included
BASH = re.compile(r"```bash\n(.*?)```", re.S)


def sections() -> dict[str, str]:
    """The quick starts of docs/index.md by audience: the text under each "## Quick start: ..." heading."""
    text = INDEX.read_text()
    found = re.findall(r"^## Quick start: (.+?)\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    return dict(found)


def first_block(text: str) -> str:
    block = BASH.search(text)
    assert block, "no bash block"
    return block.group(1)


def test_there_is_one_quick_start_per_audience() -> None:
    assert list(sections()) == AUDIENCES


@pytest.mark.parametrize("audience", AUDIENCES)
def test_a_quick_start_opens_with_its_command_and_is_short(audience: str) -> None:
    text = sections()[audience]
    assert text.lstrip().startswith("```bash\n"), f"{audience}: the command comes first"
    words = len(text.split())
    assert words <= MAX_WORDS, f"{audience}: {words} words, more than two minutes to read"


def test_the_vllm_command_is_the_vllm_pages() -> None:
    assert first_block(sections()["vLLM"]) == first_block((ROOT / "docs" / "vllm.md").read_text())


def test_the_sglang_command_is_the_sglang_pages() -> None:
    # docs/sglang.md's general server block: the first after the tested release's name (tests/sglang/serve.py)
    page = (ROOT / "docs" / "sglang.md").read_text().split("SGLang 0.5.23", 1)[1]
    assert first_block(sections()["SGLang"]) == first_block(page)


def test_the_files_the_other_commands_name_exist() -> None:
    engine = first_block(sections()["your own engine"])
    operator = first_block(sections()["operator"])
    named = re.findall(r"(?:examples|collector-config)/\S+", engine + operator)
    assert len(named) == 2, named
    for path in named:
        assert (ROOT / path).is_file(), path
