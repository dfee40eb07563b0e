"""User-facing model constructors. Nothing is loaded or sent until evaluation.

Every constructor takes default generation parameters (``max_tokens``,
``temperature``, ``stop``, ``seed``, ``top_p``...) and the limits
``max_batch`` (prompts per backend call) and ``max_concurrency`` (backend calls
in flight). Backend modules are imported lazily, so HTTP users never import
torch.
"""
from __future__ import annotations

from typing import Any, Callable

from outlines.generate import Model

__all__ = ["Model", "from_function", "openai", "openai_completion", "transformers"]

#: Keywords that are generation parameters (model defaults), not backend options.
GENERATION_KEYS = (
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
)


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    params = {k: options.pop(k) for k in list(options) if k in GENERATION_KEYS}
    return params, options


def from_function(
    fn: Callable[..., Any],
    *,
    batched: bool = False,
    name: str | None = None,
    max_batch: int | None = None,
    max_concurrency: int | None = None,
    **defaults: Any,
) -> Model:
    """Use any Python callable as a model.

    Parameters
    ----------
    fn
        ``str -> str`` (or ``list[str] -> list[str]`` with ``batched=True``),
        sync or ``async def``.
    batched
        Whether ``fn`` takes a whole batch of prompts at once.
    name
        Name used in pictures, traces and the cache identity (default: the
        function's ``__name__``).
    max_batch, max_concurrency
        Prompts per call (default unlimited) and calls in flight (default 64
        for a non-batched function).
    **defaults
        Default generation parameters (recorded in cache keys).

    Returns
    -------
    Model

    Examples
    --------
    >>> echo = from_function(lambda p: p.upper())
    >>> echo("hi").eval(cache=False)
    'HI'
    """
    from outlines.backends.function import FunctionBackend

    backend = FunctionBackend(fn, batched=batched, name=name, max_batch=max_batch, max_concurrency=max_concurrency)
    return Model(backend, **defaults)


def openai(model: str, *, base_url: str | None = None, api_key: str | None = None, **options: Any) -> Model:
    """An OpenAI (or compatible) chat-completions model; see ``OpenAIChatBackend``.

    Parameters
    ----------
    model
        Model name, e.g. ``"gpt-4o-mini"``.
    base_url
        API root (default ``OPENAI_BASE_URL`` or ``https://api.openai.com/v1``).
    api_key
        Secret key (default ``OPENAI_API_KEY``); never shown or cached.
    **options
        Generation defaults (``max_tokens``, ``temperature``, ``stop``, ``seed``,
        ``top_p``, ``logit_bias``) and backend options (``max_batch``, default
        16 draws per call; ``max_concurrency``, default 32 requests in flight;
        ``max_retries``; ``system_prompt``; ``timeout`` and ``connect_timeout``
        in seconds; ``rpm`` and ``tpm`` budgets; ``max_retry_after``;
        ``headers``). See ``outlines.backends.openai``.
    """
    from outlines.backends.openai import OpenAIChatBackend

    params, backend_options = _split(dict(options))
    return Model(OpenAIChatBackend(model, base_url=base_url, api_key=api_key, **backend_options), **params)


def openai_completion(
    model: str, *, base_url: str | None = None, api_key: str | None = None, **options: Any
) -> Model:
    """A legacy ``/v1/completions`` model that sends many prompts per request.

    Takes the same options as ``openai`` except ``system_prompt``;
    ``max_batch`` (default 128) bounds the prompts in one request. Servers
    that refuse a list of prompts (``transformers serve``) get one prompt per
    request, and servers that ignore ``n`` one request per sample.
    """
    from outlines.backends.openai import OpenAICompletionBackend

    params, backend_options = _split(dict(options))
    return Model(OpenAICompletionBackend(model, base_url=base_url, api_key=api_key, **backend_options), **params)


def transformers(
    model_id_or_path: str, *, device: str | None = None, dtype: str | None = None, **options: Any
) -> Model:
    """A HuggingFace causal LM, generating in batches with left padding.

    Parameters
    ----------
    model_id_or_path
        Hub id or local folder, loaded with ``from_pretrained``.
    device
        ``"cuda"``, ``"mps"``, ``"cpu"``; default: the first available.
    dtype
        Torch dtype name (``"float16"``...); default: the model's.
    **options
        Generation defaults (``max_tokens``, ``temperature``, ``top_p``,
        ``stop``, ``seed``; extras ``top_k``, ``repetition_penalty``) and
        backend options: ``max_batch`` (default 32), ``max_batch_tokens``
        (token budget of one forward batch), ``truncation`` (keep the end of
        a prompt too long for the context instead of raising). Seeds and the
        worker thread are described in ``outlines.backends.transformers``.
    """
    from outlines.backends.transformers import TransformersBackend

    params, backend_options = _split(dict(options))
    return Model(TransformersBackend(model_id_or_path, device=device, dtype=dtype, **backend_options), **params)
