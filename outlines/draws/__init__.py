"""Draws, in the bottom layer: what one is, what a model call asks, how draws are packed and grouped.

A *draw* is one sample of one prompt (``Draw``); the draws of one params and
draw number form a *slot* (``Slot``); a batch of draws travels as columns
(``DrawBatch``). ``GenerationParams`` (with its ``Constraint``) is what a
model call asks besides the prompt; ``pack`` is the one packing rule and
``prefix_groups`` groups prompts by the head they share. The batcher, the
backends and the cache all read these from here.
"""
from outlines.draws.draw import Draw, DrawBatch, Slot
from outlines.draws.packing import pack
from outlines.draws.params import Constraint, GenerationParams
from outlines.draws.prefix import PrefixGroups, prefix_groups

__all__ = ["Constraint", "Draw", "DrawBatch", "GenerationParams", "PrefixGroups", "Slot", "pack", "prefix_groups"]
