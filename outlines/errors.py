"""``outlines.errors``: the public name of ``outlines.common.errors`` (the errors raised, and ``Failure``).

The package never imports this module; it is the documented path for users
(``from outlines.errors import NodeError``).
"""
from __future__ import annotations

from outlines.common.errors import *  # noqa: F403 - the public face re-exports the whole list
from outlines.common.errors import __all__  # noqa: F401
