"""Self-consistency (Wang et al., 2022): sample k reasoning paths, parse, majority vote.

Runs offline on a tiny local GPT-2 by default (built on the first run): its
answers are gibberish, but the batching, caching and tracing are real. A second
run replays every draw from the cache.

    python examples/self_consistency.py [-k 8] [--model transformers:PATH]
    python examples/self_consistency.py --model openai:gpt-4o-mini --base-url URL
    python examples/self_consistency.py --model function   # a deterministic fake
"""
import argparse
import collections
import math
import os
import re
import tempfile

import outlines
from outlines import models

QUESTIONS = ["What is 17 * 3?", "Tom has 12 apples and buys 30 more. How many apples does he have?",
             "A box holds 4 rows of 6 eggs. How many eggs are in 3 boxes?"]


@outlines.prompt
def solve(question):
    """Q: {{ question }}
    A: Let's think step by step."""


@outlines.fn
def parse_answer(completion):
    numbers = re.findall(r"-?\d+", completion)
    return numbers[-1] if numbers else "?"


@outlines.fn(signature="(n)->()")
def majority(answers):
    votes = collections.Counter(a for a in answers if a != "?")
    return votes.most_common(1)[0][0] if votes else "?"


def arithmetic(prompt):
    """The offline fake: adds or multiplies the question's numbers, showing its work."""
    question = prompt.split("A:")[0]
    numbers = [int(n) for n in re.findall(r"\d+", question)]
    adding = re.search(r"\+|more", question)
    result = sum(numbers) if adding else math.prod(numbers)
    return f" {(' + ' if adding else ' * ').join(map(str, numbers))} = {result}. The answer is {result}."


def load_model(spec, base_url):
    kind, _, name = spec.partition(":")
    if kind == "transformers":
        from outlines.testing import build_tiny_model  # first run: ~2 s, into $OUTLINES_CACHE_DIR

        return models.transformers(name or build_tiny_model(), max_tokens=48, temperature=0.8, seed=0)
    if kind == "openai":
        return models.openai(name or "gpt-4o-mini", base_url=base_url, max_tokens=160, temperature=0.7)
    if kind == "function":
        return models.from_function(arithmetic, name="arithmetic")
    raise SystemExit(f"unknown --model {spec!r}: use transformers[:PATH], openai:NAME or function")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformers", help="transformers[:PATH] | openai:NAME | function")
    parser.add_argument("--base-url", default=None, help="OpenAI-compatible API root (with openai:NAME)")
    parser.add_argument("-k", type=int, default=8, help="reasoning paths sampled per question")
    parser.add_argument("--out", default=tempfile.gettempdir(), help="folder for the graph picture and timeline")
    args = parser.parse_args()

    llm = load_model(args.model, args.base_url)
    program = outlines.compile(lambda question: majority(parse_answer(llm(solve(question), num_samples=args.k))))
    with outlines.trace() as trace:
        answers = program(QUESTIONS)
    for question, answer in zip(QUESTIONS, answers):
        print(f"{question:70s} -> {answer}")
    print(trace.summary())
    timeline, picture = (os.path.join(args.out, f"self_consistency{ext}") for ext in (".html", ".svg"))
    trace.timeline(timeline)
    try:
        program.visualize(filename=picture, trace=trace)
    except (ImportError, RuntimeError):  # no graphviz or no `dot`: mermaid text needs neither
        picture = picture[:-4] + ".mmd"
        program.visualize(filename=picture, format="mermaid", trace=trace)
    print(f"graph picture: {picture}\ntimeline: {timeline}")


if __name__ == "__main__":
    main()
