"""Structured outputs: what a model call may write, checked, parsed and decoded under.

``make_constraint`` builds and validates a ``Constraint`` (``outlines.draws.params``)
when the graph is built. Two ways to obey it. Local models decode under it:
``TokenMasks`` keeps one xgrammar matcher per constrained row of a batch and
masks the logits of those rows at every step. After a prompt that ends
mid-line (``"Text: ... ->"``) a model writes the next word with its leading
space, as one token (``" food"``): a row under choices or a pattern may then
start with one space (``Constraint.spaced``), stripped from its text
(``Constraint.unspaced``); without that, the mask forbids the token the model
wants and every row drifts to the same label. HTTP servers are asked in their
own fields (``openai.wire_constraint``, in ``Constraint.json_form``).

Every backend's texts also go through ``generate_valid``: an answer in
``json_form`` is read back (``unwrap``), and a draw whose text breaks its
constraint is asked again with a new draw number, a bounded number of times,
then fails on its own with a ``ConstraintError`` quoting the text; the batch's
other draws are kept. A greedy draw is never asked again: it fails at once.

xgrammar was chosen after measuring it against llguidance and outlines-core
(``benchmarks/bench_constraint_engines.py``): on SmolLM2's 49k-token
vocabulary one batch step of 32 rows cost 0.18 ms of masks with xgrammar,
4.2 ms with llguidance and 76 ms with outlines-core.
"""
from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any, Awaitable, Callable, Mapping, Sequence

from outlines.backends.base import BatchReport
from outlines.draws import Constraint, Draw
from outlines.draws.params import WRAPPER
from outlines.common.errors import install_hint
from outlines.common.keys import canonical
from outlines.graph.basic import Apply, Op, as_variable
from outlines.graph.ops import broadcast_map
from outlines.graph.traits import Traits

__all__ = ["ConstraintError", "Parse", "TokenMasks", "generate_valid", "make_constraint"]

KINDS = ("choices", "regex", "json_schema")
#: Draw numbers of retries: attempt ``a`` of draw ``d`` is draw ``d + a * RETRY_STRIDE``.
RETRY_STRIDE = 1 << 20


class ConstraintError(RuntimeError):
    """A draw's text broke its constraint after every allowed attempt."""


def make_constraint(
    choices: Sequence[str] | None = None, regex: str | None = None, json_schema: Any = None
) -> Constraint | None:
    """Validate the structured-output arguments of a model call; ``None`` when none is given.

    Parameters
    ----------
    choices
        Non-empty list of distinct strings the output must be one of.
    regex
        A pattern the whole output must match.
    json_schema
        A JSON-schema dict (or JSON string), or a pydantic model class.

    Returns
    -------
    Constraint or None

    Raises
    ------
    ValueError
        Naming the argument: more than one given, empty or non-string choices,
        a pattern or schema that does not compile (with Python's ``re`` or
        ``jsonschema``, and with xgrammar when it is installed).

    Examples
    --------
    >>> make_constraint(choices=["yes", "no"])
    Constraint(choices='["yes","no"]')
    """
    given = [name for name, v in (("choices", choices), ("regex", regex), ("json_schema", json_schema)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of choices=, regex=, json_schema=; got {', '.join(given)}")
    if not given:
        return None
    if choices is not None:
        return _choices(choices)
    if regex is not None:
        return _regex(regex)
    return _schema(json_schema)


def _choices(choices: Any) -> Constraint:
    if isinstance(choices, str) or not isinstance(choices, (list, tuple)):
        raise ValueError(f"choices= must be a list of strings, got {type(choices).__name__} {choices!r:.60}")
    if not choices:
        raise ValueError("choices= is empty; give at least one string")
    bad = [c for c in choices if not isinstance(c, str) or not c]
    if bad:
        raise ValueError(f"choices= must hold non-empty strings; got {bad[0]!r:.60}")
    unique = list(dict.fromkeys(choices))
    constraint = Constraint("choices", canonical(unique).decode())
    _engine_check(constraint, "choices=")
    return constraint


def _regex(pattern: Any) -> Constraint:
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"regex= must be a non-empty pattern string, got {pattern!r:.60}")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"regex= {pattern!r:.80} is not a valid pattern: {exc}") from None
    constraint = Constraint("regex", pattern)
    _engine_check(constraint, "regex=")
    return constraint


def _schema(schema: Any) -> Constraint:
    target = None
    if isinstance(schema, type):
        if not hasattr(schema, "model_json_schema"):
            raise ValueError(f"json_schema= must be a dict or a pydantic model class, got the class {schema.__name__}")
        target, schema = schema, schema.model_json_schema()
    elif isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"json_schema= string is not JSON: {exc}") from None
    if not isinstance(schema, Mapping):
        raise ValueError(f"json_schema= must be a dict or a pydantic model class, got {type(schema).__name__}")
    try:
        text = canonical(schema).decode()  # the one key normaliser: {"a": 1.0} is {"a": 1}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"json_schema= is not JSON-able: {exc}") from None
    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    if jsonschema is not None:
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"json_schema= is not a valid JSON schema: {exc.message}") from None
    constraint = Constraint("json_schema", text, target)
    _engine_check(constraint, "json_schema=")
    return constraint


def _engine_check(constraint: Constraint, argument: str) -> None:
    """Compile the grammar without a tokenizer, so an unsupported one fails at build time."""
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        return
    try:
        _grammar(constraint)
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError and friends
        raise ValueError(f"{argument} cannot be compiled for constrained decoding: {str(exc)[:300]}") from None


def _grammar(constraint: Constraint) -> Any:
    import xgrammar as xgr

    if constraint.leading_space:
        return xgr.Grammar.concat(xgr.Grammar.from_ebnf('root ::= " "?'), _grammar(replace(constraint, leading_space=False)))
    if constraint.kind == "choices":
        return xgr.Grammar.from_ebnf("root ::= " + " | ".join(_ebnf_literal(c) for c in constraint.choices))
    if constraint.kind == "regex":
        return xgr.Grammar.from_regex(constraint.value)
    grammar = xgr.Grammar.from_json_schema(constraint.value, any_whitespace=False)
    # xgrammar (0.2.9) lets length-limited strings hold raw control characters,
    # which JSON forbids (seen on the tiny model: '"\x08hoa"'); close that gap.
    text = str(grammar)
    if _LOOSE_STRING_CHARACTER in text:
        grammar = xgr.Grammar.from_ebnf(text.replace(_LOOSE_STRING_CHARACTER, _JSON_STRING_CHARACTER))
    return grammar


_LOOSE_STRING_CHARACTER = r'[^\"\\\r\n]'
_JSON_STRING_CHARACTER = r'[^\0-\x1f\"\\\r\n]'


def _ebnf_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class Parse(Op):
    """Parse constrained completions into their values (a ``dict`` or a pydantic instance), elementwise."""

    __props__ = ("constraint",)
    traits = Traits(elementwise=True)

    def __init__(self, constraint: Constraint) -> None:
        self.constraint = constraint

    @property
    def name(self) -> str:
        target = self.constraint.target
        return f"Parse[{target.__name__ if target is not None else 'json'}]"

    def describe(self) -> dict[str, Any]:
        target = self.constraint.target
        into = f"{target.__module__}.{target.__qualname__}" if target is not None else "JSON"
        return {"kind": "op", "title": self.name, "lines": [f"parse {into} ({self.constraint.kind})"]}

    def make_node(self, *inputs: Any) -> Apply:
        return Apply(self, [as_variable(inputs[0], array=True)])

    def perform(self, *values: Any) -> Any:
        return broadcast_map(self.constraint.parse, values)


# -- token masks for local models ------------------------------------------------------------


class _Compiler:
    """One xgrammar compiler per tokenizer, with its compiled grammars."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        try:
            import xgrammar as xgr
        except ImportError:
            raise ImportError(
                f"constrained decoding with transformers needs xgrammar: {install_hint('structured')}"
            ) from None
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info)
        self.compiled: dict[Constraint, Any] = {}

    def matcher(self, constraint: Constraint, end_tokens: Sequence[int]) -> Any:
        import xgrammar as xgr

        compiled = self.compiled.get(constraint)
        if compiled is None:
            compiled = self.compiled[constraint] = self.compiler.compile_grammar(_grammar(constraint))
        return xgr.GrammarMatcher(compiled, override_stop_tokens=list(end_tokens) or None)


#: (id of tokenizer, vocab size) -> (the tokenizer, kept so its id is not reused; its compiler)
_compilers: dict[tuple[int, int], tuple[Any, _Compiler]] = {}


def compiler_for(tokenizer: Any, vocab_size: int) -> _Compiler:
    """The compiler of a loaded tokenizer (built once: it scans the vocabulary)."""
    key = (id(tokenizer), vocab_size)
    entry = _compilers.get(key)
    if entry is None or entry[0] is not tokenizer:
        entry = _compilers[key] = (tokenizer, _Compiler(tokenizer, vocab_size))
    return entry[1]


class TokenMasks:
    """Per-row grammar state of one generation batch; masks the logits of constrained rows.

    Parameters
    ----------
    compiler
        ``compiler_for(tokenizer, vocab_size)``.
    constraints
        One entry per output row: its ``Constraint`` or ``None``.
    end_tokens
        Token ids that end a row (allowed, and then forced, once its grammar is complete).
    """

    def __init__(self, compiler: _Compiler, constraints: Sequence[Constraint | None], end_tokens: Sequence[int]) -> None:
        import torch
        import xgrammar as xgr

        self.rows = [i for i, c in enumerate(constraints) if c is not None]
        self.matchers = {i: compiler.matcher(c, end_tokens) for i, c in enumerate(constraints) if c is not None}
        self.bitmask = xgr.allocate_token_bitmask(len(constraints), compiler.info.vocab_size)
        self.end_tokens = list(end_tokens)
        self.done: set[int] = set()
        self.started = False
        self._torch = torch
        self._xgr = xgr

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """Advance each constrained row by its last token, then mask its next one."""
        if not self.rows:
            return scores
        if self.started:
            last = input_ids[:, -1].tolist()
            for row in self.rows:
                matcher = self.matchers[row]
                if row in self.done:
                    continue
                if matcher.is_terminated() or not matcher.accept_token(last[row]):
                    self.done.add(row)  # the row ended: from now on it may only write end tokens
        self.started = True
        forced: list[int] = []
        for row in self.rows:
            matcher = self.matchers[row]
            if row in self.done or matcher.is_terminated():
                forced.append(row)
            else:
                matcher.fill_next_token_bitmask(self.bitmask, row)
        scores = scores.clone() if scores.dtype == self._torch.float32 else scores.float()
        active = [row for row in self.rows if row not in forced]
        if active:
            self._xgr.apply_token_bitmask_inplace(scores, self.bitmask[: scores.shape[0]].to(scores.device),
                                                  indices=active)
        if forced:
            keep = scores[forced][:, self.end_tokens].clone()
            scores[forced] = float("-inf")
            scores[self._torch.tensor(forced).unsqueeze(-1), self._torch.tensor(self.end_tokens)] = keep
        return scores


# -- checking texts from any backend ----------------------------------------------------------

Generate = Callable[[Any, Sequence[Any], BatchReport], Awaitable[tuple[list[str], Any]]]


async def generate_valid(
    generate: Generate, backend: Any, draws: Sequence[Draw], report: BatchReport
) -> tuple[list[str], Any]:
    """Run ``generate(backend, draws, report)``, asking again for draws whose text breaks its constraint.

    Each invalid sampled draw is retried with a new draw number (``draw +
    attempt * RETRY_STRIDE``) up to ``backend.max_retries`` times (default 3);
    an invalid greedy draw (``temperature=0``) fails at once, since asking
    again with the same parameters gives the same text. Valid
    texts are reported with ``report.result`` as soon as they are known (so
    only they reach the cache); a draw the backend failed is reported with
    ``report.failure`` and not retried; a draw still invalid after every
    attempt is reported with ``report.failure`` and a ``ConstraintError``
    quoting its text, so only that draw fails and the batch's others are kept.
    Usage, wire requests, model loads and request permits go to ``report``.
    """
    constraints = [d.params.constraint for d in draws]
    if not any(constraints):
        return await generate(backend, draws, report)

    async def attempt(positions: list[int], batch: list[Draw]) -> tuple[list[Any], Any, BatchReport]:
        """One call for ``batch`` (draws at ``positions``): valid results and failures forwarded."""

        def on_result(index: int, text: str) -> None:
            if 0 <= index < len(positions):
                constraint = constraints[positions[index]]
                if constraint is not None:
                    text = constraint.unwrap(text)
                if constraint is None or constraint.is_valid(text):
                    report.result(positions[index], text)

        def on_failure(index: int, error: BaseException) -> None:
            if 0 <= index < len(positions):
                report.failure(positions[index], error)

        inner = BatchReport(on_result=on_result, on_failure=on_failure, on_request=report.request,
                            on_model_loaded=report.model_loaded, request_limit=report.request_limit)
        try:
            texts, worker = await generate(backend, batch, inner)
        finally:
            report.usage(*inner.tokens)
        if isinstance(texts, list) and len(texts) == len(batch):  # the reports win over the list
            texts = [inner.results.get(i, text) for i, text in enumerate(texts)]
            texts = [_unwrapped(constraints[positions[i]], text) for i, text in enumerate(texts)]
        return texts, worker, inner

    texts, worker, inner = await attempt(list(range(len(draws))), list(draws))
    if not isinstance(texts, list) or len(texts) != len(draws):
        return texts, worker  # the caller names the wrong count
    texts = list(texts)
    bad = []
    for i, text in enumerate(texts):
        if i in inner.failures:
            continue
        constraint = constraints[i]
        if constraint is None or constraint.is_valid(text):
            report.result(i, text)
        else:
            bad.append(i)
    for i in (i for i in bad if draws[i].params.deterministic):
        rule = constraints[i]
        assert rule is not None
        report.failure(i, ConstraintError(
            f"the draw broke its {rule.kind} constraint: {_reason(rule, texts[i])}; not asked again: at "
            "temperature=0 every attempt writes the same text (sample with temperature > 0 to retry, or use "
            "a backend that enforces the constraint)"
        ))
    bad = [i for i in bad if not draws[i].params.deterministic]
    attempts = int(getattr(backend, "max_retries", 3))
    for number in range(1, attempts + 1):
        if not bad:
            break
        retry = [replace(draws[i], draw=draws[i].draw + number * RETRY_STRIDE) for i in bad]
        again, worker, inner = await attempt(bad, retry)
        if not isinstance(again, list) or len(again) != len(retry):
            raise ConstraintError(f"{backend!r} returned {len(again)} completions for {len(retry)} retried draws")
        still = []
        for position, (i, text) in enumerate(zip(bad, again)):
            if position in inner.failures:
                continue
            texts[i] = text
            rule = constraints[i]
            if rule is None or rule.is_valid(text):
                report.result(i, text)
            else:
                still.append(i)
        bad = still
    for i in bad:
        constraint = constraints[i]
        assert constraint is not None
        report.failure(i, ConstraintError(
            f"the draw broke its {constraint.kind} constraint after {attempts + 1} attempts; "
            f"last: {_reason(constraint, texts[i])}"
        ))
    return texts, worker


def _unwrapped(constraint: Constraint | None, text: Any) -> Any:
    """``text`` as the constraint reads it: an answer in ``json_form`` unwrapped."""
    return constraint.unwrap(text) if constraint is not None and isinstance(text, str) else text


def _reason(constraint: Constraint, text: Any) -> str:
    """Why ``text`` breaks ``constraint``, in words."""
    if not isinstance(text, str):
        return f"got {type(text).__name__}"
    try:
        constraint.check(text)
    except ValueError as exc:
        return str(exc)
    return "valid"  # not reached: only invalid texts are explained
