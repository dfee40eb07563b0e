"""Refine: regenerate until a Python validator accepts, with its complaint as feedback.

Each iteration sends one batched model call for the drafts the validator still
rejects; accepted drafts leave the loop. Offline by default: a fake model that
makes a few typical JSON mistakes and fixes the one the feedback names.

    python examples/refine.py [--model openai:gpt-4o-mini --base-url URL]
"""
import argparse
import json
import re

import outlines
from outlines import models

PEOPLE = ["Ada Lovelace, 36", "Alan Turing, 41", "Grace Hopper, 85", "Edsger Dijkstra, 72", "Barbara Liskov, 84"]


@outlines.prompt
def extract(person, feedback, rounds):
    """Write {"name": <string>, "age": <integer>} as JSON for: {{ person }}
    {% if rounds %}Your last draft was rejected: {{ feedback }}. Fix it.{% endif %}"""


@outlines.fn
def validate(draft):
    """The validator: an empty string accepts, anything else says what is wrong."""
    try:
        value = json.loads(draft)
    except json.JSONDecodeError as exc:
        return f"invalid JSON: {exc.msg}"
    if set(value) != {"name", "age"}:
        return f"keys must be name and age, got {sorted(value)}"
    return "" if isinstance(value["age"], int) else "age must be an integer"


rejected = outlines.fn(lambda draft, feedback, rounds: feedback != "", name="rejected")


def sloppy_writer(prompts):
    """The offline fake: its first drafts carry mistakes; it fixes what the feedback names."""
    drafts = []
    for prompt in prompts:
        name, age = re.search(r"for: (.*), (\d+)", prompt).groups()
        feedback = re.search(r"rejected: (.*)\. Fix it", prompt)
        mistakes = {"quotes", "string age"} if len(name) % 2 else {"string age"} if len(name) % 3 else set()
        if feedback:
            mistakes = set() if "integer" in feedback.group(1) else {"string age"}
        age_text = f'"{age}"' if "string age" in mistakes else age
        drafts.append(f"{{name: '{name}', age: {age_text}}}" if "quotes" in mistakes else
                      f'{{"name": "{name}", "age": {age_text}}}')
    return drafts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="function", help="function | openai:NAME")
    parser.add_argument("--base-url", default=None)
    args = parser.parse_args()
    if args.model.startswith("openai:"):
        llm = models.openai(args.model[7:], base_url=args.base_url, max_tokens=64, temperature=0.7)
    else:
        llm = models.from_function(sloppy_writer, batched=True, name="sloppy_writer")

    @outlines.chain
    def refine(person):
        def attempt(draft, feedback, rounds):
            draft = llm(extract(person, feedback, rounds))
            return draft, validate(draft), rounds + "|"

        return outlines.while_loop(rejected, attempt, init=("", "no draft yet", ""), max_iter=5)

    with outlines.trace() as trace:
        drafts, feedback, rounds = refine(PEOPLE)
    for person, draft, complaint, count in zip(PEOPLE, drafts, feedback, rounds):
        print(f"{person:20s} {len(count)} draft(s) -> {draft if not complaint else 'REJECTED: ' + complaint}")
    print("drafts sent per iteration:", [r.active for r in trace.iterations])


if __name__ == "__main__":
    main()
