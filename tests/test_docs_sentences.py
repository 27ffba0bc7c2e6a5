"""Plain sentences: on each page listed here, the median sentence is at most 20 words and the 90th
percentile at most 35.

``tools/sentence_lengths.py`` counts (its docstring says what a sentence is). ``PAGES`` lists the pages
rewritten to hold the limits; add a page once it does. The counter's own rules are checked on text whose
sentences were counted by hand, so that a change to it cannot make a page pass by miscounting.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MEDIAN_MAX = 20  # words
P90_MAX = 35  # words
PAGES = [
    "docs/index.md",
    "docs/hooks.md",
    "docs/lifecycle.md",
    "docs/disaggregated.md",
    "docs/server.md",
    "docs/sglang.md",
    "docs/transformers.md",
    "docs/fleet.md",
    "docs/configuration.md",
    "docs/telemetry.md",
    "docs/demo.md",
    "docs/operations.md",
    "docs/vllm.md",
    "docs/development.md",
    "docs/install.md",
    "docs/compatibility.md",
]


def _counter():
    spec = importlib.util.spec_from_file_location("sentence_lengths", ROOT / "tools" / "sentence_lengths.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sentence_lengths = _counter()


def over_the_limits(text: str) -> str | None:
    """What breaks the limits on a page's text, with its longest sentences; None when it keeps them."""
    lengths = sentence_lengths.sentences(text)
    if not lengths:
        return None
    n, median, p90 = sentence_lengths.summary(lengths)
    if median <= MEDIAN_MAX and p90 <= P90_MAX:
        return None
    longest = sorted(sentence_lengths.sentence_texts(text), key=lambda found: -found[0])[:5]
    told = "\n".join(f"  {words} words: {sentence}" for words, sentence in longest)
    return (
        f"{n} sentences, median {median} words (at most {MEDIAN_MAX}), 90th percentile {p90} words "
        f"(at most {P90_MAX}); the longest:\n{told}"
    )


@pytest.mark.parametrize("page", PAGES)
def test_a_rewritten_page_keeps_its_sentences_short(page: str) -> None:
    said = over_the_limits((ROOT / page).read_text())
    assert said is None, f"{page}: {said}"


def test_a_page_of_long_sentences_breaks_the_limits() -> None:
    long = " ".join(["word"] * 40) + "."
    page = "# A page\n\n" + "\n\n".join([long] * 3 + ["A short one here."] * 2) + "\n"
    said = over_the_limits(page)
    assert said is not None and "40 words" in said


# Counted by hand: each sentence's words, inline code as one word, a link as the words of its text.
PROSE = """# A heading, not prose

The tracker records numbers. **Hooks never block.** They return at once (even when stuck.) vLLM
counts the same. It took 5 s. 4.7 s later it ended. See [the lifecycle](lifecycle.md) for `F - A`,
e.g. time to first token... and more.

- A list item ends a sentence
- `otel-llm view` draws it:

```python
print("code is not prose. Not at all.")
```

| a table | is not prose either. |
|---|---|

::: otel_llm.tracker.RequestTracker
    options:
      members:
        - queued
"""
BY_HAND = [4, 3, 7, 4, 4, 5, 12, 6, 3]


def test_the_counter_splits_where_a_reader_would() -> None:
    assert sentence_lengths.sentences(PROSE) == BY_HAND
