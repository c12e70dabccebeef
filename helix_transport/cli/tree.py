"""``helix-mesh tree ADDRESS SESSION``: a session's delegation tree, folded from its
log alone (``helix_transport.tree``), so it shows with every child's service down.

Without ``--follow`` it reads the log as far as it went when asked, prints the tree
once and exits with the root's status. With ``--follow`` it goes on until the root
ends: on a terminal it redraws the tree in place; into a pipe (or with ``--json``)
it appends a new copy each time a node is added or changes status, steps or usage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TextIO

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.cli.client import connect
from helix_transport.cli.exits import for_status
from helix_transport.cli.flags import client_options
from helix_transport.cli.follow import session_events
from helix_transport.cli.jsonout import dumps
from helix_transport.cli.printer import wants_color
from helix_transport.cli.treeview import Segment, render, tree_lines, tree_shape
from helix_transport.tree import SessionTree

_FRAME_S = 0.1
"""The least time between two redraws: a stream of words is not a frame each."""
_CLOCK_S = 1.0
"""Redraw at least this often while following, so running durations move."""


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``tree`` to the subcommands ``sub`` (an ``add_subparsers`` result)."""
    tree_ = sub.add_parser(
        "tree", help="show a session's delegation tree: status, duration and usage per node"
    )
    tree_.add_argument("address")
    tree_.add_argument("session_id")
    tree_.add_argument(
        "--follow", action="store_true", help="keep it up to date until the session ends"
    )
    tree_.add_argument(
        "--json",
        action="store_true",
        help="print the tree as JSON (with --follow: one line per change)",
    )
    client_options(tree_)


async def tree(args: argparse.Namespace) -> int:
    """Print the tree; exit with the root's status (``RUNNING`` if it has not ended)."""
    folded = SessionTree()
    out = sys.stdout
    async with await connect(args) as client:
        status = await client.get_status(args.session_id)
        # What was logged when GetStatus answered is read before anything is shown:
        # a tree replayed event by event would show every past state of it first.
        caught_up = status.last_sequence
        if not args.follow:
            events = session_events(client, args.session_id, until_sequence=caught_up)
            async for event in events:
                folded.add(event)
            _print_once(folded, out, as_json=args.json)
        elif args.json or not out.isatty():
            events = session_events(client, args.session_id)
            await _append(events, folded, out, as_json=args.json, caught_up=caught_up)
        else:
            live = _LiveTree(folded, out, caught_up=caught_up)
            await live.follow(session_events(client, args.session_id))
    root = folded.root
    return for_status(root.status.to_proto() if root is not None else status.status)


def _now() -> datetime:
    return datetime.now(UTC)


def _print_once(folded: SessionTree, out: TextIO, *, as_json: bool) -> None:
    if as_json:
        print(dumps(folded.root.to_json() if folded.root is not None else None), file=out)
        return
    color = wants_color(out)
    for line in tree_lines(folded, now=_now()):
        print(render(line, color=color), file=out)


async def _append(
    events: AsyncIterator[pb.StreamEvent],
    folded: SessionTree,
    out: TextIO,
    *,
    as_json: bool,
    caught_up: int,
) -> None:
    """Print the tree as of ``caught_up`` (the root's sequence), then a copy each time
    its shape changes (see ``tree_shape``)."""
    shown: tuple[object, ...] = ()
    color = wants_color(out)
    async for event in events:
        folded.add(event)
        shape = tree_shape(folded)
        if event.sequence < caught_up or shape == shown or folded.root is None:
            continue
        shown = shape
        if as_json:
            print(dumps(folded.root.to_json(), indent=None), file=out, flush=True)
        else:
            lines = [render(line, color=color) for line in tree_lines(folded, now=_now())]
            print("\n".join(lines) + "\n", file=out, flush=True)


class _LiveTree:
    """The tree on a terminal, redrawn in place as events arrive (and each second)."""

    def __init__(self, folded: SessionTree, out: TextIO, *, caught_up: int) -> None:
        self.folded = folded
        self.out = out
        self.caught_up = caught_up  # the root's sequence from which frames are drawn
        self.color = wants_color(out)
        self.drawn = 0  # lines of the last frame, to move back over
        self.changed = asyncio.Event()

    async def follow(self, events: AsyncIterator[pb.StreamEvent]) -> None:
        painter = asyncio.create_task(self._paint())
        try:
            async for event in events:
                self.folded.add(event)
                if event.sequence >= self.caught_up:
                    self.changed.set()
        finally:
            painter.cancel()
            await asyncio.wait({painter})  # its end, without taking on its cancellation
        self.draw()

    async def _paint(self) -> None:
        await self.changed.wait()  # nothing before the log is read as far as it went
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_CLOCK_S):
                    await self.changed.wait()
            self.changed.clear()
            self.draw()
            await asyncio.sleep(_FRAME_S)

    def draw(self) -> None:
        columns, rows = shutil.get_terminal_size()
        lines = tree_lines(self.folded, now=_now())
        room = max(rows - 2, 1)  # a frame taller than the screen cannot be moved back over
        if len(lines) > room:
            hidden = len(lines) - room + 1
            lines = [*lines[: room - 1], [Segment(f"… and {hidden} more sessions", "2")]]
        # Back to the frame's first line, clear to the end of the screen, draw anew;
        # each line cut to the width, as a wrapped line would throw the count off.
        frame = f"\x1b[{self.drawn}F" if self.drawn else ""
        frame += "\x1b[J" + "".join(
            render(line, color=self.color, width=columns - 1) + "\n" for line in lines
        )
        self.out.write(frame)
        self.out.flush()
        self.drawn = len(lines)
