"""A ReAct agent (Yao et al., 2022) over 20 questions as ONE batched loop.

Each iteration asks the model for the next step of every unfinished
trajectory in one backend call, runs the tools (a calculator, a lookup table)
in Python, and drops the trajectories that reached a final answer. Offline by
default with a deterministic fake model; a second run replays from the cache.

    python examples/agent.py [--model openai:gpt-4o-mini --base-url URL]
"""
import argparse
import operator
import re

import outlines
from outlines import models

FACTS = {"Hamlet": "1600", "the Eiffel Tower": "1889", "Python": "1991", "the Moon landing": "1969"}
TOPICS = list(FACTS)
QUESTIONS = [f"What is {7 + i} * {3 + i}?" for i in range(6)] + [f"In what year was {t} made?" for t in TOPICS] + [
    f"How many years passed between {t} and 2024?" for t in TOPICS] + ["Say hello."] + [
    f"What is {40 + i} + {2 * i}?" for i in range(5)]


@outlines.prompt
def react(question, transcript):
    """Answer with one line: `Action: calculator[a op b]`, `Action: lookup[topic]` or `Final Answer: ...`.
    Question: {{ question }}
    {{ transcript }}"""


@outlines.fn
def act(step):
    """Run the tool the step asks for; its observation joins the transcript."""
    found = re.search(r"Action: (\w+)\[(.*?)\]", step)
    if not found:
        return step.strip() + "\n"
    tool, argument = found.groups()
    if tool == "calculator":
        a, op, b = re.fullmatch(r"\s*(\d+)\s*([-+*])\s*(\d+)\s*", argument).groups()
        result = str({"+": operator.add, "-": operator.sub, "*": operator.mul}[op](int(a), int(b)))
    else:
        result = FACTS.get(argument, "unknown")
    return f"Action: {tool}[{argument}]\nObservation: {result}\n"


running = outlines.fn(lambda transcript: "Final Answer:" not in transcript, name="running")
final_answer = outlines.fn(lambda transcript: transcript.rsplit("Final Answer:", 1)[-1].strip(), name="final_answer")


def fake_react(prompts):
    """The offline model: a fixed policy that reads the question and the observations so far."""
    return [next_step(p) for p in prompts]


def next_step(prompt):
    question = re.search(r"Question: (.*)", prompt).group(1)
    seen = re.findall(r"Observation: (.*)", prompt)
    topic = next((t for t in TOPICS if t in question), None)
    if topic and not seen:
        return f"Action: lookup[{topic}]"
    if "between" in question and len(seen) == 1:
        return f"Action: calculator[2024 - {seen[0]}]"
    numbers = re.findall(r"\d+", question)
    if len(numbers) == 2 and not seen and not topic:
        return f"Action: calculator[{numbers[0]} {'*' if '*' in question else '+'} {numbers[1]}]"
    return f"Final Answer: {seen[-1] if seen else 'hello'}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="function", help="function | openai:NAME")
    parser.add_argument("--base-url", default=None)
    args = parser.parse_args()
    if args.model.startswith("openai:"):
        llm = models.openai(args.model[7:], base_url=args.base_url, max_tokens=64, temperature=0)
    else:
        llm = models.from_function(fake_react, batched=True, name="fake_react")

    @outlines.chain
    def agent(question):
        step = lambda transcript: transcript + act(llm(react(question, transcript), stop=["\nObservation:"]))  # noqa: E731
        return final_answer(outlines.while_loop(running, step, init="", max_iter=6))

    with outlines.trace() as trace:
        answers = agent(QUESTIONS)
    for question, answer in zip(QUESTIONS, answers):
        print(f"{question:58s} -> {answer}")
    for record in trace.iterations:
        print(f"iteration {record.iteration}: {record.active} trajectories, {record.batches} backend call(s)")
    print(f"backend calls: {len(trace.batches)}; cache: {trace.cache_hits} hit(s), {trace.cache_misses} miss(es)")


if __name__ == "__main__":
    main()
