"""Labels on a raw few-shot prompt: how many of 20 texts SmolLM2 labels right, by way of asking.

The 20 labelled texts and the few-shot header are ``tests/fixtures/labels.json``
(``tests.fixtures.labels``);
each prompt ends in ``"Text: ... ->"`` and the model runs with ``chat=False``,
greedy. The same prompts are asked four ways, in one schedule: ``choices=`` the
labels, ``regex=`` their alternation, ``choices=`` the labels written with a
leading space (the workaround users found), and free text cut at the line's
end (its first word compared). Prints each way's score and the labels it gave.

    python benchmarks/bench_labels.py

The token boundary: after ``->`` the model writes the next word with its
space, as one token (``" food"``). Before ``Constraint.spaced`` the masks of
``choices=``/``regex=`` forbade that token and the rows drifted to the labels
whose first letters the model would write without a space (issue 29, item 9).
"""
from __future__ import annotations

import collections
import time

import _compat  # noqa: E402,F401  # the measured tree (OUTLINES_BENCH_TREE), first on sys.path

import outlines  # noqa: E402
from outlines import models  # noqa: E402
from outlines.testing import smollm2_gguf  # noqa: E402
from tests.fixtures.labels import prompts_and_labels  # noqa: E402


def main() -> None:
    prompts, gold, labels = prompts_and_labels()
    llm = models.transformers(smollm2_gguf(), chat=False, max_tokens=8, temperature=0)
    ways = {
        "choices=labels": llm(prompts, choices=labels),
        "regex=(a|b|...)": llm(prompts, regex="(" + "|".join(labels) + ")"),
        "choices=' '+labels": llm(prompts, choices=[" " + label for label in labels]),
        "free text, first word": llm(prompts, stop="\n"),
    }
    start = time.perf_counter()
    values = outlines.eval(*ways.values(), cache=False, progress=False)
    print(f"SmolLM2-135M-Instruct, chat=False, greedy, {len(prompts)} prompts ending in '->' "
          f"({time.perf_counter() - start:.1f} s for the four ways)")
    for name, outputs in zip(ways, values):
        words = [(text.split() or [""])[0] for text in outputs]
        right = sum(word == label for word, label in zip(words, gold))
        print(f"  {name:<24} {right:>2}/{len(gold)}  {dict(sorted(collections.Counter(words).items()))}")


if __name__ == "__main__":
    main()
