"""OpenAI-compatible backends side by side with the official client and LangChain.

Against a loopback fake server (tests/fixtures/fake_openai.py, run in its own
process so client CPU time is measured alone) answering after 100 ms:

1. 1,000 completion prompts: outlines ``openai_completion`` (prompt lists of
   ``max_batch``) vs ``openai.AsyncOpenAI`` + ``asyncio.gather`` (one request
   per prompt) vs LangChain ``OpenAI.abatch``; wall time as a multiple of one
   single-prompt request, and requests sent.
2. 1,000 chat prompts at max_concurrency 100: outlines ``openai`` vs
   ``AsyncOpenAI`` bounded by a semaphore, and bare aiohttp (the floor this
   machine's loopback and fake server allow); wall vs the ideal 10 x latency,
   and client CPU time per request. Best of ``--repeat`` runs.

Run: ``.venv/bin/python benchmarks/bench_openai.py [--prompts 1000] [--latency 0.1]``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
import warnings
from typing import Any, Awaitable, Callable

from _compat import ROOT  # noqa: E402  # the measured tree (OUTLINES_BENCH_TREE), first on sys.path

import outlines  # noqa: E402
from outlines import models  # noqa: E402

KEY = "sk-bench"


class Server:
    """The fake server in a child process (``flags``: more of its command-line options)."""

    def __init__(self, latency: float, *flags: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-m", "tests.fixtures.fake_openai", "--latency", str(latency), *flags]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        assert self.process.stdout is not None
        self.base_url = self.process.stdout.readline().strip()
        if not self.base_url.startswith("http://127.0.0.1:"):
            raise RuntimeError("the fake server did not start")

    def stats(self, reset: bool = True) -> dict[str, int]:
        url = self.base_url.replace("/v1", "/stats") + ("?reset=1" if reset else "")
        with urllib.request.urlopen(url, timeout=10) as response:
            return dict(json.loads(response.read()))

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def measure(server: Server, run: Callable[[], Any]) -> dict[str, float]:
    """Wall and CPU seconds of ``run()``, and the requests the server saw."""
    server.stats(reset=True)
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stats = server.stats(reset=True)
    return {"wall": wall, "cpu": cpu, "requests": stats["count"], "peak": stats["max_in_flight"]}


def in_loop(make: Callable[[], Awaitable[Any]]) -> Callable[[], Any]:
    return lambda: asyncio.run(make())


def completions(server: Server, prompts: list[str], max_batch: int) -> dict[str, dict[str, float]]:
    import openai
    from langchain_community.llms import OpenAI as LangChainOpenAI

    llm = models.openai_completion("bench", base_url=server.base_url, api_key=KEY, max_tokens=8,
                                   temperature=0.7, max_batch=max_batch)
    prompt = outlines.string("prompt")
    graph = llm(prompt)

    async def official() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
        async with client:
            responses = await asyncio.gather(*(
                client.completions.create(model="bench", prompt=p, max_tokens=8, temperature=0.7) for p in prompts
            ))
        return [r.choices[0].text for r in responses]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chain = LangChainOpenAI(model="bench", base_url=server.base_url, api_key=KEY, max_tokens=8, temperature=0.7)

    single = min((measure(server, lambda: llm("one prompt").eval(cache=False)) for _ in range(3)),
                 key=lambda m: m["wall"])
    rows = {"one single-prompt request": single}
    rows["outlines openai_completion"] = measure(server, lambda: graph.eval({prompt: prompts}, cache=False))
    rows["openai AsyncOpenAI + gather"] = measure(server, in_loop(official))
    async def langchain() -> list[str]:
        try:
            return await chain.abatch(prompts)
        finally:
            await chain.async_client._client.close()  # else httpx closes it after the loop is gone

    rows["LangChain OpenAI.abatch"] = measure(server, in_loop(langchain))
    return rows


def chats(server: Server, prompts: list[str], concurrency: int, repeat: int) -> dict[str, dict[str, float]]:
    import aiohttp
    import openai

    llm = models.openai("bench", base_url=server.base_url, api_key=KEY, max_tokens=8, temperature=0.7,
                        max_concurrency=concurrency)
    prompt = outlines.string("prompt")
    graph = llm(prompt)

    async def official() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
        limit = asyncio.Semaphore(concurrency)

        async def one(text: str) -> str:
            async with limit:
                response = await client.chat.completions.create(
                    model="bench", messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0.7
                )
            return response.choices[0].message.content or ""

        async with client:
            return await asyncio.gather(*(one(p) for p in prompts))

    async def raw_aiohttp() -> list[Any]:
        limit = asyncio.Semaphore(concurrency)
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(text: str) -> Any:
                body = {"model": "bench", "messages": [{"role": "user", "content": text}], "max_tokens": 8}
                async with limit, session.post(server.base_url + "/chat/completions", json=body) as response:
                    return await response.json()

            return await asyncio.gather(*(one(p) for p in prompts))

    def best(run: Callable[[], Any]) -> dict[str, float]:
        return min((measure(server, run) for _ in range(repeat)), key=lambda m: m["wall"])

    return {
        "outlines openai (chat)": best(lambda: graph.eval({prompt: prompts}, cache=False)),
        "openai AsyncOpenAI + semaphore": best(in_loop(official)),
        "raw aiohttp + semaphore (floor)": best(in_loop(raw_aiohttp)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--max-batch", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3, help="chat runs per client; the best is shown")
    args = parser.parse_args()
    prompts = [f"Question {i}: what is {i} + {i}?" for i in range(args.prompts)]
    server = Server(args.latency)
    try:
        first = completions(server, prompts, args.max_batch)
        second = chats(server, prompts, args.concurrency, args.repeat)
    finally:
        server.close()

    one = first["one single-prompt request"]["wall"]
    print(f"\n{args.prompts} completion prompts, {args.latency * 1000:.0f} ms latency, max_batch {args.max_batch} "
          f"(expected {math.ceil(args.prompts / args.max_batch)} requests)")
    print(f"{'':32} {'wall s':>8} {'x one request':>14} {'requests':>9} {'CPU ms':>8}")
    for name, row in first.items():
        print(f"{name:32} {row['wall']:8.3f} {row['wall'] / one:14.2f} {row['requests']:9d} {row['cpu'] * 1e3:8.0f}")
    ours = first["outlines openai_completion"]["wall"]
    for name in ("openai AsyncOpenAI + gather", "LangChain OpenAI.abatch"):
        print(f"  {name} / outlines: {first[name]['wall'] / ours:.2f}x wall")

    ideal = math.ceil(args.prompts / args.concurrency) * args.latency
    print(f"\n{args.prompts} chat prompts at max_concurrency {args.concurrency} (ideal {ideal:.2f} s)")
    print(f"{'':32} {'wall s':>8} {'x ideal':>8} {'requests':>9} {'peak':>5} {'CPU ms/request':>15}")
    for name, row in second.items():
        per_request = row["cpu"] / max(row["requests"], 1) * 1e3
        print(f"{name:32} {row['wall']:8.3f} {row['wall'] / ideal:8.2f} {row['requests']:9d} "
              f"{row['peak']:5d} {per_request:15.3f}")
    ours_cpu = second["outlines openai (chat)"]["cpu"]
    theirs_cpu = second["openai AsyncOpenAI + semaphore"]["cpu"]
    floor = second["raw aiohttp + semaphore (floor)"]["wall"]
    print(f"  CPU per request, outlines / AsyncOpenAI: {ours_cpu / theirs_cpu:.2f}")
    print(f"  wall, outlines / raw aiohttp floor on this machine: {second['outlines openai (chat)']['wall'] / floor:.2f}")


if __name__ == "__main__":
    main()
