"""Durations on the command line: argparse types over the one grammar (``_durations``)."""

from __future__ import annotations

import argparse
from datetime import timedelta

from helix_transport._durations import EXAMPLES, parse_duration

__all__ = ["EXAMPLES", "duration_arg", "parse_duration", "positive_duration_arg"]


def duration_arg(text: str) -> timedelta:
    """An argparse type: a duration, zero or more."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_duration_arg(text: str) -> timedelta:
    """An argparse type: a duration above zero (a timeout, a lease, a retention)."""
    value = duration_arg(text)
    if value <= timedelta(0):
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration above 0")
    return value
