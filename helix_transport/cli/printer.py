"""How ``helix-mesh call`` and ``make demo`` show events to a person: one line each."""

from __future__ import annotations

import os
import re
import sys
from typing import TextIO

from helix_transport._events import Tone, status_name, summarize
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb

__all__ = ["EventPrinter", "child_label", "status_name", "wants_color"]

_COLORS = {  # ANSI SGR codes
    Tone.STRONG: "1",
    Tone.GOOD: "32",
    Tone.BAD: "31",
    Tone.WARN: "33",
    Tone.NOTE: "36",
    Tone.ASK: "35",
}
_MORE = "…"  # where a line of text was broken off, and where it goes on
_SCOPE = re.compile(r"-[0-9a-f]{16}$")  # a child id's last part (agent.tools.child_scope)


def wants_color(out: TextIO) -> bool:
    """Colour for a terminal, unless ``NO_COLOR`` is set to anything (https://no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(out, "isatty", None)
    return bool(isatty and isatty())


class EventPrinter:
    """Renders events for people: one line each, children indented under their parent.

    Text deltas stream live on one open line. When several sessions stream at once
    (concurrent children), the others' text is buffered and printed as a whole line
    when that session's next event arrives, and another session's event ends the open
    line first (marked ``…``, its rest buffered likewise), so lines never interleave.
    A child is named by its agent type and what its id adds to its parent's
    (``[researcher call_1_0]``), so siblings of one type tell apart.
    """

    def __init__(self, out: TextIO = sys.stdout, *, color: bool | None = None) -> None:
        self.out = out
        self.color = wants_color(out) if color is None else color
        self._open: tuple[str, str] | None = None  # the open text line: (session, prefix)
        self._buffered: dict[str, tuple[str, list[str]]] = {}  # session -> (prefix, text)

    def _c(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def print(self, event: pb.StreamEvent, depth: int = 0, *, parent: str = "") -> None:
        """Print one event (and, for a forwarded child event, the child's event nested)."""
        kind = event.WhichOneof("payload")
        if kind == "child_event":
            self.print(event.child_event.event, depth + 1, parent=event.session_id)
            return
        session = event.session_id
        who = _who(event, parent)
        if kind == "text_delta":
            prefix = "  " * depth + self._c("2", f"[{who}]") + " "
            self._text(session, prefix, event.text_delta.text)
            return
        self._flush_text(session)
        self._break_open_line()
        label = self._c("2", f"[{who} #{event.sequence}]")
        self.out.write(f"{'  ' * depth}{label} {self._describe(event)}\n")
        self.out.flush()

    def _text(self, session: str, prefix: str, text: str) -> None:
        text = text.replace("\n", " ")
        if self._open is None and session not in self._buffered:
            self.out.write(prefix)
            self._open = (session, prefix)
        if self._open is not None and self._open[0] == session:
            self.out.write(text)
            self.out.flush()
        else:
            self._buffered.setdefault(session, (prefix, []))[1].append(text)

    def _break_open_line(self) -> None:
        """End another session's open line; the rest of its text is buffered."""
        if self._open is not None:
            session, prefix = self._open
            self.out.write(_MORE + "\n")
            self._open = None
            self._buffered[session] = (prefix, [_MORE])

    def _flush_text(self, session: str) -> None:
        if self._open is not None and self._open[0] == session:
            self.out.write("\n")
            self._open = None
        buffered = self._buffered.pop(session, None)
        if buffered is not None and buffered[1] != [_MORE]:  # a broken line that went on
            self._break_open_line()
            prefix, parts = buffered
            self.out.write(prefix + "".join(parts) + "\n")

    def _describe(self, event: pb.StreamEvent) -> str:
        """The event's summary, its lead in its tone's colour."""
        summary = summarize(event)
        if summary.tone is Tone.PLAIN:
            return str(summary)
        return self._c(_COLORS[summary.tone], summary.lead) + summary.rest

    def close(self) -> None:
        """End the open line and print any buffered text."""
        if self._open is not None:
            self._flush_text(self._open[0])
        for session in list(self._buffered):
            self._flush_text(session)
        self.out.flush()


def _who(event: pb.StreamEvent, parent: str) -> str:
    return child_label(event.agent_type, event.session_id, parent)


def child_label(agent_type: str, session_id: str, parent: str | None) -> str:
    """``researcher``, or for a child ``researcher call_2_0``: what its id adds to its
    parent's (``{parent}-remote-call_2_0-{scope}``, ``{parent}-task-call_1_0-0-{scope}``),
    less the scope, which is the same for every child of one parent."""
    if not parent or not session_id.startswith(parent + "-"):
        return agent_type
    added = _SCOPE.sub("", session_id[len(parent) + 1 :])
    return f"{agent_type} {added.partition('-')[2] or added}"
