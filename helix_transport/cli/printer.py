"""How ``helix-mesh call`` and ``make demo`` show events to a person: one line each."""

from __future__ import annotations

import os
import re
import sys
from typing import TextIO

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb

_OUTCOMES = {
    pb.INPUT_OUTCOME_APPROVED: "approved",
    pb.INPUT_OUTCOME_DENIED: "denied",
    pb.INPUT_OUTCOME_RESULT: "result received",
    pb.INPUT_OUTCOME_ERROR: "client tool failed",
    pb.INPUT_OUTCOME_EXPIRED: "expired",
}
_STATUS_NAMES = {v: k.removeprefix("SESSION_STATUS_").lower() for k, v in pb.SessionStatus.items()}
_MORE = "…"  # where a line of text was broken off, and where it goes on
_SCOPE = re.compile(r"-[0-9a-f]{16}$")  # a child id's last part (agent.tools.child_scope)


def wants_color(out: TextIO) -> bool:
    """Colour for a terminal, unless ``NO_COLOR`` is set to anything (https://no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(out, "isatty", None)
    return bool(isatty and isatty())


def status_name(value: pb.SessionStatus.ValueType) -> str:
    """``completed`` for ``SESSION_STATUS_COMPLETED``."""
    return _STATUS_NAMES.get(value, str(value))


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
        self.out.write(f"{'  ' * depth}{label} {self._describe(event, kind)}\n")
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

    def _describe(self, event: pb.StreamEvent, kind: str | None) -> str:
        if kind == "run_started":
            return (
                self._c("1", "started")
                + f" {event.session_id} input={event.run_started.input_json}"
            )
        if kind == "step_started":
            return f"step {event.step}"
        if kind == "tool_start":
            t = event.tool_start
            return f"→ {t.tool_name}({_short(t.arguments_json)})"
        if kind == "tool_end":
            end = event.tool_end
            mark = self._c("31", "✗") if end.is_error else "←"
            return f"{mark} {end.tool_name}: {_short(end.result_json)}"
        if kind == "subagent_start":
            s = event.subagent_start
            return f"⇢ delegating to {s.child_agent_type} ({s.child_session_id})"
        if kind == "subagent_end":
            done = event.subagent_end
            return f"⇠ {done.child_agent_type} {status_name(done.status)}"
        if kind == "output":
            return f"output {event.output.output_json}"
        if kind == "completed":
            return self._c("32", "completed")
        if kind == "failed":
            f = event.failed
            return self._c("31", f"failed ({f.failure_reason}): {f.error}")
        if kind == "interrupted":
            return self._c("33", f"interrupted: {event.interrupted.reason or '-'}")
        if kind == "terminated":
            return self._c("33", f"terminated: {event.terminated.reason or '-'}")
        if kind == "run_resumed":
            r = event.run_resumed
            return self._c("36", f"resumed at step {r.step} ({r.reason})")
        if kind == "error":
            return self._c("31", f"error: {event.error.message}")
        if kind == "input_required":
            asked = event.input_required
            wanted = "approval" if asked.kind == pb.INPUT_KIND_APPROVAL else "client result"
            call = f"{asked.tool_name}({_short(asked.arguments_json)})"
            return self._c("35", f"? {wanted} needed") + f" for {call} [{asked.request_id}]"
        if kind == "input_answered":
            answered = event.input_answered
            how = _OUTCOMES.get(answered.outcome, "answered")
            why = f": {answered.reason}" if answered.reason else ""
            return self._c("35", f"✓ {answered.request_id} {how}") + why
        if kind == "suspended":
            waits = event.suspended
            parts = [f"{len(waits.request_ids)} request(s)"] if waits.request_ids else []
            if waits.suspended_children:
                parts.append(f"{waits.suspended_children} suspended sub-agent(s)")
            return self._c("35", "suspended") + f": waiting for {' and '.join(parts) or 'input'}"
        if kind == "turn_started":
            turn = event.turn_started
            fresh = " (fresh)" if turn.fresh else ""
            return self._c("1", f"turn {turn.turn}{fresh}") + f" message={_short(turn.message)}"
        return f"({kind or 'unknown event'})"

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


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
