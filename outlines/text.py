"""Text values: free string inputs, constants, prompt templates, and chains.

``@outlines.prompt`` turns a function whose docstring is a Jinja2 template into
a builder of ``Render`` nodes. The template's variables are checked against the
function's parameters when the function is decorated, not when it runs.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import jinja2
import jinja2.meta

from outlines.errors import GraphBuildError
from outlines.graph.basic import Apply, Constant, Op, Variable, as_variable
from outlines.graph.ops import broadcast_map
from outlines.graph.viz.drawing import shorten

__all__ = ["Prompt", "Render", "constant", "function", "prompt", "string"]


def string(name: str | None = None) -> Variable:
    """A free string input, bound at evaluation time (by Variable or by ``name``).

    Examples
    --------
    >>> question = string("question")
    >>> (question + "?").eval({"question": "why"})
    'why?'
    """
    return Variable(None, 0, name)


def constant(value: Any, name: str | None = None) -> Constant:
    """A Variable that always holds ``value``."""
    return Constant(value, name)


_ENVIRONMENT = jinja2.Environment(
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=False,
    autoescape=False,
)


@functools.lru_cache(maxsize=1024)
def _compiled(source: str) -> jinja2.Template:
    return _ENVIRONMENT.from_string(source)


class Render(Op):
    """Render a Jinja2 template, elementwise over its (broadcast) inputs."""

    elementwise = True

    __props__ = ("template_name", "source", "names")

    def __init__(self, template_name: str, source: str, names: tuple[str, ...]) -> None:
        self.template_name = template_name
        self.source = source
        self.names = names

    @property
    def name(self) -> str:
        return f"Render[{self.template_name}]"

    def describe(self) -> dict[str, Any]:
        return {"kind": "prompt", "title": f"prompt {self.template_name}", "lines": ['"' + shorten(self.source, 40) + '"']}

    def argument_name(self, position: int, ninputs: int) -> str:
        return str(self.names[position])

    def perform(self, *values: Any) -> Any:
        template, names = _compiled(self.source), self.names
        return broadcast_map(lambda *vals: template.render(dict(zip(names, vals))), values)


class Prompt:
    """A prompt template; calling it builds a ``Render`` node.

    Use ``render(...)`` to fill it in directly with concrete values.
    """

    def __init__(self, fn: Callable[..., Any], source: str, names: tuple[str, ...]) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.source = source
        self.names = names
        self.signature = inspect.signature(fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Variable:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise GraphBuildError(f"prompt {self.fn.__name__}: {exc}") from None
        bound.apply_defaults()
        inputs = [as_variable(bound.arguments[name]) for name in self.names]
        op = Render(self.fn.__name__, self.source, self.names)
        return Apply(op, inputs).out

    def render(self, *args: Any, **kwargs: Any) -> str:
        """Fill the template in with concrete values, outside any graph."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return _compiled(self.source).render(dict(bound.arguments))

    def __repr__(self) -> str:
        return f"Prompt({self.fn.__name__}, {self.source[:40]!r})"


def prompt(fn: Callable[..., Any]) -> Prompt:
    """Make a prompt template from a function whose docstring is Jinja2.

    The docstring's indentation is cleaned (``inspect.cleandoc``). Every
    variable the template uses must be a parameter of the function.

    Raises
    ------
    GraphBuildError
        At decoration time, when the function has no docstring, the template
        does not parse, or it names a variable the function does not take.

    Examples
    --------
    >>> @prompt
    ... def greet(name):
    ...     '''Hello {{ name }}!'''
    >>> greet("Ada").eval()
    'Hello Ada!'
    """
    if not fn.__doc__:
        raise GraphBuildError(f"prompt {fn.__name__}: the docstring (the template) is empty")
    source = inspect.cleandoc(fn.__doc__)
    try:
        used = jinja2.meta.find_undeclared_variables(_ENVIRONMENT.parse(source))
    except jinja2.TemplateSyntaxError as exc:
        raise GraphBuildError(f"prompt {fn.__name__}: template syntax error on line {exc.lineno}: {exc}") from None
    parameters = list(inspect.signature(fn).parameters)
    unknown = sorted(used - set(parameters))
    if unknown:
        raise GraphBuildError(
            f"prompt {fn.__name__}: the template uses {', '.join(unknown)} which "
            f"{'is' if len(unknown) == 1 else 'are'} not parameter(s) of {fn.__name__}{inspect.signature(fn)}"
        )
    names = tuple(p for p in parameters if p in used)
    return Prompt(fn, source, names)


def function(template: Callable[..., Any], model: Callable[..., Variable], parser: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Chain prompt → model → parser into one callable that builds nodes.

    Parameters
    ----------
    template
        A ``@prompt`` (or any callable returning a text Variable).
    model
        A ``Model``.
    parser
        Optional ``outlines.fn`` (or plain function, lifted with ``outlines.fn``)
        applied to the completion; or a pydantic model class or a JSON-schema
        dict, which constrains the model's output (``json_schema=``) and yields
        parsed values.

    Returns
    -------
    callable
        Takes the template's arguments (scalars or arrays) and returns a Variable.
    """
    from outlines.fn import Function
    from outlines.fn import fn as lift

    schema = parser if isinstance(parser, dict) or hasattr(parser, "model_json_schema") else None
    if schema is not None:  # a structured-output parser: decode under the schema (issue 13)
        parser = None
    elif parser is not None and not isinstance(parser, Function):
        parser = lift(parser)

    def call(*args: Any, **kwargs: Any) -> Variable:
        if schema is not None:
            return model(template(*args, **kwargs), json_schema=schema)
        completion = model(template(*args, **kwargs))
        return parser(completion) if parser is not None else completion

    call.__name__ = getattr(template, "__name__", "function")
    shown = getattr(schema, "__name__", "json_schema") if schema is not None else getattr(parser, "__name__", None)
    call.__doc__ = f"{call.__name__} → {model!r}" + (f" → {shown}" if shown else "")
    return call
