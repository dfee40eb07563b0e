"""HuggingFace causal language models, generating in batches with left padding.

A model is loaded once per process (the registry below, keyed by path, device
and dtype) and shared by every backend that names it. Each loaded model has one
worker thread: generation runs there, off the event loop, one batch at a time.
A thread rather than a process: torch releases the GIL inside its kernels, so
the loop keeps serving HTTP branches and Python ops while a batch runs. On the
tiny model (benchmarks/bench_transformers.py, 2 busy cores) a 64-prompt batch
took 0.049 s in the thread and 0.048 s in a one-process pool, whose start cost
3-7 s and a second copy of the model; the pool's only gain was a lower worst
event-loop lag (10 ms against 30 ms). Nothing is pickled per call either.

Batches: draws of one prompt become ``num_return_sequences``; prompts are
ordered by shared head (``prefix_order``) and split under ``max_batch_tokens``
(``plan_chunks``); a CUDA out-of-memory error retries the chunk in halves,
down to one prompt. The defaults come from the machine (``TransformersBackend``'s
``dtype``, ``max_batch`` and ``max_batch_tokens``; the resolved dtype is part of
the repr, the trace and the cache identity): on the main job's SmolLM2
(2 cores with AVX512-BF16) bfloat16 gives 3.2x the completion tokens/s of
float32 in batches of 32 (benchmarks/bench_transformers_defaults.py).

Seeds: every sampled token comes from a counter-based stream keyed by
(seed, prompt, draw number), so a draw's text does not depend on the other
prompts of its batch. With ``seed=None`` a fresh random salt is used per
call; with an integer seed, the same (seed, prompt, draw, params) always gives
the same text on the same model, device and dtype. ``temperature=0`` is greedy.

Prefix sharing: the draws of one prompt prefill it once and copy its key/value
cache to each sample; a chunk's common head, and each group of its prompts
that share ``group_min_tokens`` more (``prefix.prefix_groups``), are prefilled
once (``_hf_generation.prefix_layout``); the tokens copied rather than computed
are reported as cached (``BatchReport.usage``). Cancelling the awaiting task
(Ctrl-C) stops the generation loop at its next decoding step.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from outlines.backends.base import Backend, BackendError, BatchReport, check_limit
from outlines.draws import Constraint, Draw, GenerationParams, pack, prefix_groups
from outlines.common.conversation import Conversation, messages_of
from outlines.common.errors import install_hint

__all__ = ["TransformersBackend", "plan_chunks", "prefix_order", "trim_at_stop"]

DEFAULT_MAX_TOKENS = 256
#: The shortest head a group of a chunk's prompts must share, past the chunk's common
#: prefix, to be prefilled once for the group (``group_min_tokens``).
MIN_GROUP_HEAD = 16
#: ``extra`` parameters the backend understands; OpenAI-only ones are refused.
SUPPORTED_EXTRA = ("top_k", "repetition_penalty", "no_repeat_ngram_size")
#: ``max_batch`` when it is not given: the most rows of one forward batch (the memory budget
#: may allow fewer) and draws per call, by device kind. Past a CPU's compute, more rows only
#: make each batch's results wait longer; a GPU keeps gaining further.
AUTO_MAX_BATCH = {"cpu": 128, "mps": 128, "cuda": 256}
#: The CPU flags (``/proc/cpuinfo``) of native bfloat16 arithmetic: AVX512-BF16 and AMX.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    r"""Whether this CPU computes bfloat16 natively (``cpuinfo``: the text of ``/proc/cpuinfo``).

    Read from the kernel's flags, which need no torch: torch itself says the
    vector width only (``get_cpu_capability``: "AVX512" with or without BF16).
    No ``/proc/cpuinfo`` (not Linux): ``False``.

    Examples
    --------
    >>> cpu_has_native_bf16("flags\t\t: fpu sse avx2 avx512f avx512_bf16\n")
    True
    >>> cpu_has_native_bf16("flags\t\t: fpu sse avx2 avx512f\n")
    False
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as file:
                cpuinfo = file.read()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return not BF16_CPU_FLAGS.isdisjoint(value.split())
    return False


def resolve_device(device: str | None) -> str:
    """``device``, or the first available of ``cuda``, ``mps`` and ``cpu`` (imports torch to ask)."""
    if device not in (None, "auto"):
        return str(device)
    try:
        import torch
    except ImportError:  # no torch, no GPU to find: the load fails as a Failure naming the extra to install
        return "cpu"

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def native_dtype(device: str) -> str:
    """The dtype ``device`` computes natively: bfloat16 where it has it, else float16 on CUDA, else float32.

    A CPU is asked through its flags (``cpu_has_native_bf16``, no torch); a
    CUDA device through ``torch.cuda.is_bf16_supported``. MPS stays in float32.
    """
    kind = device.split(":")[0]
    if kind == "cpu":
        return "bfloat16" if cpu_has_native_bf16() else "float32"
    if kind == "cuda":
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"


@dataclass
class _RegistryEntry:
    """One registry entry: a worker thread and, once loaded, the model."""

    executor: ThreadPoolExecutor
    loaded: Any = None


_registry: dict[tuple[str, ...], _RegistryEntry] = {}
_registry_lock = threading.Lock()


def _registry_entry(key: tuple[str, ...]) -> _RegistryEntry:
    with _registry_lock:
        entry = _registry.get(key)
        if entry is None:
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outlines-transformers")
            entry = _registry[key] = _RegistryEntry(executor)
        return entry


def clear_registry() -> None:
    """Forget every loaded model (tests; frees memory once nothing else holds them)."""
    with _registry_lock:
        entries = list(_registry.values())
        _registry.clear()
    for entry in entries:
        entry.executor.shutdown(wait=True)


@dataclass
class _Counting:
    """A tokenizer without its model, shaped like a loaded model for ``render``."""

    tokenizer: Any


_counting: dict[tuple[str, str | None], _Counting] = {}


def _counting_tokenizer(path: str, gguf_file: str | None) -> _Counting:
    with _registry_lock:
        found = _counting.get((path, gguf_file))
    if found is None:
        from transformers import AutoTokenizer

        extra = {} if gguf_file is None else {"gguf_file": gguf_file}
        found = _Counting(AutoTokenizer.from_pretrained(path, **extra))
        with _registry_lock:
            found = _counting.setdefault((path, gguf_file), found)
    return found


def plan_chunks(
    lengths: Sequence[int], rows_per_prompt: int, max_rows: int, max_tokens: int | None, new_tokens: int,
    order: Sequence[int] | None = None,
) -> list[list[int]]:
    """Split prompt indices, in ``order`` (default: shortest first), into chunks that fit the limits.

    The rule is ``outlines.draws.pack``, the batcher's own.

    A chunk holds at most ``max_rows`` rows (prompts x ``rows_per_prompt``)
    and at most ``max_tokens`` tokens (rows x (longest prompt + new tokens));
    a single prompt always makes a chunk.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i)) if order is None else list(order)
    rows = pack([rows_per_prompt] * len(order), max(max_rows, rows_per_prompt),
                widths=[lengths[i] + new_tokens for i in order], max_area=max_tokens)
    chunks, start = [], 0
    for count in rows:
        chunks.append(order[start : start + count // rows_per_prompt])
        start += count // rows_per_prompt
    return chunks


def prefix_order(prompt_ids: Sequence[Sequence[int]], group_min: int | None) -> list[int]:
    """Prompt indices with each group sharing a head together, for ``plan_chunks``.

    Groups share ``group_min`` tokens past what all the prompts start with
    (``prefix.prefix_groups``; ``None``: no groups). Each group runs shortest
    first and the groups follow each other by their longest prompt, so padding
    stays small; with no groups this is shortest first.

    Examples
    --------
    >>> prefix_order([[1, 2, 3, 9, 9, 9], [5, 6], [1, 2, 3, 8], [7]], group_min=3)
    [3, 1, 2, 0]
    """
    lengths = [len(ids) for ids in prompt_ids]
    if group_min is None or len(prompt_ids) < 2:
        return sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    common = len(os.path.commonprefix([list(ids) for ids in prompt_ids]))  # what every prompt starts with
    groups = [sorted(members, key=lambda i: (lengths[i], i))
              for _, members in prefix_groups(prompt_ids, common + group_min).groups()]
    groups.sort(key=lambda members: (lengths[members[-1]], members[0]))
    return [index for members in groups for index in members]


def trim_at_stop(text: str, stop: Sequence[str]) -> str:
    """Cut ``text`` at the earliest stop string (the stop string is dropped)."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


class GenerationCancelled(Exception):
    """The awaiting task was cancelled; the worker stopped the batch early."""


def _tokenize(tokenizer: Any, texts: list[str], special_tokens: bool) -> tuple[list[list[int]], dict[int, str]]:
    """Token ids of each text (all at once), and why each text that cannot be tokenized cannot.

    Only when the batch call fails is each text tokenized alone, to find the
    ones at fault (a lone surrogate: no tokenizer encodes it).
    """
    try:
        return [list(x) for x in tokenizer(texts, add_special_tokens=special_tokens)["input_ids"]], {}
    except Exception:  # noqa: BLE001 - one text at fault: found below
        pass
    ids: list[list[int]] = []
    problems: dict[int, str] = {}
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
            ids.append(list(tokenizer([text], add_special_tokens=special_tokens)["input_ids"][0]))
        except UnicodeEncodeError as exc:
            ids.append([])
            problems[i] = (f"it holds a lone surrogate ({text[exc.start]!r} at character {exc.start}), which no "
                           "tokenizer can encode; fix the text's encoding")
        except Exception as exc:  # noqa: BLE001 - this text's own failure
            ids.append([])
            problems[i] = f"the tokenizer cannot encode it ({type(exc).__name__}: {exc})"
    return ids, problems


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _split_rows(options: dict[str, Any], rows: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Options of the first ``rows`` rows and of the rest (per-row constraints are split)."""
    rules = options.get("constraints")
    if not rules:
        return options, options
    return {**options, "constraints": rules[:rows]}, {**options, "constraints": rules[rows:]}


def _row_key(salt: str, prompt: str, draw: int) -> int:
    digest = hashlib.sha256(json.dumps([salt, prompt, draw]).encode()).digest()
    return int.from_bytes(digest[:8], "little")


class TransformersBackend(Backend):
    """A HuggingFace causal LM behind the backend protocol.

    Parameters
    ----------
    model_id_or_path
        Hub id or local folder, loaded with ``from_pretrained`` on first use.
    device
        ``"cuda"``, ``"mps"``, ``"cpu"`` or ``None`` (the first available).
    dtype
        Torch dtype name; ``None``: the one the device computes natively
        (``native_dtype``), resolved before the first batch.
    max_batch
        Rows of one forward batch and draws per ``generate`` call; ``None``:
        ``AUTO_MAX_BATCH`` for the device, fewer when ``max_batch_tokens``
        holds fewer rows.
    max_batch_tokens
        Token budget of one forward batch (rows x (prompt + new tokens));
        ``None``: what the key/value cache may take of the memory free once
        the model is loaded (``_hf_generation.batch_token_budget``).
    truncation
        When a prompt does not fit the context with ``max_tokens`` new tokens:
        ``False`` raises, ``True`` keeps the end of the prompt.
    gguf_file
        A GGUF checkpoint inside the folder ``model_id_or_path`` (needs the
        ``gguf`` package); or pass the ``.gguf`` file itself as the path.
    chat
        ``None`` (default): render prompts through the tokenizer's chat
        template when it has one; ``True``: require a template; ``False``:
        send prompts as raw text.
    system_prompt
        A system message put before each prompt's messages (chat only).
    share_prefix
        Prefill each prompt, each shared head and a chunk's common prefix
        once; ``False`` runs every row separately (the reference path, for
        tests and benchmarks).
    group_min_tokens
        The shortest head, in tokens, that prompts must share past the
        chunk's common prefix for the head to be prefilled once for them
        (default 16); ``None``: only the chunk's common prefix is shared (as
        before prefix groups: a baseline for benchmarks).
    """

    kind = "transformers"
    generation_extras = frozenset(SUPPORTED_EXTRA)
    local_compute = True
    #: The runtime keeps prompts sharing this many characters in one batch: a head
    #: shorter than that saves too little prefill to reorder batches for.
    prefix_min_head = 64

    def __init__(
        self,
        model_id_or_path: str,
        *,
        device: str | None = None,
        dtype: str | None = None,
        max_batch: int | None = None,
        max_concurrency: int | None = 1,
        max_batch_tokens: int | None = None,
        truncation: bool = False,
        gguf_file: str | None = None,
        chat: bool | None = None,
        system_prompt: str | None = None,
        share_prefix: bool = True,
        group_min_tokens: int | None = MIN_GROUP_HEAD,
    ) -> None:
        path = os.fspath(model_id_or_path)
        expanded = os.path.expanduser(path)
        if os.path.isdir(expanded) or path.startswith((".", "/", "~")):
            path = os.path.abspath(expanded)
        if gguf_file is None and path.endswith(".gguf"):
            path, gguf_file = os.path.split(path)
        if gguf_file is not None and os.path.basename(gguf_file) != gguf_file:
            raise ValueError(f"gguf_file must be a file name inside {path}, got {gguf_file!r}")
        if chat not in (None, True, False):
            raise ValueError(f"chat must be None, True or False, got {chat!r}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a string, got {type(system_prompt).__name__}")
        if system_prompt is not None and chat is False:
            raise ValueError("system_prompt needs a chat template; it cannot be used with chat=False")
        self.path = path
        self.gguf_file = gguf_file
        self.chat = chat
        self.system_prompt = system_prompt
        self.share_prefix = share_prefix
        self.group_min_tokens = check_limit("group_min_tokens", group_min_tokens,
                                            where=f"models.transformers({path!r})")
        self.device = device
        where = f"models.transformers({path!r})"
        if dtype == "auto":
            raise ValueError(f"{where}: dtype='auto' (the checkpoint's dtype) is not taken; leave dtype out for "
                             "the one this machine computes natively, or name one ('float32', 'bfloat16', 'float16')")
        #: The dtype asked for; ``dtype`` is the one used.
        self.dtype_asked = None if dtype is None else str(dtype).replace("torch.", "")
        self._dtype: str | None = self.dtype_asked
        self._device: str | None = None  # resolved on first need (imports torch unless named)
        self._max_batch_asked = check_limit("max_batch", max_batch, where=where)
        self.max_concurrency = check_limit("max_concurrency", max_concurrency, where=where)
        self.max_batch_tokens = check_limit("max_batch_tokens", max_batch_tokens, where=where)
        self.truncation = truncation

    @property
    def identity(self) -> tuple[Any, ...]:
        # The chat template comes from the model files the path names; how it is
        # used (chat mode, system prompt) changes the text, so it is part of the key.
        return self._identity(self.dtype)

    def _identity(self, dtype: str) -> tuple[Any, ...]:
        base: tuple[Any, ...] = ("transformers", self.path, self.device or "auto", dtype)
        if self.gguf_file is None and self.chat is None and self.system_prompt is None:
            return base  # keeps the keys of plain folders stable
        chat = "auto" if self.chat is None else self.chat
        return base + (self.gguf_file, chat, self.system_prompt)

    # Equal as asked: building a graph compares and hashes its ops (their backends with them), and the
    # dtype the identity names may need torch to resolve; what is asked alike resolves alike.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransformersBackend) and type(other) is type(self) and (
            self._identity(self.dtype_asked or "auto") == other._identity(other.dtype_asked or "auto"))

    def __hash__(self) -> int:
        return hash(self._identity(self.dtype_asked or "auto"))

    @property
    def model_name(self) -> str:
        if self.gguf_file is not None:
            return self.gguf_file.removesuffix(".gguf")
        return os.path.basename(self.path.rstrip("/")) if os.path.isabs(self.path) else self.path

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, max_batch={self.max_batch})"

    def __getstate__(self) -> dict[str, Any]:
        # The dtype resolved here travels (the cache key names it); the device is the
        # receiving machine's own to find (a dask worker may have the GPU this one lacks).
        return {**self.__dict__, "_device": None}

    @property
    def dtype(self) -> str:
        """The dtype the model runs in: the one asked for, else the device's native one (``native_dtype``).

        Resolving it may import torch (to ask for a GPU), so it waits until
        something needs it: the cache key, the repr, the first batch.
        """
        if self._dtype is None:
            self._dtype = native_dtype(self._resolved_device())
        return self._dtype

    def _resolved_device(self) -> str:
        if self._device is None:
            self._device = resolve_device(self.device)
        return self._device

    @property
    def max_batch(self) -> int:  # type: ignore[override]  # read-only here: the scheduler reads it
        """Rows of one forward batch and draws per call: the one asked for, else ``AUTO_MAX_BATCH``."""
        if self._max_batch_asked is not None:
            return self._max_batch_asked
        return AUTO_MAX_BATCH.get(self._resolved_device().split(":")[0], AUTO_MAX_BATCH["cpu"])

    def _key(self) -> tuple[str, ...]:
        return (self.path, self.gguf_file or "", self.device or "auto", self.dtype)

    tokens_exact = True

    def count_tokens(self, prompt: str) -> int:
        """Prompt tokens of one row, exactly: the model's tokenizer on the rendered (chat-templated) prompt.

        Uses a tokenizer of its own (loaded once per model files, without the
        weights), so counting never waits for, nor races, a generating batch.
        """
        return len(self.prompt_tokens(prompt))

    def render_prompt(self, prompt: str) -> str:
        """The text the model reads for ``prompt``: through the chat template (with ``system_prompt``), or as it is.

        Uses the model's tokenizer without its weights, like ``count_tokens``.
        """
        return self.render(_counting_tokenizer(self.path, self.gguf_file), prompt)

    def prompt_tokens(self, prompt: str) -> list[int]:
        """The token ids the model reads for ``prompt`` (before any ``truncation``)."""
        counting = _counting_tokenizer(self.path, self.gguf_file)
        if self.uses_chat(counting):  # the template writes the special tokens itself
            return list(counting.tokenizer(self.render(counting, prompt), add_special_tokens=False)["input_ids"])
        return list(counting.tokenizer(self.render(counting, prompt))["input_ids"])

    def usage_bound(self, draws: Sequence[Draw]) -> tuple[int, int | None]:
        """As ``Backend.usage_bound``, but each draw is its own row (its prompt is read once per sample)."""
        counts: dict[str, int] = {}
        prompt_tokens = 0
        for draw in draws:
            if draw.prompt not in counts:
                counts[draw.prompt] = self.count_tokens(draw.prompt)
            prompt_tokens += counts[draw.prompt]
        bounds = [d.params.max_tokens for d in draws]
        return prompt_tokens, None if None in bounds else sum(b for b in bounds if b is not None)

    async def generate(self, draws: Sequence[Draw], report: BatchReport) -> list[str]:
        if not draws:
            return []
        entry = _registry_entry(self._key())
        loop = asyncio.get_running_loop()
        salt = secrets.token_hex(8)
        cancelled = threading.Event()
        future = loop.run_in_executor(entry.executor, self._generate_blocking, entry, list(draws), salt, cancelled)
        try:
            texts, (prompt_tokens, completion_tokens, shared_tokens), load_times, failures = await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled.set()  # the worker stops at its next decoding step
            # ... and ends with GenerationCancelled, which no one awaits any more: retrieve it,
            # or asyncio logs "Future exception was never retrieved" when the future is collected.
            future.add_done_callback(_retrieve)
            raise
        if load_times is not None:
            report.model_loaded(*load_times)
        report.usage(prompt_tokens, completion_tokens, shared_tokens)
        if failures:  # bad prompts fail alone: the others' draws are reported as they are
            if len(failures) == len(texts):
                raise next(iter(failures.values()))
            for index, text in enumerate(texts):
                if index in failures:
                    report.failure(index, failures[index])
                else:
                    report.result(index, text)
        return texts

    def load(self) -> Any:
        """Load the model now (normally done on the first batch); returns it."""
        entry = _registry_entry(self._key())
        return entry.executor.submit(self._loaded, entry).result()

    def _loaded(self, entry: _RegistryEntry) -> Any:
        if entry.loaded is None:
            if os.path.isabs(self.path) and not os.path.isdir(self.path):
                raise BackendError(f"no model folder at {self.path}", model=self.path)
            try:
                from outlines.backends import _hf_generation  # imports torch and transformers

                entry.loaded = _hf_generation.load(self.path, self._resolved_device(), self.dtype, self.gguf_file)
            except ImportError as exc:
                hint = f"; local models need the transformers extra (CPU torch first, see README): " \
                    f"{install_hint('transformers')}" if isinstance(exc, ModuleNotFoundError) else ""
                raise BackendError(f"cannot load {self.gguf_file or self.path!r}: {exc}{hint}", model=self.path) from exc
            except (OSError, ValueError) as exc:
                raise BackendError(f"cannot load a model from {self.path!r}: {exc}", model=self.path) from exc
        return entry.loaded

    def _generate_blocking(
        self, entry: _RegistryEntry, draws: list[Draw], salt: str, cancelled: threading.Event | None = None
    ) -> tuple[list[str], list[int], tuple[float, float] | None, dict[int, BackendError]]:
        """Texts, token usage (prompt, completion, shared prompt tokens), the (start, end) of the model load
        when this batch loaded it, and the failed draws."""
        start, fresh = time.perf_counter(), entry.loaded is None  # one thread per registry entry: no race
        loaded = self._loaded(entry)
        load_times = (start, time.perf_counter()) if fresh else None
        texts: list[str] = [""] * len(draws)
        usage = [0, 0, 0]
        failures: dict[int, BackendError] = {}
        groups: dict[GenerationParams, list[int]] = {}
        for index, draw in enumerate(draws):
            # Rows under different constraints (or none) share one forward pass; see constraints.TokenMasks.
            groups.setdefault(replace(draw.params, constraint=None), []).append(index)
        for params, indices in groups.items():
            self._generate_group(
                loaded, params, [draws[i] for i in indices], salt, texts, indices, usage, cancelled, failures
            )
        return texts, usage, load_times, failures

    def _generate_group(
        self, loaded: Any, params: GenerationParams, draws: list[Draw], salt: str,
        texts: list[str], positions: list[int], usage: list[int], cancelled: threading.Event | None,
        failures: dict[int, BackendError],
    ) -> None:
        options = self._options(params)
        draws_of: dict[str, list[int]] = {}  # prompt -> positions in ``draws``
        for index, draw in enumerate(draws):
            draws_of.setdefault(draw.prompt, []).append(index)
        by_count: dict[int, list[str]] = {}
        for prompt, members in draws_of.items():
            by_count.setdefault(len(members), []).append(prompt)
        seed = str(params.seed) if params.seed is not None else "salt:" + salt
        mid_line: dict[str, bool] = {}
        for count, every_prompt in by_count.items():
            all_ids, new_tokens, problems = self._encode(loaded, every_prompt, params.max_tokens)
            for i, problem in problems.items():  # a prompt that cannot run fails its own draws only
                for position in (positions[member] for member in draws_of[every_prompt[i]]):
                    failures[position] = BackendError(
                        f"prompt {position} of this batch ({every_prompt[i][:40]!r}): {problem}", model=self.path
                    )
            prompts = [p for i, p in enumerate(every_prompt) if i not in problems]
            ids = [x for i, x in enumerate(all_ids) if i not in problems]
            if not prompts:
                continue
            if cancelled is not None and cancelled.is_set():
                raise GenerationCancelled()
            lengths = [len(x) for x in ids]
            order = prefix_order(ids, self.group_min_tokens if self.share_prefix else None)
            budget = loaded.batch_tokens if self.max_batch_tokens is None else self.max_batch_tokens
            for chunk in plan_chunks(lengths, count, max(self.max_batch, count), budget, new_tokens, order):
                groups = [draws_of[prompts[i]] for i in chunk]
                keys = None
                if not params.deterministic:
                    keys = [_row_key(seed, draws[m].prompt, draws[m].draw) for group in groups for m in group]
                rules = [self._row_rule(loaded, draws[m], mid_line) for group in groups for m in group]
                chunk_options = {**options, "constraints": rules if any(rules) else None}
                outputs = self._run(
                    loaded, [ids[i] for i in chunk], count, keys, new_tokens, chunk_options, usage, cancelled
                )
                for row, member in enumerate(m for group in groups for m in group):
                    text, rule = trim_at_stop(outputs[row], params.stop), rules[row]
                    texts[positions[member]] = text if rule is None else rule.unspaced(text)

    def _row_rule(self, loaded: Any, draw: Draw, mid_line: dict[str, bool]) -> Constraint | None:
        """The constraint a row decodes under: spaced after a prompt that ends mid-line (see constraints).

        ``mid_line`` remembers, per prompt, whether its rendered text ends in a non-space character.
        """
        rule = draw.params.constraint
        if rule is None or rule.kind == "json_schema":
            return rule
        if draw.prompt not in mid_line:
            rendered = self.render(loaded, draw.prompt)
            mid_line[draw.prompt] = bool(rendered) and not rendered[-1].isspace()
        return rule.spaced() if mid_line[draw.prompt] else rule

    def _options(self, params: GenerationParams) -> dict[str, Any]:
        extra = dict(params.extra)
        unknown = sorted(set(extra) - set(SUPPORTED_EXTRA))
        if unknown:
            raise BackendError(
                f"transformers backend does not support {', '.join(unknown)} (supported extras: "
                f"{', '.join(SUPPORTED_EXTRA)})", model=self.path,
            )
        temperature = 1.0 if params.temperature is None else float(params.temperature)
        return {**extra, "temperature": temperature, "top_p": params.top_p, "stop": list(params.stop)}

    def uses_chat(self, loaded: Any) -> bool:
        """Whether prompts go through the chat template of the loaded tokenizer."""
        has_template = bool(getattr(loaded.tokenizer, "chat_template", None))
        if self.chat and not has_template:
            raise BackendError("chat=True but the tokenizer has no chat template", model=self.path)
        return has_template if self.chat is None else self.chat

    def render(self, loaded: Any, prompt: str) -> str:
        """The text the model reads for ``prompt`` (through the chat template, or as it is)."""
        if not self.uses_chat(loaded):
            if isinstance(prompt, Conversation):
                raise BackendError(
                    "a conversation needs a chat template; this tokenizer has none (or chat=False)", model=self.path
                )
            return prompt
        messages = messages_of(prompt, self.system_prompt)
        return str(loaded.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def _encode(
        self, loaded: Any, prompts: list[str], max_tokens: int | None
    ) -> tuple[list[list[int]], int, dict[int, str]]:
        """Token ids of each prompt, the new tokens to generate, and why each prompt that cannot run cannot.

        A prompt that cannot be tokenized, or (without ``truncation``) does not
        leave room for its new tokens, is a problem of its own: the new tokens
        are worked out from the others.
        """
        chat = self.uses_chat(loaded)  # the template writes the special tokens itself
        ids, problems = _tokenize(loaded.tokenizer, [self.render(loaded, p) for p in prompts], not chat)
        context = loaded.context_length
        if context is not None and not self.truncation:
            # Without max_tokens, a prompt fits while it leaves a token of room (the new tokens take what is left).
            longest_fitting = context - max_tokens if max_tokens is not None else context - 1
            needed = max_tokens if max_tokens is not None else min(DEFAULT_MAX_TOKENS, context // 2)
            for i, x in enumerate(ids):
                if i not in problems and len(x) > longest_fitting:
                    problems[i] = (f"{len(x)} tokens + max_tokens {needed} exceeds the context of {context} tokens; "
                                   "shorten it, lower max_tokens or pass truncation=True")
        longest = max((len(x) for i, x in enumerate(ids) if i not in problems), default=0)
        new_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
        if max_tokens is None and context:  # fill the context, or keep half of it for new text
            new_tokens = min(new_tokens, context - longest if context > longest else context // 2)
        if context is None or longest + new_tokens <= context:
            return ids, new_tokens, problems
        room = context - new_tokens  # truncating: keep the end of each prompt that is too long
        if room < 1:
            for i in range(len(ids)):
                problems.setdefault(i, f"max_tokens {new_tokens} leaves no room in the context of {context} tokens; "
                                       "lower max_tokens")
        return [x[-room:] if room >= 1 else x for x in ids], new_tokens, problems

    def _run(
        self, loaded: Any, ids: list[list[int]], count: int, keys: list[int] | None, new_tokens: int,
        options: dict[str, Any], usage: list[int], cancelled: threading.Event | None = None,
    ) -> list[str]:
        from outlines.backends import _hf_generation as hf

        try:
            row_keys = None if keys is None else np.array(keys, dtype=np.uint64)
            texts, prompt_tokens, completion_tokens, shared_tokens = hf.run_chunk(
                loaded, ids, count, row_keys, new_tokens, options, share_prefix=self.share_prefix,
                group_min=self.group_min_tokens, cancelled=cancelled,
            )
        except Exception as exc:
            if not hf.is_out_of_memory(exc):
                raise
            hf.free_memory(loaded.device)
            if len(ids) == 1 and count == 1:
                raise BackendError(
                    f"out of memory generating one sequence of {len(ids[0])}+{new_tokens} tokens on "
                    f"{loaded.device}; lower max_tokens or use a smaller model/dtype", model=self.path,
                ) from exc
            if len(ids) == 1:  # split the draws of one prompt: rows do not depend on their batch
                half = count // 2
                first, second = _split_rows(options, half)
                return self._run(loaded, ids, half, keys and keys[:half], new_tokens, first, usage, cancelled) + \
                    self._run(loaded, ids, count - half, keys and keys[half:], new_tokens, second, usage, cancelled)
            half = len(ids) // 2
            first, second = _split_rows(options, half * count)
            head, tail = keys and keys[: half * count], keys and keys[half * count:]
            return self._run(loaded, ids[:half], count, head, new_tokens, first, usage, cancelled) + \
                self._run(loaded, ids[half:], count, tail, new_tokens, second, usage, cancelled)
        if cancelled is not None and cancelled.is_set():
            raise GenerationCancelled()  # the texts were cut short: never report them
        usage[0] += prompt_tokens
        usage[1] += completion_tokens
        usage[2] += shared_tokens
        return texts
