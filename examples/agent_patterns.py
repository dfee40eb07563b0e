"""Which patterns work on a small model: a number, a tool, measured side by side.

The word problems of the main job (``examples/word_problems.json``), greedy,
on SmolLM2-135M-Instruct. The figures of docs/guides/structured-outputs.md
and docs/guides/agents.md come from this script.

A final number (docs/guides/structured-outputs.md), the same prompt each time:

1. number only: ``regex=`` a number straight after the question, where the
   model would start reasoning: the mask keeps digits it never meant;
2. reason, last number: free reasoning, the last number it writes;
3. reason then answer: free reasoning stopped at "The answer is", then a
   second call, conditioned on the reasoning, that may write only a number.

"ended": the number's pattern ends with the mark a model writes after a
number (``.`` or a newline), so that it can stop where it means to.

A calculator tool (docs/guides/agents.md), ``while_loop`` with ``max_iter=4``:

4. tool optional: every step is ``calculator[a op b]`` or ``Final Answer: n``;
5. tool first: the first step must be a calculator call;
6. few-shot, tool first: as 5, after one worked example in the prompt;
7. observed: as 5 or 6, but the answer is the calculator's last result: the
   model's ``Final Answer`` says only that it is done (no copying mistakes).

    python examples/agent_patterns.py [--problems 15] [--model smollm2[:GGUF]]
    python examples/agent_patterns.py --model function    # a deterministic fake: checks the plumbing
"""
import argparse
import os
import re
import time

import outlines
from outlines import models
from word_problems import CALL, EXAMPLE, PROBLEMS, SOLVE, TOOL, act, chatml, observed, observed_answer
from word_problems import parse_answer as last_number

NUMBER = r"-?[0-9]{1,6}"
ENDED = NUMBER + r"[.\n]"  # a number and the mark that ends it: the model can say it is done
MARKER = "The answer is"


working = outlines.fn(lambda transcript: "Final Answer:" not in transcript, name="working")
number = outlines.fn(lambda text: text.rstrip(".\n"), name="number")
final_answer = outlines.fn(lambda t: t.rsplit("Final Answer: ", 1)[1].rstrip(".\n") if "Final Answer: " in t else None,
                           name="final answer")


def reason_then_answer(llm, prompt, answer=ENDED):
    """(reasoning, answer): free text up to the marker, then only a number, conditioned on that text."""
    reasoning = llm(prompt, temperature=0, stop=[MARKER])
    return reasoning, number(llm(prompt + reasoning + MARKER + " ", regex=answer, temperature=0, max_tokens=8))


def agent(llm, prompt, tool_first, answer=ENDED):
    """A calculator agent's transcript: one ``while_loop``; with ``tool_first`` its first step calls the tool."""
    action = CALL + "|Final Answer: " + answer

    def step(transcript):
        if not tool_first:
            return transcript + act(llm(prompt + transcript, regex=action, temperature=0))
        return transcript + act(outlines.cond(observed(transcript),
                                              lambda t: llm(prompt + t, regex=action, temperature=0),
                                              lambda t: llm(prompt + t, regex=CALL, temperature=0), transcript))

    return outlines.while_loop(working, step, init="", max_iter=4, on_max_iter="keep")


def fake(prompt):
    """A deterministic stand-in: reasons, calls the tool, and answers what it computed or observed."""
    question = prompt.rsplit("user\n", 1)[1].split("<|im_end|>")[0]
    a, b = (int(n) for n in re.findall(r"\d+", question)[:2])
    op = next((o for word, o in [("more", "+"), ("gave", "-"), ("left", "-"), ("share", "/")] if word in question), "*")
    result = {"+": a + b, "-": a - b, "/": a // b}.get(op, a * b)
    if prompt.endswith(MARKER + " "):
        return f"{result}."
    if "calculator" not in prompt:
        return f"We compute {a} {op} {b} = {result}. "
    seen = re.findall(r"Observation: (\S+)", prompt.rsplit("user\n", 1)[1])
    return f"Final Answer: {seen[-1]}." if seen else f"calculator[{a} {op} {b}]"


def patterns(llm, question):
    """Each pattern's answer (a Variable of strings, or None where there is none)."""
    solve = outlines.fn(chatml, name="prompt")(SOLVE, question)
    tool = outlines.fn(chatml, name="prompt")(TOOL, question)
    shot = outlines.fn(lambda q: chatml(TOOL, q, [EXAMPLE]), name="few-shot prompt")(question)
    return {
        "number only": llm(solve, regex=NUMBER, temperature=0, max_tokens=8),
        "number only, ended": number(llm(solve, regex=ENDED, temperature=0, max_tokens=8)),
        "reason, last number": last_number(llm(solve, temperature=0)),
        "reason then answer": reason_then_answer(llm, solve, NUMBER)[1],
        "reason then answer, ended": reason_then_answer(llm, solve)[1],
        "tool optional": final_answer(agent(llm, tool, tool_first=False)),
        "tool first": final_answer(agent(llm, tool, tool_first=True, answer=NUMBER)),
        "tool first, ended": final_answer(agent(llm, tool, tool_first=True)),
        "few-shot, tool first, ended": final_answer(agent(llm, shot, tool_first=True)),
        "tool first, observed": observed_answer(agent(llm, tool, tool_first=True)),
        "few-shot, tool first, observed": observed_answer(agent(llm, shot, tool_first=True)),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2[:GGUF] | function")
    parser.add_argument("--problems", type=int, default=15, help="how many of the word problems")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per free call (reasoning, agent step)")
    args = parser.parse_args()
    if args.model == "function":
        llm = models.from_function(fake, name="patterns_fake")
    else:
        from outlines.testing import smollm2_gguf  # names the pip command when missing

        path = args.model.partition(":")[2] or smollm2_gguf()
        llm = models.transformers(path, chat=False, max_tokens=args.max_tokens)
    problems = PROBLEMS[: args.problems]
    truths = [str(p["answer"]) for p in problems]
    print(f"{'truth':48s}  [{', '.join(truths)}]")
    question = outlines.string("question")
    print(f"{'pattern':32s} {'right':>7s} {'calls':>6s} {'wall s':>7s}  answers")
    with outlines.trace() as trace:
        for name, answer in patterns(llm, question).items():
            start, before = time.perf_counter(), len(trace.batches)
            answers = answer.eval({question: [p["question"] for p in problems]}, errors="return")
            loaded = sum(m.end - m.start for m in trace.model_loads if m.start >= start - trace.origin)  # trace times
            wall = time.perf_counter() - start - loaded
            right = sum(a == t for a, t in zip(answers, truths))
            failed = sum(isinstance(a, outlines.Failure) for a in answers)
            shown = ", ".join("-" if a is None or isinstance(a, outlines.Failure) else a for a in answers)
            print(f"{name:32s} {right:>3d}/{len(problems):<3d} {len(trace.batches) - before:>6d} {wall:>7.1f}  "
                  f"[{shown}]" + (f" ({failed} failed)" if failed else ""))
    print(f"\nload average {os.getloadavg()[0]:.1f}; {args.model}, greedy, max_tokens={args.max_tokens}")
    print(trace.summary())


if __name__ == "__main__":
    main()
