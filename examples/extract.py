"""Extract a typed record from 50 short texts, every output valid by construction.

Each text becomes a ``Person`` (a pydantic class): the model decodes under its
JSON schema (token masks from xgrammar), all 50 prompts in batched forward
passes, and the values come back parsed. Offline: the default model is the
tiny random test model (gibberish names, valid records); pass ``--model`` a
folder with a real instruct model for real extractions.

    python examples/extract.py [--model PATH] [--max-tokens 48]
"""
from __future__ import annotations

import argparse
from typing import Literal

import pydantic

import outlines
from outlines import models

CITIES = ["Paris", "Lagos", "Lima", "Osaka", "Oslo"]
NAMES = ["Ada", "Bola", "Chen", "Dana", "Emil", "Femi", "Gita", "Hugo", "Ines", "Jon"]


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)
    city: Literal["Paris", "Lagos", "Lima", "Osaka", "Oslo"]


@outlines.prompt
def extract(text):
    """Extract the person's name, age and city as JSON.
    Text: {{ text }}
    JSON:"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a transformers model folder (default: the tiny test model)")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    if args.model is None:
        from outlines.testing import build_tiny_model

        args.model = build_tiny_model()
    llm = models.transformers(args.model, device="cpu", max_tokens=args.max_tokens, temperature=0)
    texts = [f"{NAMES[i % 10]} is {20 + i} and lives in {CITIES[i % 5]}." for i in range(50)]
    text = outlines.string("text")
    record = outlines.text.function(extract, llm, Person)(text)
    with outlines.trace() as trace:
        people = record.eval({text: texts}, errors="return", progress=False)
    valid = sum(isinstance(p, Person) for p in people)
    print(f"valid: {valid}/{len(people)}")
    for text, person in list(zip(texts, people))[:3]:
        print(f"{text!r} -> {person!r}")
    print(f"backend calls: {len(trace.batches)}")


if __name__ == "__main__":
    main()
