"""Constrained against unconstrained decoding on 64 prompts, same model, same batches.

Runs the 64 prompts free, then under a JSON schema, a regex and a choice list,
each in one schedule (batched by the scheduler, masks applied per row), and
prints wall time, generated tokens and the overhead per generated token.

    python benchmarks/bench_structured.py [--model PATH] [--max-tokens 32] [--repeat 2]
                                          [--peer-python VENV/bin/python]

With ``--peer-python`` (a virtualenv with ``pip install outlines transformers``
from the registry), current Outlines decodes the same 64 prompts under the
same JSON schema greedily (``benchmarks/_structured_peer.py``), side by side
with this package at ``temperature=0``, and the ratio is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from typing import Any

import outlines
from outlines import models

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0,
                                                                          "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def timed(variable: Any, repeat: int) -> tuple[float, int]:
    best, tokens = float("inf"), 0
    for _ in range(repeat):
        with outlines.trace() as trace:
            start = time.perf_counter()
            outlines.eval(variable, cache=False, progress=False)
            best = min(best, time.perf_counter() - start)
        tokens = trace.tokens[1]
    return best, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a transformers model folder (default: the tiny test model)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--peer-python", help="python of a virtualenv holding outlines from PyPI")
    args = parser.parse_args()
    if args.model is None:
        from outlines.testing import build_tiny_model

        args.model = build_tiny_model()
    llm = models.transformers(args.model, device="cpu", max_tokens=args.max_tokens, seed=0)
    prompts = [f"Record {i}: a person, as JSON." for i in range(64)]
    outlines.eval(llm(prompts[:2], json_schema=SCHEMA), cache=False, progress=False)  # load + compile once
    cases = {
        "free": llm(prompts),
        "json_schema": llm(prompts, json_schema=SCHEMA),
        "regex": llm(prompts, regex=r"[0-9]{3}-[a-z]{4}"),
        "choices": llm(prompts, choices=["red", "green", "blue"]),
    }
    print(f"64 prompts, max_tokens={args.max_tokens}, best of {args.repeat}")
    print(f"{'case':12} {'seconds':>8} {'tokens':>7} {'ms/token':>9} {'overhead/token':>15}")
    base = None
    for name, variable in cases.items():
        seconds, tokens = timed(variable, args.repeat)
        per_token = seconds / max(tokens, 1) * 1e3
        base = per_token if base is None else base
        print(f"{name:12} {seconds:8.2f} {tokens:7d} {per_token:9.3f} {(per_token / base - 1) * 100:14.1f}%")
    if args.peer_python:
        compare(args, llm, prompts)


def compare(args: argparse.Namespace, llm: Any, prompts: list[str]) -> None:
    ours, tokens = timed(llm(prompts, json_schema=SCHEMA, temperature=0), args.repeat)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_structured_peer.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the peer must not see this package
    done = subprocess.run([args.peer_python, script, args.model, json.dumps(SCHEMA), str(args.max_tokens),
                           str(args.repeat)], capture_output=True, text=True, env=env, check=True)
    peer = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"greedy JSON, 64 prompts: outlines (this) {ours:.2f} s, {tokens} tokens; "
          f"outlines {peer['version']} (PyPI) {peer['seconds']:.2f} s, {peer['tokens']} tokens, "
          f"{peer['valid']}/64 parse; ratio PyPI/this {peer['seconds'] / ours:.2f}x")


if __name__ == "__main__":
    main()
