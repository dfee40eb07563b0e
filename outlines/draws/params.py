"""What a model call asks for besides its prompt: ``GenerationParams`` and its ``Constraint``.

``GenerationParams`` holds the sampling parameters of one model call (hashable,
part of every draw's cache key); its ``constraint`` is the canonical form of
``choices=``, ``regex=`` or ``json_schema=``: its kind and one string (the
choices as a JSON list, the pattern, or the schema as canonical JSON, both
written by the one key normaliser ``outlines.common.keys.canonical``), which knows
how to check and parse a finished text. Building a constraint from a call's
arguments, and decoding under it, is the backends' part
(``outlines.backends.constraints``).
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping

from outlines.common.keys import canonical, normalize

if TYPE_CHECKING:
    import pydantic

__all__ = ["COMMON_PARAMS", "EXTRA_PARAMS", "WRAPPER", "Constraint", "GenerationParams"]

#: The property that holds a value whose schema's root is not an object (``Constraint.json_form``).
WRAPPER = "value"


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters of one model call; hashable, part of the cache key.

    ``None`` means "the backend's default". ``extra`` holds further
    backend-specific parameters (``logit_bias`` ...) as sorted items, values as
    given; they compare and hash by their canonical JSON text
    (``outlines.common.keys.canonical``), so ``{"a": 1, "b": 2}`` equals
    ``{"b": 2, "a": 1}`` and a list may be a value.
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    extra: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    _extra_text: bytes = field(init=False, repr=False, default=b"")
    #: Structured output (issue 13): choices, regex or JSON schema in its canonical
    #: form (its text made by ``outlines.common.keys.canonical``); see ``Constraint``.
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        if self.extra:
            try:
                text = canonical(dict(self.extra))
            except TypeError as exc:
                name = next(k for k, v in self.extra if not _keyable(v))
                raise ValueError(f"generation parameter {name!r} must be JSON data (it is part of the cache key): {exc}") from None
            object.__setattr__(self, "_extra_text", text)

    def __hash__(self) -> int:
        # Computed once: params are dict keys in planning and batching (draw
        # numbering, queues), and the generated dataclass hash runs in Python.
        known: int | None = self.__dict__.get("_hash")
        if known is None:
            known = hash((self.max_tokens, self.temperature, self.top_p, self.stop, self.seed,
                          self._extra_text, self.constraint))
            object.__setattr__(self, "_hash", known)
        return known

    def __getstate__(self) -> dict[str, Any]:
        # String hashes differ between processes: never ship the cached one.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @classmethod
    def create(cls, **kwargs: Any) -> GenerationParams:
        """Build params from user keywords, validating and normalizing them."""
        extra = {k: v for k, v in kwargs.items() if k not in _NAMED and v is not None}
        base = {k: v for k, v in kwargs.items() if k in _NAMED}
        return cls(extra=_items(extra), **base)._validated()

    def merged(self, **overrides: Any) -> GenerationParams:
        """Return a copy with every non-``None`` override applied (``self`` when there is none)."""
        set_ = {k: v for k, v in overrides.items() if v is not None}
        if not set_:  # the common call: a model's defaults as they are, no copy, no validation
            return self
        changes = {k: v for k, v in set_.items() if k in _NAMED}
        others = {k: v for k, v in set_.items() if k not in _NAMED}
        if others:
            extra = dict(self.extra)
            extra.update(others)
            changes["extra"] = _items(extra)
        return replace(self, **changes)._validated()

    def _validated(self) -> GenerationParams:
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        stop = tuple(stop or ())
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature is not None and not (0 <= float(self.temperature) <= 10):
            raise ValueError(f"temperature must be between 0 and 10, got {self.temperature!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.constraint is not None and stop:
            raise ValueError(f"stop={list(stop)!r} cannot be combined with {self.constraint.kind}=: the "
                             "constraint decides where the text ends")
        if stop != self.stop:
            object.__setattr__(self, "stop", stop)
        return self

    @property
    def deterministic(self) -> bool:
        """Greedy decoding: every draw of a prompt gives the same text."""
        return self.temperature is not None and float(self.temperature) == 0.0

    def to_dict(self) -> dict[str, Any]:
        """The parameters that are set, as a JSON-able dict (for keys and wires)."""
        out: dict[str, Any] = {}
        for name in ("max_tokens", "temperature", "top_p", "seed"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.stop:
            out["stop"] = list(self.stop)
        for key, value in self.extra:
            out[key] = copy.deepcopy(value)  # the wire may not change our value
        if self.constraint is not None:
            out["constraint"] = self.constraint.to_dict()
        return out

    def __str__(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def _keyable(value: Any) -> bool:
    try:
        canonical(value)
    except TypeError:
        return False
    return True


_NAMED = frozenset({"max_tokens", "temperature", "top_p", "stop", "seed", "constraint"})
#: The generation parameters every backend takes by name.
COMMON_PARAMS = ("max_tokens", "temperature", "top_p", "stop", "seed")
#: Further parameters some backends take by name (each declares its own in ``Backend.generation_extras``).
EXTRA_PARAMS = ("logit_bias", "presence_penalty", "frequency_penalty", "top_k", "repetition_penalty",
                "no_repeat_ngram_size")


def _items(extra: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Sorted ``(name, value)`` items, each value a private copy (callers may mutate theirs)."""
    return tuple(sorted((str(k), copy.deepcopy(v)) for k, v in extra.items()))


@dataclass(frozen=True)
class Constraint:
    """The canonical form of one structured-output constraint.

    ``kind`` is ``"choices"``, ``"regex"`` or ``"json_schema"``; ``value`` is
    the choices as a JSON list, the pattern, or the schema as canonical JSON
    (both from ``outlines.common.keys.canonical``, so equal content is equal text).
    ``target`` is the pydantic class parsed into (``json_schema`` only); it
    changes what ``parse`` returns, never the text, so it stays out of
    ``to_dict`` (cache keys). ``leading_space`` is for decoding only (see
    ``spaced``): the text a user gets never has that space, so it stays out too.
    """

    kind: str
    value: str
    target: type[pydantic.BaseModel] | None = None
    leading_space: bool = False

    def spaced(self) -> Constraint:
        """This constraint as decoded after a prompt ending mid-line: the text may start with one space.

        Only choices and patterns; a JSON value is written from its first character.
        """
        return replace(self, leading_space=True) if self.kind in ("choices", "regex") else self

    def unspaced(self, text: str) -> str:
        """``text`` without the one space a ``spaced`` row may start with, unless the constraint wants it."""
        if self.leading_space and text.startswith(" ") and not self.is_valid(text) and self.is_valid(text[1:]):
            return text[1:]
        return text

    def json_form(self) -> dict[str, Any]:
        """This constraint as one JSON schema with an object root, the form strict structured outputs take.

        Choices are a string ``enum``, a pattern a string ``pattern``
        (anchored: JSON Schema's patterns search, ours match whole), and a
        schema is itself. A root that is not an object (OpenAI's strict mode
        wants one) is wrapped as the property ``value`` of a closed object;
        ``unwrap`` reads the answer back.

        Examples
        --------
        >>> Constraint("choices", '["yes","no"]').json_form()["properties"]
        {'value': {'type': 'string', 'enum': ['yes', 'no']}}
        """
        if self.kind == "choices":
            schema: dict[str, Any] = {"type": "string", "enum": self.choices}
        elif self.kind == "regex":
            schema = {"type": "string", "pattern": f"^(?:{self.value})$"}
        else:
            schema = self.schema
        if not self.wrapped:
            return schema
        return {"type": "object", "properties": {WRAPPER: schema}, "required": [WRAPPER], "additionalProperties": False}

    @property
    def wrapped(self) -> bool:
        """Whether ``json_form`` wraps the value in an object (its own root is not one)."""
        return self.kind != "json_schema" or self.schema.get("type") != "object"

    def unwrap(self, text: str) -> str:
        """The text of an answer written in ``json_form``: the wrapped ``value``, as text (else ``text``).

        Only for a wrapped form, and only when ``text`` breaks the
        constraint as it is, so an answer that happens to look wrapped but is
        valid is kept. A string value is the text itself; any other value
        its JSON.
        """
        if not self.wrapped or not text.startswith("{") or self.is_valid(text):
            return text
        try:
            answer = json.loads(text)
        except ValueError:
            return text
        if not isinstance(answer, dict) or list(answer) != [WRAPPER]:
            return text
        value = answer[WRAPPER]
        if self.kind != "json_schema":
            return value if isinstance(value, str) else text
        return json.dumps(value, ensure_ascii=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, for cache keys and traces."""
        return {"kind": self.kind, "value": self.value}

    @property
    def choices(self) -> list[str]:
        return list(json.loads(self.value)) if self.kind == "choices" else []

    @property
    def schema(self) -> dict[str, Any]:
        return dict(json.loads(self.value)) if self.kind == "json_schema" else {}

    def check(self, text: str) -> None:
        """Raise ``ValueError`` saying why ``text`` breaks the constraint."""
        if self.kind == "choices":
            if text not in self.choices:
                raise ValueError(f"{text!r:.200} is not one of the choices {self.choices!r:.200}")
        elif self.kind == "regex":
            if re.fullmatch(self.value, text) is None:
                raise ValueError(f"{text!r:.200} does not match the pattern {self.value!r:.200}")
        else:
            self.parse(text)

    def is_valid(self, text: Any) -> bool:
        if not isinstance(text, str):
            return False
        try:
            self.check(text)
        except ValueError:
            return False
        return True

    def parse(self, text: str) -> Any:
        """The value of a text: itself for choices and regex, the parsed JSON otherwise.

        Raises ``ValueError`` for text that breaks the constraint.
        """
        if self.kind != "json_schema":
            return text
        if self.target is not None:
            import pydantic

            try:
                return self.target.model_validate_json(text)
            except pydantic.ValidationError as exc:
                raise ValueError(f"{text!r:.200} is not a valid {self.target.__name__}: {exc}") from None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{text!r:.200} is not JSON: {exc}") from None
        _validate_schema(value, self.schema, text)
        return value

    def __repr__(self) -> str:
        return f"Constraint({self.kind}={self.value!r:.80})"


# Keys see a constraint as its JSON form (the pydantic target changes no text).
normalize.register(Constraint, lambda constraint: normalize(constraint.to_dict()))


def _validate_schema(value: Any, schema: Mapping[str, Any], text: str) -> None:
    try:
        import jsonschema
    except ImportError:  # without jsonschema, JSON that parses is accepted
        return
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        raise ValueError(f"{text!r:.200} does not follow the schema: {exc.message}") from None
