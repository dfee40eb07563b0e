"""The torch side of the transformers backend: loading a model and running one chunk.

Imported only inside the backend's worker thread, so ``import outlines`` and
building graphs never import torch or transformers.

Sampling draws each token from a counter-based stream: row ``r`` at step ``t``
uses the uniform number ``hash(key_r, t)``, where ``key_r`` hashes the seed,
the prompt and the draw number. A draw's text therefore depends on its own
(seed, prompt, draw) only, not on which other prompts shared its batch.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)
from transformers.utils import logging as hf_logging

from outlines.draws.prefix import prefix_groups

logger = logging.getLogger("outlines")

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


@dataclass
class Loaded:
    """A model and tokenizer ready to generate, shared by every backend naming them."""

    model: Any
    tokenizer: Any
    device: str
    context_length: int | None
    eos_token_ids: list[int]
    #: Tokens (rows x (prompt + new)) whose key/value cache fits the memory budget; ``None``: unknown.
    batch_tokens: int | None = None
    stop_criteria: dict[tuple[str, ...], Any] = field(default_factory=dict)


#: The share of the memory free after loading that the key/value cache of one batch may take:
#: the rest is left for activations (a GPU's memory is the model's own; RAM is the machine's).
KV_MEMORY_SHARE = {"cuda": 0.5, "cpu": 0.25, "mps": 0.25}


def _dtype(dtype: str) -> Any:
    value = getattr(torch, str(dtype).replace("torch.", ""), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'float16' or 'bfloat16'")
    return value


def kv_bytes_per_token(config: Any, dtype: Any) -> int | None:
    """Bytes of key/value cache one token takes: layers x 2 x key/value heads x head size x dtype size.

    From the model's config (its text part for a multimodal one); ``None``
    when the config does not say (then the batch has no memory budget).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> smollm2 = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
    ...                           hidden_size=576, head_dim=64)
    >>> kv_bytes_per_token(smollm2, torch.bfloat16)
    23040
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None)
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None)
    if not head_dim and heads and getattr(text, "hidden_size", None):
        head_dim = text.hidden_size // heads
    if not (isinstance(layers, int) and isinstance(kv_heads, int) and isinstance(head_dim, int)):
        return None
    return max(0, layers * 2 * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()) or None


def available_memory(device: str) -> int | None:
    """Bytes free on ``device``: the GPU's free memory, else the machine's available RAM; ``None``: unknown."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo", encoding="utf-8") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def batch_token_budget(kv_bytes: int | None, free: int | None, device: str) -> int | None:
    """Tokens (rows x (prompt + new)) whose key/value cache fits ``KV_MEMORY_SHARE`` of ``free`` bytes.

    Examples
    --------
    >>> batch_token_budget(23040, 8 * 2**30, "cpu")  # SmolLM2 in bf16, 8 GiB free
    93206
    >>> batch_token_budget(None, 8 * 2**30, "cpu") is None
    True
    """
    if not kv_bytes or free is None:
        return None
    share = KV_MEMORY_SHARE.get(device.split(":")[0], KV_MEMORY_SHARE["cpu"])
    return max(1, int(free * share) // kv_bytes)


def load(path: str, device: str, dtype: str, gguf_file: str | None = None) -> Loaded:
    """Load ``path`` (or its ``gguf_file``) with ``from_pretrained`` on ``device`` in ``dtype``, left-padding, with
    a pad token; and the token budget of one batch from the memory free once it is loaded."""
    extra = {} if gguf_file is None else {"gguf_file": gguf_file}
    if gguf_file is not None:
        try:
            import gguf  # noqa: F401  # transformers needs it to read GGUF
        except ImportError:
            raise ImportError("loading a GGUF checkpoint needs the gguf package: pip install gguf") from None
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with _quiet_gguf(dtype, device) if gguf_file is not None else contextlib.nullcontext():
            tokenizer = AutoTokenizer.from_pretrained(path, **extra)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(dtype), **extra)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    model.to(device).eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"the tokenizer of {path} has neither a pad nor an eos token; set tokenizer.pad_token")
        tokenizer.pad_token = tokenizer.eos_token
        logger.warning("transformers model %s: the tokenizer has no pad token; padding with eos %r", path,
                       tokenizer.eos_token)
    eos = model.generation_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if not eos_ids and tokenizer.eos_token_id is not None:
        eos_ids = [tokenizer.eos_token_id]
    budget = batch_token_budget(kv_bytes_per_token(model.config, model.dtype), available_memory(device), device)
    logger.info("transformers model %s: %s on %s, %s tokens of key/value cache per batch", gguf_file or path,
                dtype, device, budget)
    return Loaded(model, tokenizer, device, _context_length(model, tokenizer), eos_ids, budget)


class _Float32Advice(logging.Filter):
    """Drops transformers' advice to load a packed GGUF checkpoint in float32 rather than bf16 on a CPU.

    Measured wrong where the backend picks bf16 (a CPU with native bf16): SmolLM2-135M Q4_1 generates 2.3x the
    tokens/s in bf16 (100 prompts x 128 greedy tokens, batches of 128: 604-638 against 272-280, 2026-12-05), and a
    new user would read the warning as a fault in the defaults."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is fastest in float32" not in record.getMessage()


@contextlib.contextmanager
def _quiet_gguf(dtype: str, device: str) -> Iterator[None]:
    """While a GGUF checkpoint loads: no converter's tqdm bar (it ignores transformers' switch), and in bf16
    on a CPU none of the quantizer's advice to use float32 (``_Float32Advice``)."""
    import functools

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        gguf_utils = None
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    advice = hf_logging.get_logger("transformers.quantizers.quantizer_gguf")
    refute = _Float32Advice() if dtype == "bfloat16" and device == "cpu" else None
    if refute is not None:
        advice.addFilter(refute)
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        if refute is not None:
            advice.removeFilter(refute)


def _context_length(model: Any, tokenizer: Any) -> int | None:
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and limit < 10**8 else None


def uniforms(keys: np.ndarray, step: int) -> np.ndarray:
    """One uniform number in [0, 1) per row key: splitmix64 of (key, step)."""
    z = keys + np.uint64(((step + 1) * _GOLDEN) & _MASK)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


class DrawSampler(LogitsProcessor):
    """Sample each row from its own stream, then force greedy search to pick it."""

    def __init__(self, keys: np.ndarray, prompt_length: int, temperature: float, top_p: float | None,
                 top_k: int | None) -> None:
        self.keys = keys
        self.prompt_length = prompt_length
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logits = scores.float() / self.temperature
        if self.top_k:
            kth = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            ordered, order = torch.sort(logits, descending=True, dim=-1)
            probs = torch.softmax(ordered, dim=-1)
            drop = (probs.cumsum(dim=-1) - probs) >= self.top_p
            drop[:, 0] = False  # the most likely token always stays
            logits = logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
        precise = torch.float32 if logits.device.type == "mps" else torch.float64  # mps has no float64
        cdf = torch.softmax(logits, dim=-1).to(precise).cumsum(dim=-1)
        u = torch.from_numpy(uniforms(self.keys, input_ids.shape[1] - self.prompt_length)).to(cdf.device, precise)
        targets = (u * cdf[:, -1]).unsqueeze(-1)
        picked = torch.searchsorted(cdf, targets, right=True).clamp_(max=cdf.shape[-1] - 1)
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(-1, picked, 0.0)


def _stopping(loaded: Loaded, stop: Sequence[str]) -> StoppingCriteriaList | None:
    if not stop:
        return None
    key = tuple(stop)
    criteria = loaded.stop_criteria.get(key)
    if criteria is None:
        criteria = loaded.stop_criteria[key] = StopStringCriteria(loaded.tokenizer, list(key))
    return StoppingCriteriaList([criteria])


class Cancellation(StoppingCriteria):
    """Stop every row at the next decoding step once ``flag`` is set (Ctrl-C)."""

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        done = self.flag.is_set()
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


#: A common prefix shorter than this is not worth a separate prefill.
MIN_SHARED_PREFIX = 8


def shared_prefix_length(prompt_ids: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own."""
    shortest = min(len(ids) for ids in prompt_ids)
    first = prompt_ids[0]
    length = 0
    while length < shortest - 1 and all(ids[length] == first[length] for ids in prompt_ids):
        length += 1
    return length


@dataclass(frozen=True)
class Layout:
    """A chunk's rows as [common head][padding][group head][padding][own tokens], and what each part is.

    The common head is the chunk's, prefilled once; each group of prompts
    that share ``group_min`` more tokens (``prefix.prefix_groups``) has its
    head prefilled once, in its ``leaders`` row; every prompt's own tokens run
    once. ``row_group``: each prompt's group (an index into ``leaders``), -1
    for a prompt in none. ``computed``: the prompt tokens run through the
    model before decoding, the last column aside.
    """

    ids: torch.Tensor
    mask: torch.Tensor
    common: int
    group_width: int
    leaders: list[int]
    row_group: list[int]
    computed: int


def prefix_layout(prompt_ids: Sequence[Sequence[int]], pad: int, group_min: int | None) -> Layout:
    """The ``Layout`` of a chunk's prompts (token ids); ``group_min=None``: the common head only."""
    count = len(prompt_ids)
    common = shared_prefix_length(prompt_ids) if count > 1 else 0
    common = common if common >= MIN_SHARED_PREFIX else 0
    rests = [list(ids[common:]) for ids in prompt_ids]
    heads, row_group, leaders = [0] * count, [-1] * count, list[int]()
    if group_min is not None and count > 1:
        for head, members in prefix_groups(rests, group_min).groups():
            head = min(head, min(len(rests[m]) for m in members) - 1)  # each keeps a token of its own
            if len(members) < 2 or head < group_min:
                continue
            for member in members:
                heads[member], row_group[member] = head, len(leaders)
            leaders.append(members[0])
    group_width = max((heads[leader] for leader in leaders), default=0)
    own = [len(rest) - head for rest, head in zip(rests, heads)]
    width = common + group_width + max(own)
    ids = torch.full((count, width), pad, dtype=torch.long)
    mask = torch.zeros((count, width), dtype=torch.long)
    for row, tokens in enumerate(prompt_ids):
        head = heads[row]
        start = common + group_width - head  # each part is left-padded within its columns
        for source, target, length in ((0, 0, common), (common, start, head), (common + head, width - own[row], own[row])):
            if length:
                ids[row, target : target + length] = torch.tensor(tokens[source : source + length], dtype=torch.long)
                mask[row, target : target + length] = 1
    computed = common + sum(heads[leader] for leader in leaders) + sum(length - 1 for length in own)
    return Layout(ids, mask, common, group_width, leaders, row_group, computed)


def _cache_keyword(model: Any) -> str:
    """``cache`` in recent transformers, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _prefill_options(model: Any, cache: Any) -> dict[str, Any]:
    """Keyword arguments of a prefill call: the cache to fill, and the logits of the last column only.

    A prefill's logits are never read; computing them for every column took
    rows x columns x vocabulary floats (1.4 GB for 100 rows of 70 tokens on
    SmolLM2's 49,152 tokens) and the time of that matmul.
    """
    options = {"use_cache": True, _cache_keyword(model): cache}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        options["logits_to_keep"] = 1
    return options


def _prefill(model: Any, layout: Layout, device: str, copies: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """Fill a key/value cache with all but the last column, computing each shared head once.

    The common head runs once (batch 1); its cache is copied to each group,
    whose head runs once (batch: the groups); that cache is copied to each
    group's prompts (a prompt in no group takes any group's: its mask hides
    those columns), whose own tokens then run once, and each prompt's cache is
    copied to its ``copies`` rows. Returns the cache and the ids and mask of
    the expanded rows; ``generate`` then only runs the last column.
    """
    from transformers import DynamicCache

    cache = DynamicCache()
    options = _prefill_options(model, cache)
    ids, mask = layout.ids.to(device), layout.mask.to(device)
    positions = (mask.cumsum(dim=-1) - 1).clamp_(min=0)
    common, groups = layout.common, len(layout.leaders)
    if common:
        model(input_ids=ids[:1, :common], attention_mask=mask[:1, :common], **options)
    start = common + layout.group_width
    if groups:
        if common:
            cache.batch_repeat_interleave(groups)
        leaders = torch.tensor(layout.leaders, device=device)
        model(
            input_ids=ids[leaders, common:start], attention_mask=mask[leaders, :start],
            position_ids=positions[leaders, common:start], **options,
        )
        cache.batch_select_indices(torch.tensor([max(g, 0) for g in layout.row_group], device=device))
    elif common:
        cache.batch_repeat_interleave(ids.shape[0])
    end = ids.shape[1] - 1
    if end > start:
        model(
            input_ids=ids[:, start:end], attention_mask=mask[:, :end], position_ids=positions[:, start:end],
            **options,
        )
    if copies > 1:
        cache.batch_repeat_interleave(copies)
    return cache, ids.repeat_interleave(copies, dim=0), mask.repeat_interleave(copies, dim=0)


def run_chunk(
    loaded: Loaded,
    prompt_ids: Sequence[Sequence[int]],
    num_sequences: int,
    keys: np.ndarray | None,
    max_new_tokens: int,
    params: dict[str, Any],
    *,
    share_prefix: bool = True,
    group_min: int | None = None,
    cancelled: threading.Event | None = None,
) -> tuple[list[str], int, int, int]:
    """Generate ``num_sequences`` rows per prompt; return texts (prompt-major) and token counts.

    ``keys`` (one uint64 per output row) selects sampling; ``None`` is greedy.
    With ``share_prefix``, each prompt, each group of prompts sharing
    ``group_min`` tokens past the chunk's common prefix (``None``: no groups;
    ``TransformersBackend(group_min_tokens=...)``), and that common prefix
    are prefilled once and their key/value caches copied to the rows that
    start with them (``prefix_layout``); otherwise every row is run on its own
    (``num_return_sequences`` done by hand, which ``generate`` refuses for the
    greedy search our sampler steers). The counts are prompt tokens (every
    row's), completion tokens, and of the prompt tokens those whose keys and
    values were shared rather than computed.
    """
    tokenizer, model = loaded.tokenizer, loaded.model
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=loaded.eos_token_ids or None,
    )
    for name in ("repetition_penalty", "no_repeat_ngram_size"):
        if params.get(name) is not None:
            setattr(config, name, params[name])
    stopping = _stopping(loaded, params.get("stop") or ()) or StoppingCriteriaList()
    if cancelled is not None:
        stopping.append(Cancellation(cancelled))
    extra: dict[str, Any] = {}
    computed: int | None = None
    with torch.inference_mode():
        if share_prefix and model.config.is_encoder_decoder is False:
            layout = prefix_layout(prompt_ids, tokenizer.pad_token_id, group_min)
            if layout.ids.shape[1] > 1:
                cache, ids, mask = _prefill(model, layout, loaded.device, num_sequences)
                extra[_cache_keyword(model)] = cache
            else:
                ids = layout.ids.to(loaded.device).repeat_interleave(num_sequences, dim=0)
                mask = layout.mask.to(loaded.device).repeat_interleave(num_sequences, dim=0)
            computed = layout.computed + ids.shape[0]  # each row runs its last column itself
            batch = {"input_ids": ids, "attention_mask": mask}
        else:
            rows = [list(ids) for ids in prompt_ids for _ in range(num_sequences)]
            padded = tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt")
            batch = {name: tensor.to(loaded.device) for name, tensor in padded.items()}
        width = batch["input_ids"].shape[1]
        processors = LogitsProcessorList()
        if params.get("constraints"):  # masks first: the sampler draws among allowed tokens only
            processors.append(_token_masks(loaded, params["constraints"]))
        if keys is not None:
            processors.append(DrawSampler(keys, width, params["temperature"], params.get("top_p"), params.get("top_k")))
        output = model.generate(
            **batch,
            **extra,
            generation_config=config,
            logits_processor=processors,
            stopping_criteria=stopping,
        )
    new = output[:, width:].cpu()
    texts = tokenizer.batch_decode(new, skip_special_tokens=True)
    prompt_tokens = int(batch["attention_mask"].sum())
    shared = 0 if computed is None else prompt_tokens - computed
    return texts, prompt_tokens, _count_generated(new, loaded), shared


def _token_masks(loaded: Loaded, constraints: Sequence[Any]) -> Any:
    from outlines.backends.constraints import TokenMasks, compiler_for

    head = loaded.model.get_output_embeddings()
    vocab_size = head.weight.shape[0] if head is not None else loaded.model.config.vocab_size
    return TokenMasks(compiler_for(loaded.tokenizer, vocab_size), constraints, loaded.eos_token_ids)


def _count_generated(new: torch.Tensor, loaded: Loaded) -> int:
    """Tokens up to and including each row's first end token."""
    ends = torch.zeros_like(new, dtype=torch.bool)
    for token in set(loaded.eos_token_ids) | {loaded.tokenizer.pad_token_id}:
        ends |= new == token
    after_end = (ends.long().cumsum(dim=-1) - ends.long()) > 0
    return int((~after_end).sum())


def is_out_of_memory(exc: BaseException) -> bool:
    oom = getattr(torch.cuda, "OutOfMemoryError", ())
    return (bool(oom) and isinstance(exc, oom)) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc))


def free_memory(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
