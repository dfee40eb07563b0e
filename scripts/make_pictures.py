"""Make the README's pictures: the self-consistency graph and its timeline.

Runs offline on a fake model (``models.from_function``) whose calls take a few
milliseconds, so the timeline shows real batching and concurrency. Writes into
docs/images/ (or the folder given):

    self_consistency_graph.svg     the graph, before it runs (needs Graphviz `dot`)
    self_consistency_trace.svg     the same graph after a run: times, batches, cache
    self_consistency_timeline.svg  what ran when (the chart Trace.timeline draws)
    self_consistency_graph.mmd     the graph as mermaid text (no dependency)

Usage: .venv/bin/python scripts/make_pictures.py [folder]
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import pathlib
import sys

import outlines
from outlines import models
from outlines.graph.timeline import write_timeline

QUESTIONS = ["What is 17 * 3?", "What is 12 + 30?", "What is 100 / 4?", "What is 9 * 9?"]


async def fake_reasoner(prompts: list[str]) -> list[str]:
    """A batched fake LLM: a few ms per call, a plausible answer per prompt."""
    await asyncio.sleep(0.02 + 0.004 * len(prompts))
    return [f"... so the answer is {int(hashlib.sha256(p.encode()).hexdigest(), 16) % 3 + 50}." for p in prompts]


async def fake_extractor(prompt: str) -> str:
    """A fake small model that pulls the final number out of the reasoning."""
    await asyncio.sleep(0.005)
    return prompt.rsplit("answer is", 1)[-1].split(".")[0].strip()


@outlines.prompt
def solve(question):
    """Q: {{ question }}
    A: Let's think step by step."""


@outlines.prompt
def extract(reasoning):
    """Reasoning: {{ reasoning }}
    The final answer, as a number only:"""


@outlines.fn(signature="(n)->()")
def majority(answers):
    return collections.Counter(answers).most_common(1)[0][0]


def self_consistency(question):
    reasoner = models.from_function(fake_reasoner, batched=True, max_batch=8, name="reasoner", temperature=0.7)
    extractor = models.from_function(fake_extractor, name="extractor", max_concurrency=8, temperature=0)
    reasoning = reasoner(solve(question), num_samples=5)
    return majority(extractor(extract(reasoning)))


def main(folder: pathlib.Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    program = outlines.compile(self_consistency, cache=False)
    outlines.visualize(program, filename=str(folder / "self_consistency_graph.svg"))
    outlines.visualize(program, filename=str(folder / "self_consistency_graph.mmd"))
    with outlines.trace() as trace:
        answers = program(QUESTIONS)
    print(trace.summary())
    print("answers:", list(answers))
    outlines.visualize(program, filename=str(folder / "self_consistency_trace.svg"), trace=trace)
    write_timeline(trace, folder / "self_consistency_timeline.svg")
    for path in sorted(folder.glob("self_consistency_*")):
        print("wrote", path)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "docs" / "images")
