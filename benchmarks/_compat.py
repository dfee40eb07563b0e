"""What the benchmark scripts need from the package tree they measure, for old and new trees alike.

``compare.py`` runs the scripts of this tree against the ``outlines`` package
of another tree (``OUTLINES_BENCH_TREE``): ``ROOT`` is that tree (default:
the tree holding this file) and is put first on ``sys.path``, so ``import
outlines`` and ``tests.fixtures`` come from it. The tuning values and the
planning entry point the scripts touch may move between trees (issue 40:
tuning values become options, one planning path); the helpers below try the
newer spelling first and fall back to the older one, so one script measures
both.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

#: The tree whose ``outlines`` package the scripts import.
ROOT = Path(os.environ.get("OUTLINES_BENCH_TREE") or Path(__file__).resolve().parents[1]).resolve()
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

def example(name: str) -> ModuleType:
    """``examples/<name>.py`` of the measured tree, loaded as a module (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Modules that held the stacking threshold as a module constant (trees up to 141f75c).
_STACK_MIN_MODULES = ("outlines.runtime.plan",)


def set_stack_min(value: int) -> str:
    """Set the least number of sibling uses that stack, for the rest of this process; say how it was set.

    A tree with an ``outlines.config`` option for it gets the option; an older
    tree gets its module constant patched (``STACK_MIN`` wherever the planner
    reads it).
    """
    import outlines.config as config

    for setter in ("set_tuning", "set_options", "set_option", "set"):
        function = getattr(config, setter, None)
        if callable(function):
            for name in ("stack_min", "STACK_MIN"):
                try:
                    function(**{name: value})
                    return f"outlines.config.{setter}({name}={value})"
                except (TypeError, KeyError, ValueError, AttributeError):
                    continue
    options = getattr(config, "options", None)
    if options is not None and hasattr(options, "stack_min"):
        try:
            setattr(options, "stack_min", value)
            return f"outlines.config.options.stack_min = {value}"
        except (AttributeError, TypeError):
            pass
    patched = []
    for module_name in _STACK_MIN_MODULES + tuple(m for m in list(sys.modules) if m.startswith("outlines.")):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if isinstance(getattr(module, "STACK_MIN", None), int):
            setattr(module, "STACK_MIN", value)
            patched.append(module_name)
    if not patched:
        raise RuntimeError("this outlines tree has neither a stack_min option nor a STACK_MIN constant")
    return "STACK_MIN patched in " + ", ".join(sorted(set(patched)))


def plan_seconds(outputs: list[Any]) -> float:
    """Seconds to plan ``outputs`` as ``outlines.eval`` does (stacked); NaN where no such entry point is found."""
    try:
        from outlines.runtime.plan import Plan
    except ImportError:
        return float("nan")
    start = time.perf_counter()
    try:
        Plan(outputs, stack=True)
    except TypeError:  # one planning path: every plan stacks
        start = time.perf_counter()
        Plan(outputs)
    return time.perf_counter() - start


#: Whether the script was asked for machine-readable rows (``--json``): set by the script's ``main``.
JSON = False


def emit(row: str, value: float, unit: str = "s") -> None:
    """Under ``--json``, print one row as a line ``BENCH {"row": ..., "value": ..., "unit": ...}``.

    ``unit`` says which way is better: ``s``, ``ms``, ``us``, ``KB``, ``calls``,
    ``x cp`` (lower is better); ``%`` and ``x faster`` (higher is better).
    The human output is printed as before; ``compare.py`` reads these lines.
    """
    if JSON:
        import json

        print("BENCH " + json.dumps({"row": row, "value": value, "unit": unit}), flush=True)


def job_price(input_per_1m: float, output_per_1m: float, discount: float) -> dict[str, float]:
    """A price mapping with the provider-job discount under the name this tree's ``Price`` takes.

    Issue 40 renames the field ``batch_discount`` to ``job_discount``; an
    older tree's ``Price`` refuses the new name.
    """
    import inspect

    from outlines.backends.usage import Price

    names = inspect.signature(Price).parameters
    key = "job_discount" if "job_discount" in names else "batch_discount"
    return {"input": input_per_1m, "output": output_per_1m, key: discount}
