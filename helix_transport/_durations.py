"""Durations: one grammar for every flag and ``HELIX_*`` variable that takes one.

``90`` (a bare number is seconds), ``90s``, ``500ms``, ``15m``, ``1.5h``, ``1h30m``,
``7d``, ``2w``: numbers with units, largest first or not, spaces allowed between
the parts. ``parse_duration`` is the one parser; the CLI's argparse types
(``cli.durations``) and ``config`` only add a lower bound and their wording.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

_PART = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|w)?\s*")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
EXAMPLES = "90s, 15m, 1h30m, 7d"
"""What a flag's help and errors show as examples."""


def parse_duration(text: str) -> timedelta:
    """``text`` as a duration (see the module docstring).

    Raises:
        ValueError: ``text`` is not one, is negative or is too large to hold.
    """
    compact = text.strip().lower()
    seconds = 0.0
    position = 0
    parts = 0
    while position < len(compact):
        match = _PART.match(compact, position)
        if match is None or match.end() == position:
            raise ValueError(f"{text!r} is not a duration (e.g. {EXAMPLES})")
        number, unit = match.groups()
        if unit is None and (parts or match.end() < len(compact)):
            # `1h30` could mean 30 s or 30 min: only a number alone goes without a unit.
            raise ValueError(f"{text!r}: give every part a unit (e.g. {EXAMPLES})")
        seconds += float(number) * _UNIT_S[unit or "s"]
        position = match.end()
        parts += 1
    if not parts:
        raise ValueError(f"{text!r} is not a duration (e.g. {EXAMPLES})")
    if not math.isfinite(seconds) or seconds > timedelta.max.total_seconds():
        raise ValueError(f"{text!r} is too long a duration")
    return timedelta(seconds=seconds)
