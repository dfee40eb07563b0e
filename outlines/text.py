"""Text values: prompt templates, and chains of template, model and parser.

``@outlines.prompt`` turns a function whose docstring is a Jinja2 template into
a builder of ``Render`` nodes. The template's variables are checked against the
function's parameters when the function is decorated, not when it runs.

A template renders once per element of its (paired) arguments, except its
*list arguments*: the variables it iterates (``{% for p in points %}``) or
passes to a sequence filter (``join``, ``length``...). A list argument takes the LAST axis of its value
whole, as a Python list (a ragged value: one row), so ``judge(task,
candidates)`` with a (T,) task and (T, k) candidates renders T prompts, each
with its own k candidates. Free string inputs and constants
(``outlines.string``, ``outlines.constant``) live beside ``Variable`` in
``outlines.graph.basic``.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable

import jinja2
import jinja2.meta
import jinja2.nodes
import numpy as np

from outlines.common.config import current_tuning
from outlines.common.errors import Failure, GraphBuildError
from outlines.graph.basic import Apply, Op, Variable, as_variable
from outlines.graph.ops import all_text, broadcast_map, core_map, mark_not_text, raise_not_text
from outlines.graph.ragged import Ragged
from outlines.graph.shapes import Shape, align, broadcast_leading
from outlines.graph.traits import Run, Traits
from outlines.common.labels import shorten

__all__ = ["Prompt", "Render", "function", "prompt"]


_ENVIRONMENT = jinja2.Environment(
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)


@functools.lru_cache(maxsize=1024)
def _compiled(source: str) -> jinja2.Template:
    return _ENVIRONMENT.from_string(source)


@functools.lru_cache(maxsize=1024)
def _substitution(source: str, names: tuple[str, ...]) -> tuple[str | int, ...] | None:
    """The parts rendering ``source`` exactly, for a template that only substitutes variables.

    Such a template (text and ``{{ name }}`` only, whitespace control and
    comments included: the parser has applied them to the text) renders
    ``str(value)`` in place of each name (autoescape is off). Its parts are
    the literal texts (``str``) and the positions of the names (``int``) in
    order: for text values, the concatenation of the parts is the render,
    done without a Jinja context per element (``_render_parts``). ``None``
    for anything else (filters, tests, blocks, expressions): those render
    through Jinja.
    """
    parts: list[str | int] = []
    for output in _ENVIRONMENT.parse(source).body:
        if not isinstance(output, jinja2.nodes.Output):
            return None
        for node in output.nodes:
            if isinstance(node, jinja2.nodes.TemplateData):
                if parts and isinstance(parts[-1], str):
                    parts[-1] += node.data
                elif node.data:
                    parts.append(node.data)
            elif isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name in names:
                parts.append(names.index(node.name))
            else:
                return None
    return tuple(parts)


def _render_parts(parts: tuple[str | int, ...], values: tuple[Any, ...]) -> Any:
    """Concatenate ``parts`` over text ``values`` (str, or object arrays of str paired on leading axes).

    Each ``+`` is one NumPy pass over a chunk of the paired arrays
    (``str.__add__`` per element, in C), so a (100,000,) input costs a few
    passes per chunk and no Python call per element; the partial texts
    between two ``+`` are those of one chunk (``Tuning.render_chunk``
    elements), never a whole copy.
    """
    if not any(isinstance(v, np.ndarray) for v in values):
        return "".join(part if isinstance(part, str) else values[part] for part in parts)
    given = [v if v.dtype == object else v.astype(object) for v in values if isinstance(v, np.ndarray)]
    shape, arrays = broadcast_leading("elementwise op", given)
    paired = iter(arrays)
    flat = [next(paired).reshape(-1) if isinstance(v, np.ndarray) else _object(v) for v in values]
    operands = [_object(part) if isinstance(part, str) else flat[part] for part in parts] or [_object("")]
    count = int(np.prod(shape, dtype=np.int64))
    out = np.empty(count, dtype=object)
    chunk = current_tuning().render_chunk
    for start in range(0, count, chunk):
        stop = min(start + chunk, count)
        text: Any = None
        for operand in operands:
            piece = operand[start:stop] if operand.ndim else operand
            # as object arrays: NumPy would read a str as its own text type (an ``np.str_``, NULs cut)
            text = piece if text is None else np.add(_object(text), piece)
        out[start:stop] = _object(text)
    return out.reshape(shape)


def _object(value: Any) -> np.ndarray:
    """``value`` as an object array (a str as a 0-d one holding it as it is)."""
    if isinstance(value, np.ndarray):
        return value
    array = np.empty((), dtype=object)
    array[()] = value
    return array


def _all_text(value: Any) -> bool:
    """Whether ``value`` is a str or an object array of str only (nothing to refuse, nothing failed)."""
    if type(value) is str:
        return True
    return isinstance(value, np.ndarray) and all_text(value.reshape(-1).tolist())


#: Filters that read a whole sequence: their argument is a list argument.
_SEQUENCE_FILTERS = frozenset(
    {"batch", "count", "first", "join", "last", "length", "list", "map", "max", "min", "reject",
     "rejectattr", "reverse", "select", "selectattr", "slice", "sort", "sum", "unique"}
)


def list_arguments(source: str) -> frozenset[str]:
    """The template variables used as sequences: iterated, or given to a sequence filter.

    Indexing and ``in`` are not counted: ``doc[:100]`` and ``"x" in doc`` are
    common on strings.

    Examples
    --------
    >>> sorted(list_arguments("{% for p in points %}{{ p }}{% endfor %}{{ task }}"))
    ['points']
    """
    found: set[str] = set()
    tree = _ENVIRONMENT.parse(source)
    for node in tree.find_all((jinja2.nodes.For, jinja2.nodes.Filter)):
        target: Any = None
        if isinstance(node, jinja2.nodes.For):
            target = node.iter
        elif isinstance(node, jinja2.nodes.Filter) and node.name in _SEQUENCE_FILTERS:
            target = node.node
        if isinstance(target, jinja2.nodes.Name):
            found.add(target.name)
    return frozenset(found)


class Render(Op):
    """Render a Jinja2 template once per element of its inputs, paired on leading axes.

    ``lists`` are the list arguments (``list_arguments``): each takes the last
    axis of its value (or one ragged row) whole, as a Python list; a value
    whose elements are already lists is passed element by element.
    """

    #: explain passes ``unknown``: an element reading it stays unknown; perform takes the scheduler's
    #: on_error (None, NaN or bytes fail alone). A template with list arguments is not elementwise.
    traits = Traits(elementwise=True, guards_elements=True, moves_unknown=True)

    __props__ = ("template_name", "source", "names", "lists")

    def __init__(self, template_name: str, source: str, names: tuple[str, ...], lists: tuple[str, ...] = ()) -> None:
        self.template_name = template_name
        self.source = source
        self.names = names
        self.lists = lists
        if lists:  # each list argument takes a whole axis: one render per row, not per element
            self.traits = dataclasses.replace(Render.traits, elementwise=False)
        #: False when a list argument comes from a Python function, whose elements
        #: may be lists themselves: the output shape is then known only at run time.
        self.exact = True

    @property
    def name(self) -> str:
        return f"Render[{self.template_name}]"

    def describe(self) -> dict[str, Any]:
        return {"kind": "prompt", "title": f"prompt {self.template_name}", "lines": ['"' + shorten(self.source, 40) + '"']}

    def argument_name(self, position: int, ninputs: int) -> str:
        return str(self.names[position])

    def _cores(self, values: Any) -> list[int]:
        return [1 if name in self.lists and _whole_axis(v) else 0 for name, v in zip(self.names, values)]

    def infer_shapes(self, shapes: list[Shape], noutputs: int) -> list[Shape]:
        if not self.lists:
            return super().infer_shapes(shapes, noutputs)
        if not self.exact:
            return [None]
        loops = [s[:-1] if name in self.lists and s else s for name, s in zip(self.names, shapes)]
        return [align(self.name, loops)]

    def ragged_outputs(self, ragged: list[bool], noutputs: int) -> list[bool]:
        return [any(r for name, r in zip(self.names, ragged) if name not in self.lists)]

    def perform(self, *values: Any, unknown: Any = None, on_error: Any = None, on_failed_input: Any = None) -> Any:
        if not self.lists and all(_all_text(v) for v in values):
            parts = _substitution(self.source, self.names)
            if parts is not None:  # in bulk: concatenated over the arrays, byte for byte Jinja's text
                return _render_parts(parts, values)
        template, names = _compiled(self.source), self.names
        where = f"prompt {self.template_name}: input"
        values = tuple(mark_not_text(v, _not_text, f"{where} {n!r}", lists=n in self.lists) for n, v in zip(names, values))

        def render(*vals: Any) -> Any:
            failed = next((v for v in vals if isinstance(v, Failure)), None)  # a Failure is falsy: no ``or``
            if failed is None:
                failed = next((x for v in vals if isinstance(v, (list, tuple, np.ndarray)) for x in _items(v)
                               if isinstance(x, Failure)), None)
            if failed is not None:  # an upstream element failed (errors="return"): this one cannot render
                return on_failed_input(failed) if on_failed_input is not None else failed
            if unknown is not None and any(v is unknown or _holds(v, unknown) for v in vals):
                return unknown
            raise_not_text([_as_list(v) if n in self.lists else v for n, v in zip(names, vals)])
            return template.render({n: _as_list(v) if n in self.lists else v for n, v in zip(names, vals)})

        if on_error is not None:  # errors="return": an element that cannot render fails alone
            render = _guarded_render(render, on_error)
        if not self.lists:
            return broadcast_map(render, values)
        return core_map(render, values, self._cores(values), where=self.name)


def _not_text(value: Any) -> bool:
    """What a template refuses to print: None, NaN and raw bytes (numbers and booleans render)."""
    if value is None or isinstance(value, (bytes, bytearray, memoryview)):
        return True
    return isinstance(value, (float, np.floating)) and value != value


def _guarded_render(render: Callable[..., Any], on_error: Callable[[BaseException], Failure]) -> Callable[..., Any]:
    def guarded(*values: Any) -> Any:
        try:
            return render(*values)
        except Exception as exc:  # noqa: BLE001 - becomes the element's Failure
            return on_error(exc)

    return guarded


def _whole_axis(value: Any) -> bool:
    """Whether a list argument's value holds its list as an axis (not as elements)."""
    if isinstance(value, Ragged):
        return True
    if not isinstance(value, np.ndarray) or value.ndim == 0:
        return False
    return not any(isinstance(v, (list, tuple, np.ndarray, Ragged)) for v in value.flat)


def _items(value: Any) -> Any:
    return value.flat if isinstance(value, np.ndarray) else value


def _holds(value: Any, item: Any) -> bool:
    if isinstance(value, np.ndarray):
        return any(v is item for v in value.flat)
    return isinstance(value, (list, tuple)) and any(v is item for v in value)


def _as_list(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


class Prompt:
    """A prompt template; calling it builds a ``Render`` node.

    Use ``render(...)`` to fill it in directly with concrete values.
    """

    def __init__(self, fn: Callable[..., Any], source: str, names: tuple[str, ...]) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.source = source
        self.names = names
        self.lists = tuple(n for n in names if n in list_arguments(source))
        self.signature = inspect.signature(fn)
        #: Whether calls with one positional argument per name bind in order (no bind() needed).
        self._plain = [p.name for p in self.signature.parameters.values()
                       if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)] == list(names) and len(
            self.signature.parameters) == len(names)
        #: The op of a template without list arguments, made once: a render built in a loop makes no op
        #: (about a third of the build time per node); equal ops stack and merge whichever object they are.
        self._op = None if self.lists else Render(self.fn.__name__, source, names)

    def __call__(self, *args: Any, **kwargs: Any) -> Variable:
        if self._op is not None and self._plain and not kwargs and len(args) == len(self.names):
            return Apply(self._op, [a if isinstance(a, Variable) else as_variable(a, array=True) for a in args]).outputs[0]
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise GraphBuildError(f"prompt {self.fn.__name__}: {exc}") from None
        bound.apply_defaults()
        # a Python list is an array of prompts for an ordinary argument, one list for a list argument
        inputs = [as_variable(bound.arguments[name], array=name not in self.lists) for name in self.names]
        if self._op is not None:
            return Apply(self._op, inputs).out
        op = Render(self.fn.__name__, self.source, self.names, self.lists)
        op.exact = not any(
            v.owner is not None and v.owner.op.traits.run is Run.PYTHON
            for name, v in zip(self.names, inputs)
            if name in self.lists
        )
        return Apply(op, inputs).out

    def render(self, *args: Any, **kwargs: Any) -> str:
        """Fill the template in with concrete values, outside any graph.

        Parameters
        ----------
        *args, **kwargs
            The function's arguments, as plain values.

        Returns
        -------
        str

        Examples
        --------
        >>> @prompt
        ... def greet(name):
        ...     '''Hello {{ name }}!'''
        >>> greet.render("Ada")
        'Hello Ada!'
        """
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return _compiled(self.source).render(dict(bound.arguments))

    def __repr__(self) -> str:
        return f"Prompt({self.fn.__name__}, {self.source[:40]!r})"


def prompt(fn: Callable[..., Any]) -> Prompt:
    """Make a prompt template from a function whose docstring is Jinja2.

    The docstring's indentation is cleaned (``inspect.cleandoc``); each blank
    line at its very end keeps one trailing newline (a docstring closing on
    its own line after the text has none). Every variable the template uses
    must be a parameter of the function. Calling the result builds a node
    that renders the template once per element of its arguments (paired on
    their leading axes), except for *list arguments*: the variables the
    template iterates (``{% for %}``) or passes to a sequence filter
    (``join``, ``length``...), which take the last axis of their value whole,
    as a Python list (see ``Render``). Do not build prompts with f-strings:
    a Variable has no value until evaluation.

    Parameters
    ----------
    fn
        A function whose docstring is the template and whose parameters name
        its variables (defaults are allowed).

    Returns
    -------
    Prompt
        Call it with Variables or values (arrays too) to get a text Variable;
        ``.render(...)`` fills it in with plain values at once.

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
    >>> greet(["Ada", "Alan"]).eval().tolist()
    ['Hello Ada!', 'Hello Alan!']
    """
    if not fn.__doc__:
        raise GraphBuildError(f"prompt {fn.__name__}: the docstring (the template) is empty")
    lines = inspect.cleandoc(fn.__doc__).split("\n")
    while len(lines) > 1 and not lines[-1].strip():
        lines.pop()  # the closing quotes' line and blank lines; counted below
    source = "\n".join(lines) + "\n" * _trailing_blank_lines(fn.__doc__)
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


def _trailing_blank_lines(doc: str) -> int:
    lines = doc.split("\n")
    blank = 0
    for line in reversed(lines[1:-1]):
        if line.strip():
            break
        blank += 1
    return blank if len(lines) > 2 and lines[-1].strip() == "" and any(line.strip() for line in lines) else 0


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

    Examples
    --------
    >>> import outlines
    >>> from outlines import models
    >>> @outlines.prompt
    ... def ask(question):
    ...     '''Q: {{ question }} A:'''
    >>> llm = models.from_function(lambda prompt: " 42", name="oracle")
    >>> answer = function(ask, llm, lambda text: int(text))
    >>> answer(["meaning of life?", "six times seven?"]).eval().tolist()
    [42, 42]
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
