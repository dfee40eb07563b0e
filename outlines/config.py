"""``outlines.config``: the public name of ``outlines.common.config`` (process-wide defaults, settable in a ``with`` block).

The package never imports this module; it is the documented path for users
(``from outlines.config import set_executor``).
"""
from __future__ import annotations

from outlines.common.config import *  # noqa: F403 - the public face re-exports the whole list
from outlines.common.config import __all__  # noqa: F401
