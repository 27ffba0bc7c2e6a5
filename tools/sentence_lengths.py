"""Sentence lengths in the docs, in words: the median and the 90th percentile, per page and over all.

    python tools/sentence_lengths.py            # docs/*.md
    python tools/sentence_lengths.py README.md  # any files
    python tools/sentence_lengths.py --over 35  # and every sentence longer than 35 words, to shorten

What counts as prose: paragraphs and list items. Left out: fenced code blocks, tables, headings, HTML
comments, picture lines, and mkdocstrings directives (a ":::" line and the indented options under it).
Inline code counts as one word; a link counts as the words of its text. A sentence ends at ".", "!" or
"?" followed by a space, with any closing quote, bracket or bold mark in between; a list item or a line
ending in ":" ends one too. Figures such as "2.5", an ellipsis "..." and abbreviations such as "e.g." do
not end a sentence.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

__all__ = ["page_sentences", "sentence_texts", "sentences", "summary"]

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_CODE = re.compile(r"`[^`]*`")
_PLACEHOLDER = re.compile(r"CODE(\d+)x")
_ABBREV = re.compile(r"\b(e\.g|i\.e|etc|vs|cf)\.", re.IGNORECASE)
# After the stop, what closes around it ("**Bold.** Next", "(an aside.) Next", '"quoted." Next'); the next
# sentence may start with anything, as names such as vLLM and otel-llm start in lower case.
_END = re.compile(r"(?<=[.!?])(?<!\.\.)[*_)\"']*\s+")


def _blocks(text: str) -> list[str]:
    """Prose blocks: paragraphs and list items, each joined into one line."""
    blocks: list[str] = []
    current: list[str] = []
    fenced = False

    def close() -> None:
        if current:
            blocks.append(" ".join(current))
            current.clear()

    text = re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)
    directive = False  # inside a mkdocstrings ":::" directive: its indented YAML options are no prose
    for line in text.splitlines():
        if _FENCE.match(line):
            close()
            fenced = not fenced
            continue
        stripped = line.strip()
        if not fenced and (stripped.startswith(":::") or (directive and line[:1] in (" ", "\t"))):
            close()
            directive = True
            continue
        directive = False
        if fenced or not stripped or stripped.startswith(("#", "|", "![", "<", "---")):
            close()
            continue
        item = re.match(r"^(\s*)([-*+]|\d+\.)\s+(.*)$", line)
        if item:
            close()
            current.append(item.group(3))
        else:
            current.append(stripped)
        if stripped.endswith(":"):
            close()
    close()
    return blocks


def _sentences_of(block: str) -> list[tuple[int, str]]:
    """The sentences of one prose block: (length in words, text as written)."""
    # Inline code may hold a "." that would end a sentence: each code span becomes one placeholder word
    # while the block is split, and is put back into the text afterwards.
    spans = _CODE.findall(block)
    counter = iter(range(len(spans)))
    block = _CODE.sub(lambda _: f"CODE{next(counter)}x", block)
    block = _ABBREV.sub(lambda m: m.group(1), _LINK.sub(r"\1", block))
    found = []
    for sentence in _END.split(block):
        words = [w for w in sentence.split() if re.search(r"\w", w)]
        if words:
            found.append((len(words), _PLACEHOLDER.sub(lambda m: spans[int(m.group(1))], sentence)))
    return found


def sentence_texts(text: str) -> list[tuple[int, str]]:
    """Every prose sentence of a markdown text: (its length in words, its text as written)."""
    return [found for block in _blocks(text) for found in _sentences_of(block)]


def sentences(text: str) -> list[int]:
    """The length in words of every prose sentence of a markdown text."""
    return [n for n, _ in sentence_texts(text)]


def page_sentences(paths: list[Path]) -> dict[str, list[int]]:
    return {str(p): sentences(p.read_text()) for p in paths}


def _p90(values: list[int]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else float(values[0])


def summary(lengths: list[int]) -> tuple[int, float, float]:
    """(sentences, median words, 90th percentile words)."""
    return len(lengths), statistics.median(lengths), _p90(lengths)


def main(argv: list[str]) -> int:
    over = None
    if "--over" in argv:
        at = argv.index("--over")
        over = int(argv[at + 1])
        argv = argv[:at] + argv[at + 2 :]
    paths = [Path(a) for a in argv] or sorted(Path("docs").glob("*.md"))
    pages = page_sentences(paths)
    print(f"{'page':40} {'sentences':>9} {'median':>6} {'p90':>5}")
    for name, lengths in pages.items():
        if lengths:
            n, median, p90 = summary(lengths)
            print(f"{name:40} {n:9d} {median:6.1f} {p90:5.1f}")
    every = [n for lengths in pages.values() for n in lengths]
    n, median, p90 = summary(every)
    print(f"{'all':40} {n:9d} {median:6.1f} {p90:5.1f}")
    if over is not None:
        for path in paths:
            long = [(n, s) for n, s in sentence_texts(path.read_text()) if n > over]
            for n, sentence in long:
                print(f"\n{path} ({n} words): {sentence}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
