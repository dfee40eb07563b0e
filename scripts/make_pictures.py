"""Make the README's pictures from examples/self_consistency.py's graph.

Builds the example's program with its offline ``--model function`` fake (a
deterministic arithmetic "model"; nothing is sent anywhere), runs it once on
the example's questions under ``outlines.trace()``, and writes into
docs/images/ (or the folder given):

    self_consistency_graph.svg     the graph, before it runs (needs Graphviz `dot`)
    self_consistency_graph.mmd     the same as mermaid text (needs nothing)
    self_consistency_trace.svg     the graph after the run: times, batches, cache
    self_consistency_timeline.svg  what ran when (the chart Trace.timeline draws)

Usage: .venv/bin/python scripts/make_pictures.py [folder] [-k SAMPLES]
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
from types import ModuleType

import outlines
from outlines.graph.viz.timeline import write_timeline

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("self_consistency", ROOT / "examples" / "self_consistency.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(folder: pathlib.Path, samples: int = 8) -> list[pathlib.Path]:
    """Write the pictures into ``folder``; return their paths."""
    example = load_example()
    llm = example.load_model("function", None)

    def self_consistency(question):  # the example's program, spelled the same way
        return example.majority(example.parse_answer(llm(question, num_samples=samples)))

    program = outlines.compile(self_consistency, cache=False)
    folder.mkdir(parents=True, exist_ok=True)
    outlines.visualize(program, filename=str(folder / "self_consistency_graph.svg"))
    outlines.visualize(program, filename=str(folder / "self_consistency_graph.mmd"))
    with outlines.trace() as trace:
        program([q for q, _ in example.PROBLEMS[:3]])
    outlines.visualize(program, filename=str(folder / "self_consistency_trace.svg"), trace=trace)
    write_timeline(trace, folder / "self_consistency_timeline.svg")
    return sorted(folder.glob("self_consistency_*"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=pathlib.Path, default=ROOT / "docs" / "images")
    parser.add_argument("-k", type=int, default=8, help="reasoning paths sampled per question")
    args = parser.parse_args()
    for path in main(args.folder, args.k):
        print("wrote", path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
