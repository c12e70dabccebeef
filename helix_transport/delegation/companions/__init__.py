"""Persistent children: long-lived remote agents a parent spawns, re-consults and reaps.

A parent declares the child agent types it may keep (``PersistentChild``), each
``blocking`` or ``non-blocking``, and ``with_companions`` gives its model six
tools (the ``companion__`` prefix keeps them apart from the agent's own)::

    companion__spawn_agent(agent, message, name?)   start a child, or re-consult it
    companion__send_message(name, message)          a new turn, now or when the current ends
    companion__list_children()                      names, types, statuses
    companion__get_child_status(name)               status and last output
    companion__terminate_child(name)                stop a running child
    companion__wait_for_result(name, timeout_s?)    only when a blocking type exists

Malformed calls (an empty or over-long name, an empty message, a timeout that is
not positive, an unknown type or child) are error tool results; nothing raises.
Calls on one child in one step run one at a time, in the order the model made them.

**Identity.** A child lives in session ``{parent_session_id}-agent-{name}-{scope}`` on its
type's service (``HELIX_AGENT_ADDRESS_<TYPE>``). Unnamed children are named
``{agent_type}-{n}``; names are taken synchronously, before a tool's first await,
so concurrent spawns in one step never collide, and a resumed step re-running the
same calls in the same order takes the same names.

**Turns.** The first message starts the child with ``{input_field: message}`` as
its input. Spawning an existing name, or ``send_message``, continues the same
session with ``Continue`` (one new turn, fresh step budget): a completed child
keeps its memory; a failed, interrupted or terminated one re-spawns fresh (same
session, its log goes on, the conversation starts over). Spawning a child whose
turn is still running is an ``already running`` error. Turns are numbered by the
parent, so a parent that re-runs a spawn after a crash rejoins the turn it started
(also when its checkpoint still showed the turn before running). A child is recorded
as running before each ``Start`` or ``Continue``, so an interrupt of the parent
cascades to a turn still being asked for.

**Queued messages.** ``send_message`` to a child whose turn is running queues the
message (at most ``MAX_INBOX``) in the parent run's state. At the start of each
parent step the delivery hook asks the child's status; once the child is not
running (and its service can be reached), the hook asks for the next turn with the
queue (``Continue``, the messages joined by blank lines, in order): if the turn
completed, the queue becomes the next turn and the parent's model is told of both.
A turn that ends any other way (a companion's next turn keeps memory only after a
completed one, though a service would resume an interrupted session with it), or a
terminate, drops the queue and says how many messages were dropped. Only the hook hands a queue over, right after a checkpoint, so a parent
resumed after a crash asks again with the same turn and message (once the child is
not running: the turn it started may still run), and the child's service replays
the turn already started: the hook then reads how the turn before ended from the
event just before it, not from the child's status (by then the new turn's).

**Exactly-once delivery.** Each finished turn's outcome reaches the parent's
model once: *pulled* as a tool result (a blocking spawn, ``wait_for_result``,
``get_child_status`` or ``terminate_child`` showing the outcome), or *pushed* by
a step hook as one message at the start of the parent's next fresh step, for
every child that finished meanwhile. The delivery mark lives in the parent run's
``ToolContext.state``, which is checkpointed in the same write as the
conversation that holds the delivered outcome: a parent killed before that write
delivers again from the earlier checkpoint (its model never saw the first try),
one killed after it never delivers again. Terminated children are not pushed
(the parent stopped them on purpose). A new message (``send_message``, or a spawn
that re-consults) to a child whose finished turn the parent's model has not seen
yet shows that outcome in the tool's result (``previous_turn``) before the next
turn starts, so it is not lost. The parent's *log* holds one ``subagent_end``
per turn even so: a delivery again reads the log for an end a crashed run wrote.

**Events.** The parent's log gets ``subagent_start`` when a turn starts and
``subagent_end`` when its outcome is delivered, and the child's events between
as ``child_event``s (``helix_transport.delegation.forwarding``): a waited-for
turn's as they come, a non-blocking one's at each of the parent's steps.
A running child is recorded as a sub-session ref, so interrupting the parent
interrupts it too.
"""

from __future__ import annotations

from helix_transport.delegation.companions._roster import (
    MAX_INBOX,
    PREFIX,
    Mode,
    NameArgs,
    NoArgs,
    PersistentChild,
    SendArgs,
    SpawnArgs,
    WaitArgs,
    child_session_id,
)
from helix_transport.delegation.companions._tools import Companions, with_companions

__all__ = [
    "MAX_INBOX",
    "PREFIX",
    "Companions",
    "Mode",
    "NameArgs",
    "NoArgs",
    "PersistentChild",
    "SendArgs",
    "SpawnArgs",
    "WaitArgs",
    "child_session_id",
    "with_companions",
]
