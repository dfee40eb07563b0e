"""Models: the ``Model`` callable, the ``Generate`` op, and the constructors.

Calling a ``Model`` on a prompt builds a ``Generate`` node; nothing is loaded
or sent until evaluation. The output has the prompt's shape plus, when
``num_samples=k`` is given (k = 1 included), a LAST axis of k samples; the
default (``num_samples=None``) is one draw and adds no axis. Anything of the prompt's
shape pairs with it on the leading axes (``outlines.graph.shapes``). A ragged
prompt (rows of different lengths) is flattened so all its rows go in one
batch, and the results are put back into the rows. Each element of the prompt and each of its
``num_samples`` samples is one *draw*. Draws are numbered when a graph is
planned (``outlines.runtime.plan``), so repeated identical calls are
independent draws and a re-run replays the same numbers from the cache.

Every constructor takes default generation parameters (``max_tokens``,
``temperature``, ``stop``, ``seed``, ``top_p``...) and the limits
``max_batch`` (draws per backend call, a prompt's samples never split
between two calls unless they outnumber it) and ``max_concurrency`` (backend calls
in flight). An option no one takes is refused when the model or the call is
built, naming the closest valid one (``num_sample`` -> "did you mean
num_samples?"); each backend declares the parameters it takes by name, and
a hosted one sends the fields of ``extra_body`` (a dict) to its server
unchecked. Backend modules are imported lazily, so HTTP users never import
torch.
"""
from __future__ import annotations

import difflib
import inspect
import json
from collections.abc import Iterable, Mapping
from typing import Any, Callable

import numpy as np

from outlines.backends.base import Backend
from outlines.draws import Draw, GenerationParams
from outlines.draws.params import COMMON_PARAMS, Constraint
from outlines.common.errors import GraphBuildError
from outlines.graph.basic import Apply, Constant, Op, Variable, as_object_array, as_variable
from outlines.graph.ops import Flatten, Regroup, all_text, check_text_input
from outlines.graph.shapes import Shape
from outlines.graph.traits import Run, Traits
from outlines.common.labels import label_of, shorten

__all__ = ["Generate", "Model", "anthropic", "fallback", "from_function", "openai", "openai_completion", "transformers"]


class Generate(Op):
    """Sample ``num_samples`` completions of each prompt element from ``backend``.

    Its traits follow its parameters: a call is pure (equal calls merge) only
    when greedy (``params.deterministic``), read once here; an op's parameters
    never change after it is built (they are its hash).
    """

    __props__ = ("backend", "params", "num_samples", "sample_axis")
    traits = Traits(run=Run.GENERATE, pure=False)
    _GREEDY = Traits(run=Run.GENERATE, pure=True)

    def __init__(self, backend: Backend, params: GenerationParams, num_samples: int | None = None) -> None:
        # an explicit k always adds the sample axis, so code written for k samples works at k = 1
        self.sample_axis = num_samples is not None
        if num_samples is None:
            num_samples = 1
        if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
            raise GraphBuildError(
                f"Generate({backend.kind}:{backend.model_name}): num_samples must be an integer >= 1, "
                f"got {num_samples!r}"
            )
        self.backend = backend
        self.params = params
        self.num_samples = int(num_samples)
        if params.deterministic:
            self.traits = self._GREEDY

    @property
    def name(self) -> str:
        return f"Generate[{self.backend.kind}:{self.backend.model_name}]"

    def stacked(self) -> Generate | None:
        """Calls of one draw each stack (a random one too: the plan keeps its draw numbers); samples do not."""
        return None if self.sample_axis else self

    def describe(self) -> dict[str, Any]:
        backend, params = label_of(self.backend), self.params.to_dict()
        lines = [shorten(", ".join(f"{k}={json.dumps(v)}" for k, v in params.items()), 60)] if params else []
        if self.sample_axis:
            lines.append(f"num_samples={self.num_samples}")
        return {"kind": "model", "title": backend, "backend": backend, "params": params,
                "num_samples": self.num_samples, "lines": lines}

    def make_node(self, *inputs: Any) -> Apply:
        if len(inputs) != 1:
            raise GraphBuildError(f"{self.name} takes exactly one prompt, got {len(inputs)} arguments")
        prompt = as_variable(inputs[0], array=True)
        if isinstance(prompt, Constant) and isinstance(prompt.value, (list, tuple)):
            prompt = Constant(as_object_array(prompt.value), prompt.name)  # a list of prompts is an array
        check_text_input(self, prompt, "the prompt")
        return Apply(self, [prompt])

    def infer_shapes(self, shapes: list[Shape], noutputs: int) -> list[Shape]:
        (shape,) = shapes
        if shape is None or not self.sample_axis:
            return [shape]
        return [(*shape, self.num_samples)]

    def ragged_outputs(self, ragged: list[bool], noutputs: int) -> list[bool]:
        if ragged[0]:
            raise GraphBuildError(f"{self.name}: a ragged prompt goes through Model.__call__, which flattens it")
        return [False]

    def draws(self, prompt: Any, draw_offset: int) -> tuple[tuple[int, ...], list[Draw]]:
        """The output shape and the flat list of draws for a prompt value.

        Draws are ordered element-major: all samples of element 0 first.
        """
        shape, texts, numbers = self.columns(prompt, draw_offset)
        return shape, [Draw(text, self.params, d) for text in texts for d in numbers]

    def columns(self, prompt: Any, draw_offset: int) -> tuple[tuple[int, ...], list[Any], list[int]]:
        """``draws`` without the ``Draw`` objects: output shape, flat prompt texts, draw numbers.

        Each text is drawn once per number (element-major); the scheduler
        keeps draws in this form until a batch needs them.
        """
        if isinstance(prompt, np.ndarray):
            texts = prompt.reshape(-1).tolist()
            shape: tuple[int, ...] = prompt.shape
        else:
            texts, shape = [prompt], ()
        if not all_text(texts):
            for text in texts:
                if not isinstance(text, str):
                    raise TypeError(f"the prompt must be text, got {type(text).__name__} {text!r:.60}")
        k = self.num_samples
        numbers = [0] * k if self.params.deterministic else list(range(draw_offset, draw_offset + k))
        return (shape + (k,) if self.sample_axis else shape), texts, numbers


class Model:
    """A language model that builds ``Generate`` nodes when called.

    Parameters
    ----------
    backend
        Where the text comes from.
    **defaults
        Default generation parameters (``max_tokens``, ``temperature``,
        ``stop``, ``seed``, ``top_p``, those the backend declares in
        ``generation_extras``, and ``extra_body`` where it has a server),
        overridable per call.

    Raises
    ------
    TypeError
        For a parameter the backend does not take, naming the closest one.
    ValueError
        For a value out of range, or an ``extra_body`` that is not a dict.
    """

    def __init__(self, backend: Backend, **defaults: Any) -> None:
        refuse_unknown(f"Model({backend.kind}:{backend.model_name})", defaults, generation_names(backend))
        self.backend = backend
        self.defaults = GenerationParams.create(**unfold_extra_body(defaults, backend))
        backend.check_params(self.defaults)  # a provider's documented ranges, before anything is built
        #: The op of each (params, samples) asked so far: a call built in a loop makes no op (building
        #: a Generate per call triples the build time per node); equal ops stack whichever object they are.
        self._ops: dict[tuple[GenerationParams, int | None], Generate] = {}
        #: The defaults and their op of one draw (``_ops[defaults, None]``), once built: the common call
        #: finds it without hashing the params (a Python ``__hash__``, per node built).
        self._default: tuple[GenerationParams, Generate] | None = None

    def __call__(
        self,
        prompt: Any,
        *,
        num_samples: int | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        choices: list[str] | None = None,
        regex: str | None = None,
        json_schema: Any = None,
        **params: Any,
    ) -> Variable:
        """Build a node sampling ``num_samples`` completions of ``prompt``; nothing is sent yet.

        Each sample of each prompt element is one *draw*, numbered in the
        order calls are built, and cached on its own; repeated identical calls
        in one graph are independent draws. Parameters given here override the
        model's defaults for this call.

        Parameters
        ----------
        prompt
            A str, a list or array of str (one batch), a text Variable (a
            template, ``+``, an input), a ``Ragged`` (every item of every row
            in one batch), or an ``outlines.chat`` conversation.
        num_samples
            Samples per prompt element (an integer >= 1). Given, the result
            always gets a LAST axis of this size, 1 included, so code written
            for k samples (an ``outlines.fn`` over that axis) works at k = 1.
            The default, ``None``, is one draw per element and adds no axis.
        max_tokens, temperature, stop, seed
            Generation parameters for this call. ``temperature=0`` is greedy:
            the samples of a prompt collapse into one draw (one request).
            ``seed`` selects another stream of draws.
        choices
            Constrain the text to one of these strings.
        regex
            Constrain the text to match this whole pattern.
        json_schema
            Constrain the text to this JSON schema (a ``dict``) or pydantic
            model class; the result is the parsed value (a ``dict`` or an
            instance), not the text.
        **params
            Other generation parameters the backend takes by name: ``top_p``
            and its ``generation_extras`` (``logit_bias``,
            ``presence_penalty``, ``frequency_penalty`` for OpenAI; ``top_k``
            for Anthropic; ``top_k``, ``repetition_penalty``,
            ``no_repeat_ngram_size`` for local models); and, for hosted
            models, ``extra_body``: a dict of further request fields sent
            as they are, unchecked (part of the cache key).

        Returns
        -------
        Variable
            The prompt's shape, plus a trailing axis of ``num_samples`` when it
            is given. With a constraint, a text that breaks it is
            asked again (a new draw number) up to the backend's
            ``max_retries``, then fails with ``ConstraintError``.

        Raises
        ------
        GraphBuildError
            At once, naming the model: a ``num_samples`` that is not an integer
            >= 1, a prompt constant that is not text, an unknown option (with
            the closest valid one), an invalid generation parameter, an empty
            choice list, a pattern or schema that does not compile, two
            constraints at once, or a constraint with ``stop``.

        Examples
        --------
        >>> import outlines
        >>> from outlines import models
        >>> llm = models.from_function(lambda prompt: prompt.upper(), name="upper")
        >>> question = outlines.string("question")
        >>> answers = llm("Q: " + question, num_samples=2)
        >>> answers.eval({question: ["a", "b"]}).shape
        (2, 2)
        >>> llm("Q: " + question, num_samples=1).eval({question: ["a", "b"]}).shape
        (2, 1)
        >>> yes_no = models.from_function(lambda prompt: "yes", name="yes")
        >>> yes_no("Is it?", choices=["yes", "no"]).eval()
        'yes'
        """
        if (num_samples is None and max_tokens is None and temperature is None and stop is None and seed is None
                and choices is None and regex is None and json_schema is None and not params
                and ((type(prompt) is Variable and not prompt.ragged)
                     or (type(prompt) is Constant and type(prompt.value) is str))):
            # the common call, built thousands of times in a loop: the model's defaults, one draw
            default = self._default
            if default is not None and default[0] is self.defaults:  # (``fallback`` sets its defaults once built)
                return Apply(default[1], [prompt]).outputs[0]
        merged, constraint = self._call_params(params, max_tokens=max_tokens, temperature=temperature, stop=stop,
                                               seed=seed, choices=choices, regex=regex, json_schema=json_schema)
        return _applied(self._op(merged, num_samples), prompt, constraint)

    def _op(self, params: GenerationParams, num_samples: int | None) -> Generate:
        """The ``Generate`` of ``params`` and ``num_samples``, made once (``_default`` when it is the defaults')."""
        op = self._ops.get((params, num_samples)) if num_samples is None or type(num_samples) is int else None
        if op is None:
            op = Generate(self.backend, params, num_samples)
            self._ops[params, op.num_samples if op.sample_axis else None] = op
        if not op.sample_axis and params == self.defaults:
            self._default = (self.defaults, op)
        return op

    def _call_params(self, params: dict[str, Any], *, choices: Any, regex: Any, json_schema: Any,
                     **named: Any) -> tuple[GenerationParams, Constraint | None]:
        """The model's defaults with one call's options over them, checked (what its ``Generate`` draws with),
        and the call's own constraint.

        ``params`` are the options given by name only (``**params`` of
        ``__call__``), ``named`` the generation parameters ``__call__`` names;
        ``choices``/``regex``/``json_schema`` become the constraint. Raises
        ``GraphBuildError`` naming the model for an unknown option or a value
        the backend refuses.
        """
        from outlines.backends.constraints import make_constraint

        where = f"Generate[{self.backend.kind}:{self.backend.model_name}]"
        if params:
            refuse_unknown(where, params, (*CALL_OPTIONS, *generation_names(self.backend)), GraphBuildError)
        try:
            params = unfold_extra_body(params, self.backend)
            constraint = make_constraint(choices, regex, json_schema)
            merged = self.defaults.merged(**named, constraint=constraint, **params)
            if merged is not self.defaults:
                self.backend.check_params(merged)
        except ValueError as exc:
            raise GraphBuildError(f"{where}: {exc}") from None
        return merged, constraint

    def render(self, prompt: Any, *, tokens: bool = False) -> Any:
        """What the model is sent for one prompt, after any chat template: nothing is generated.

        Parameters
        ----------
        prompt
            A string, an ``outlines.chat`` conversation, or a Variable holding
            one (it is evaluated first, with the default options).
        tokens
            Return the token ids instead of the text (local models only).

        Returns
        -------
        str or list
            ``models.transformers``: the exact text the model reads (its chat
            template applied, ``system_prompt`` first, unless ``chat=False``),
            or its token ids. ``models.openai``: the ``messages`` sent (the
            server applies its own template). ``openai_completion`` and
            ``from_function``: the prompt text as sent.

        Raises
        ------
        TypeError
            For a prompt that is not one text, or ``tokens=True`` on a model
            that does not tokenize itself.

        Examples
        --------
        >>> from outlines import chat
        >>> echo = from_function(lambda p: p, name="echo")
        >>> echo.render("What is 2 + 2?")
        'What is 2 + 2?'
        >>> openai("gpt-4o-mini", api_key="sk-x", system_prompt="Be brief.").render("Hi")
        [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]
        """
        value = prompt.eval() if isinstance(prompt, Variable) else prompt
        if not isinstance(value, str):
            raise TypeError(f"render takes one prompt (a str or a conversation), got {type(value).__name__} "
                            f"{value!r:.60}")
        return self.backend.prompt_tokens(value) if tokens else self.backend.render_prompt(value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Model) and (self.backend, self.defaults) == (other.backend, other.defaults)

    def __hash__(self) -> int:
        return hash((self.backend, self.defaults))

    def __repr__(self) -> str:
        return f"Model({self.backend!r}, {self.defaults})"


#: The keywords of a model call that are not generation parameters.
def _applied(op: Generate, prompt: Any, constraint: Constraint | None) -> Variable:
    """``op`` applied to ``prompt``: a ragged prompt flattened into one batch and regrouped, a JSON value parsed."""
    from outlines.backends.constraints import Parse

    ragged = isinstance(prompt, Variable) and prompt.ragged
    out = op(Flatten()(prompt) if ragged else prompt)  # ragged: one batch over every row
    if constraint is not None and constraint.kind == "json_schema":
        out = Parse(constraint)(out)  # the cache keeps the text; values are parsed on the way out
    return Regroup()(out, prompt) if ragged else out


CALL_OPTIONS = ("num_samples", "choices", "regex", "json_schema")


def generation_names(backend: Backend | type[Backend]) -> tuple[str, ...]:
    """The generation parameters ``backend`` takes by name, ``extra_body`` included where it has a server."""
    extras = sorted(backend.generation_extras)
    return (*COMMON_PARAMS, *extras, *(("extra_body",) if backend.takes_extra_body else ()))


def refuse_unknown(
    where: str, given: Iterable[str], valid: Iterable[str], error: type[Exception] = TypeError
) -> None:
    """Raise ``error`` for the first name of ``given`` not in ``valid``, naming the closest valid one.

    Parameters
    ----------
    where
        What refuses (a model, a call), first in the message.
    given, valid
        The option names given, and those accepted.
    error
        The exception class raised (``GraphBuildError`` for a call).

    Raises
    ------
    TypeError
        (or ``error``) ``"<where>: unknown option 'num_sample'; did you mean num_samples? (valid: ...)"``.

    Examples
    --------
    >>> refuse_unknown("models.openai", ["temprature"], ["temperature", "top_p"])
    Traceback (most recent call last):
    ...
    TypeError: models.openai: unknown option 'temprature'; did you mean temperature? (valid: temperature, top_p)
    """
    names = sorted(set(valid))
    for name in given:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise error(f"{where}: unknown option {name!r}{hint} (valid: {', '.join(names)})")


def unfold_extra_body(params: Mapping[str, Any], backend: Backend) -> dict[str, Any]:
    """``params`` with the fields of its ``extra_body`` dict among them, as the wire sends them."""
    out = dict(params)
    body = out.pop("extra_body", None)
    if body is None:
        return out
    if not isinstance(body, Mapping) or not all(isinstance(k, str) for k in body):
        raise ValueError(f"extra_body must be a dict of request fields to values, got {body!r:.60}")
    named = [k for k in body if k in (*CALL_OPTIONS, *generation_names(backend), "constraint")]
    if named:
        raise ValueError(f"extra_body holds {named[0]!r}, an option of its own: give {named[0]}= by name")
    return {**body, **out}


def _keywords(backend_class: type[Backend]) -> set[str]:
    # The keyword-only options of a backend's constructor, following **options up its bases.
    names: set[str] = set()
    for klass in backend_class.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters.values()
        names |= {p.name for p in parameters if p.kind is p.KEYWORD_ONLY}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return names


def _split(
    where: str, options: dict[str, Any], backend_class: type[Backend], *named: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    # Generation defaults apart from backend options; an unknown name is refused before anything is built.
    generation = generation_names(backend_class)
    refuse_unknown(where, options, {*generation, *_keywords(backend_class), *named})
    params = {k: options.pop(k) for k in list(options) if k in generation}
    return params, options


def from_function(
    fn: Callable[..., Any],
    *,
    batched: bool = False,
    name: str | None = None,
    version: str | None = None,
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
    version
        Declares the function's identity yourself: name, code and
        ``version`` then make the identity and captured state is not
        inspected. Without it the identity also covers the state the
        function captures (closure variables, defaults, ``functools.partial``
        arguments, a bound method's or callable object's attributes); state
        that cannot be hashed (a lock, a client) makes the model group only
        with itself and skip the disk cache, with a one-time ``CacheWarning``.
    max_batch, max_concurrency
        Prompts per call (default unlimited) and calls in flight (default 64
        for a non-batched function); positive integers or ``None``.
    **defaults
        Default generation parameters (recorded in cache keys): those every
        model takes and the named extras of ``outlines.draws.params.EXTRA_PARAMS``.

    Returns
    -------
    Model

    Raises
    ------
    TypeError
        For an unknown option, naming the closest valid one.
    ValueError
        When ``max_batch`` or ``max_concurrency`` is not a positive integer.

    Examples
    --------
    >>> echo = from_function(lambda p: p.upper())
    >>> echo("hi").eval(cache=False)
    'HI'
    """
    from outlines.backends.function import FunctionBackend

    refuse_unknown(f"from_function({name or getattr(fn, '__name__', type(fn).__name__)!r})", defaults,
                   {*generation_names(FunctionBackend), "batched", "name", "version", "max_batch", "max_concurrency"})
    backend = FunctionBackend(
        fn, batched=batched, name=name, version=version, max_batch=max_batch, max_concurrency=max_concurrency
    )
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
        ``max_retries``; ``system_prompt``; ``dialect``, ``"openai"`` for
        OpenAI's API (the default for its host: the spec's fields only) or
        ``"compatible"`` (vLLM, SGLang...: their ``guided_*`` fields for
        constraints); ``timeout`` and ``connect_timeout``
        in seconds; ``total_timeout``, the most seconds one request may take;
        ``rpm`` and ``tpm`` budgets; ``max_retry_after``; ``headers``). Models
        that differ only in ``api_key`` (or ``headers``) never share a batch,
        and share cache entries. ``price=(input_per_1M, output_per_1M)`` is
        what the model costs (for ``explain``, traces and ``Budget(cost=)``);
        ``tokenizer=`` is a callable ``text -> tokens (or count)`` that counts
        prompt tokens the way the server does (else tiktoken, when it knows
        the model and its encoding is already on disk, else an estimate of 4
        characters per token: ``outlines.backends.usage``); a ``Price`` (or a
        mapping of its fields) also prices cached input and the batch
        discount. ``prefix_warmup`` (default ``True``): requests sharing a head
        the server caches (1,024+ tokens) go one first, the rest once its
        response starts; a number bounds that wait in seconds, ``False`` sends
        all at once (``outlines.backends.warmup``). See
        ``outlines.backends.openai``.

    Returns
    -------
    Model
        Calling it builds model calls; nothing is sent until evaluation. A
        batch of prompts is one request per prompt (``num_samples`` goes as
        ``n``); a conversation goes as its messages.

    Raises
    ------
    ValueError
        For an option that is not valid (``max_batch``/``max_concurrency``
        that are not positive integers, a non-positive timeout, ``rpm=0``...)
        or a setting outside OpenAI's documented range (``temperature`` 0 to
        2, ``top_p`` 0 to 1, at most 4 ``stop`` sequences; for reasoning
        models, o-series and GPT-5, ``temperature`` and ``top_p`` only 1,
        and no ``stop`` for o3 and o4-mini), naming it.

    Examples
    --------
    >>> llm = openai("gpt-4o-mini", api_key="sk-example", max_tokens=64, temperature=0.7)
    >>> llm.backend.identity  # no secret in it
    ('openai', 'gpt-4o-mini', 'https://api.openai.com/v1', None)
    >>> "sk-example" in repr(llm)
    False
    """
    from outlines.backends.openai import OpenAIChatBackend

    params, backend_options = _split("models.openai", dict(options), OpenAIChatBackend, "base_url", "api_key")
    return Model(OpenAIChatBackend(model, base_url=base_url, api_key=api_key, **backend_options), **params)


def openai_completion(
    model: str, *, base_url: str | None = None, api_key: str | None = None, **options: Any
) -> Model:
    """A legacy ``/v1/completions`` model that sends many prompts per request.

    Prompts are raw text (no chat template: right for few-shot prompts); a
    conversation is sent as its JSON text. Servers that refuse a list of
    prompts (``transformers serve``) get one prompt per request, and servers
    that ignore ``n`` one request per sample; each quirk is noted once per
    base URL.

    Parameters
    ----------
    model
        Model name, as the server knows it.
    base_url
        API root (default ``OPENAI_BASE_URL`` or ``https://api.openai.com/v1``).
    api_key
        Secret key (default ``OPENAI_API_KEY``); never shown or cached.
    **options
        The options of ``openai`` except ``system_prompt``; ``max_batch``
        (default 128) bounds the draws in one request: prompts x ``n``, whole
        prompts only (a prompt with more samples goes in pieces).

    Returns
    -------
    Model

    Raises
    ------
    ValueError
        For an option that is not valid, naming it.

    Examples
    --------
    >>> llm = openai_completion("my-model", base_url="http://127.0.0.1:8000/v1", api_key="local", max_tokens=16)
    >>> llm.backend.identity[:3]
    ('openai_completion', 'my-model', 'http://127.0.0.1:8000/v1')
    """
    from outlines.backends.openai import OpenAICompletionBackend

    params, backend_options = _split(
        "models.openai_completion", dict(options), OpenAICompletionBackend, "base_url", "api_key"
    )
    return Model(OpenAICompletionBackend(model, base_url=base_url, api_key=api_key, **backend_options), **params)


def anthropic(model: str, *, base_url: str | None = None, api_key: str | None = None, **options: Any) -> Model:
    """An Anthropic model through the Messages API; see ``AnthropicBackend``.

    Parameters
    ----------
    model
        Model name, e.g. ``"claude-haiku-4-5"``.
    base_url
        API root with its version, as for ``openai`` (default
        ``ANTHROPIC_BASE_URL`` or ``https://api.anthropic.com/v1``); the
        ``anthropic`` SDK's spelling without ``/v1`` is the same URL.
    api_key
        Secret key (default ``ANTHROPIC_API_KEY``); sent as ``x-api-key``, never
        shown or cached.
    **options
        Generation defaults (``max_tokens``, default 1024, which the API
        requires; ``temperature`` between 0 and 1 or ``top_p``, not both,
        and neither for the models that refuse them; ``stop``; extras
        such as ``top_k``) and the backend options of ``openai`` (``max_batch``,
        default 16 draws per call; ``max_concurrency``; ``max_retries``;
        ``system_prompt``; timeouts; ``rpm``/``tpm``; ``headers``; ``price``;
        ``tokenizer``; ``prefix_warmup``, which also places a ``cache_control``
        breakpoint where a shared head ends). Each sample is its own request (the API has no ``n``);
        ``seed`` is part of the cache key but not sent (the API has none).
        Constraints (``choices=``, ``regex=``, ``json_schema=``) are checked on
        the text and retried. See ``outlines.backends.anthropic``.

    Returns
    -------
    Model

    Raises
    ------
    ValueError
        For an option that is not valid, naming it.

    Examples
    --------
    >>> claude = anthropic("claude-haiku-4-5", api_key="sk-ant-x", temperature=0.5)
    >>> claude.defaults.max_tokens, claude.backend.identity[0]
    (1024, 'anthropic')
    """
    from outlines.backends.anthropic import DEFAULT_MAX_TOKENS, AnthropicBackend

    params, backend_options = _split("models.anthropic", dict(options), AnthropicBackend, "base_url", "api_key")
    params.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    return Model(AnthropicBackend(model, base_url=base_url, api_key=api_key, **backend_options), **params)


def fallback(primary: Model, *others: Model, on: Any = (429, "5xx", "timeout")) -> Model:
    """A model whose draws that fail on ``primary`` (after its retries) go to the next of ``others``.

    Parameters
    ----------
    primary, *others
        Models tried in order, each with its own retries, limits and
        credentials. Draws carry the generation parameters of the call (the
        primary's defaults, overridden per call) to whichever model answers.
    on
        What fails over: HTTP statuses (``429``), ``"5xx"``, ``"4xx"``, and
        ``"timeout"`` (timeouts and dropped connections). Other errors fail
        the draw at once.

    Returns
    -------
    Model
        Its draws are cached under the key of the model that answered them
        (cache keys stay per model); a trace's ``RequestRecord.model`` names
        the model each wire request asked. See ``outlines.backends.fallback``.

    Examples
    --------
    >>> a = openai("gpt-4o-mini", base_url="http://127.0.0.1:1/v1", api_key="k", max_tokens=64)
    >>> b = openai("gpt-4o", base_url="http://127.0.0.1:2/v1", api_key="k")
    >>> fallback(a, b).backend.model_name
    'gpt-4o-mini'
    """
    from outlines.backends.fallback import FallbackBackend

    chain = (primary, *others)
    if not all(isinstance(m, Model) for m in chain):
        raise TypeError(f"models.fallback takes models (models.openai(...)...), got {[type(m).__name__ for m in chain]}")
    model = Model(FallbackBackend([m.backend for m in chain], on=on))
    model.defaults = primary.defaults
    return model


def transformers(
    model_id_or_path: str,
    *,
    device: str | None = None,
    dtype: str | None = None,
    gguf_file: str | None = None,
    chat: bool | None = None,
    system_prompt: str | None = None,
    **options: Any,
) -> Model:
    """A HuggingFace causal LM, generating in batches with left padding.

    Parameters
    ----------
    model_id_or_path
        Hub id or local folder, loaded with ``from_pretrained``; or a
        ``.gguf`` file (read by transformers with the ``gguf`` package).
    device
        ``"cuda"``, ``"mps"``, ``"cpu"``; default: the first available.
    dtype
        Torch dtype name (``"float32"``...); default: the one the device
        computes natively (bfloat16 on a CPU with AVX512-BF16 or AMX),
        named in the repr, the trace and the cache key.
    gguf_file
        A GGUF checkpoint inside the folder ``model_id_or_path``.
    chat
        ``None``: prompts go through the tokenizer's chat template when it has
        one (a plain prompt is one user message, an ``outlines.chat``
        conversation its own messages); ``True``: require a template;
        ``False``: raw text, for prompts the model should continue (few-shot
        examples, completion-style prompts, base models). ``Model.render``
        shows the text the model reads.
    system_prompt
        A system message before each prompt (chat templates only).
    **options
        Generation defaults (``max_tokens``, default 256 new tokens within the
        context; ``temperature``, default 1.0: sampling, like OpenAI's API, so
        ``num_samples`` gives different samples, and ``0`` is greedy;
        ``top_p``, ``stop``, ``seed``; extras ``top_k``,
        ``repetition_penalty``) and
        backend options: ``max_batch`` (default: up to 128 rows on a CPU,
        256 on a GPU), ``max_batch_tokens`` (token budget of one forward
        batch; default: what the key/value cache may take of the memory
        free once the model is loaded), ``truncation`` (keep the end of
        a prompt too long for the context instead of raising),
        ``share_prefix`` (default ``True``: prefill each prompt, each head a
        group of prompts shares and a batch's common prefix once),
        ``group_min_tokens`` (default 16: the shortest such head). Seeds,
        prefix sharing and the worker thread are described in
        ``outlines.backends.transformers``.

    Returns
    -------
    Model
        Nothing is loaded until the first batch needs the model
        (``model.backend.load()`` loads it now); ``import outlines`` never
        imports torch.

    Raises
    ------
    ValueError
        For an option that is not valid, naming it. Loading errors (a missing
        folder, a missing ``gguf`` package, ``chat=True`` without a template)
        surface when the model is first used, naming it.

    Examples
    --------
    >>> from outlines.testing import smollm2_gguf
    >>> llm = transformers(smollm2_gguf(), system_prompt="Be brief.", max_tokens=48, temperature=0)  # doctest: +SKIP
    >>> llm("What is 2 + 2?").eval()  # doctest: +SKIP
    'The answer is 4.'
    """
    from outlines.backends.transformers import TransformersBackend

    params, backend_options = _split("models.transformers", dict(options), TransformersBackend,
                                     "device", "dtype", "gguf_file", "chat", "system_prompt")
    backend = TransformersBackend(
        model_id_or_path, device=device, dtype=dtype, gguf_file=gguf_file, chat=chat, system_prompt=system_prompt,
        **backend_options,
    )
    return Model(backend, **params)
