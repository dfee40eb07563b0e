"""Draws, in the bottom layer: what one is, what a model call asks, how draws are packed and grouped.

A *draw* is one sample of one prompt (``Draw``); the draws of one params and
draw number form a *slot* (``Slot``); many draws travel as columns
(``DrawColumns``; ``DrawBatch`` is its deprecated name). ``GenerationParams``
(with its ``Constraint``) is what a model call asks besides the prompt;
``pack`` is the one packing rule and ``prefix_groups`` groups prompts by the
head they share. The batcher, the backends and the cache all read these from
here.
"""
import warnings
from typing import Any

from outlines.draws.draw import Draw, DrawColumns, Slot
from outlines.draws.packing import pack
from outlines.draws.params import Constraint, GenerationParams
from outlines.draws.prefix import PrefixGroups, prefix_groups

__all__ = ["Constraint", "Draw", "DrawColumns", "GenerationParams", "PrefixGroups", "Slot", "pack", "prefix_groups"]

#: Names kept for one release, with the name to use instead (see docs/reference/glossary.md).
_DEPRECATED = {"DrawBatch": "DrawColumns"}


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        new = _DEPRECATED[name]
        warnings.warn(f"outlines.draws.{name} is deprecated and goes in the next release: use {new} (a batch is one "
                      f"backend call; these are draws held as columns)", DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module 'outlines.draws' has no attribute {name!r}")

