"""The peer side of bench_structured.py: current Outlines (PyPI) on the same 64 prompts.

Runs inside a separate virtualenv holding ``outlines`` from the registry (the
import names collide with this package); prints one JSON line.
"""
from __future__ import annotations

import json
import sys
import time

import outlines
from outlines.types import JsonSchema
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    path, schema, max_tokens, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = outlines.from_transformers(AutoModelForCausalLM.from_pretrained(path), tokenizer)
    prompts = [f"Record {i}: a person, as JSON." for i in range(64)]
    output_type = JsonSchema(schema)
    model.batch(prompts[:2], output_type, max_new_tokens=max_tokens)  # compile once
    best, texts = float("inf"), []
    for _ in range(repeat):
        start = time.perf_counter()
        texts = model.batch(prompts, output_type, max_new_tokens=max_tokens)
        best = min(best, time.perf_counter() - start)
    valid = 0
    for text in texts:
        try:
            json.loads(text)
            valid += 1
        except ValueError:
            pass
    tokens = sum(len(tokenizer(t)["input_ids"]) for t in texts)
    print(json.dumps({"seconds": best, "tokens": tokens, "valid": valid, "version": outlines.__version__
                      if hasattr(outlines, "__version__") else "?"}))


if __name__ == "__main__":
    main()
