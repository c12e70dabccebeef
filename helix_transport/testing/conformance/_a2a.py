"""The ``a2a`` section: what a helix A2A endpoint promises (``docs/a2a.md``), checked
with the official ``a2a-sdk`` client.

- ``a2a.card``: the card names a JSON-RPC interface, streaming, a skill with its input
  schema (the schemas extension) and the helix events extension.
- ``a2a.stream``: a streamed send begins with the Task, then updates of that task whose
  ``metadata.helix.sequence`` runs 1, 2, 3 ... with no gap (an update of joined text
  deltas covers ``first_sequence`` .. ``sequence``), ending at a final state; the
  stream then ends.
- ``a2a.send``: a plain send answers the ended task with its output; the same
  ``messageId`` again is the same task, with nothing run again.
- ``a2a.get_task``: ``GetTask`` agrees with the stream (state, last sequence, output).
- ``a2a.resubscribe.ended`` / ``.mid_run`` / ``.from_sequence``: a resubscription
  replays the task identically (sequences, message ids, payloads; the text artifact's
  chunks as one text, since they may be joined otherwise); one after leaving a live
  stream gives what was missed; ``helix-from-sequence: N`` only what follows ``N``.
- ``a2a.cancel``: a running task canceled ends ``canceled``; an ended one is
  ``TaskNotCancelable``.
- ``a2a.not_found``: an unknown task is ``TaskNotFound`` for get, cancel and subscribe.
- ``a2a.invalid_params``: an input the schema rejects, and a message without parts,
  are ``InvalidParams`` naming the field.
- ``a2a.input_required`` (the card's skill lists ``human_input`` and an input that
  asks is given): the stream ends at ``input-required`` with the requests as data,
  ``GetTask`` agrees, and an approval sent on the same task resumes the stream at the
  next sequence, to completion.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from helix_transport._optional import requires

with requires("a2a", "the conformance kit's a2a section"):
    from a2a.client.card_resolver import A2ACardResolver
    from a2a.types import a2a_pb2 as a2a
    from a2a.utils.constants import TransportProtocol
    from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError, TaskNotFoundError

from google.protobuf import json_format

from helix_transport.testing.conformance._a2a_kit import (
    TERMINAL_STATES,
    A2AKit,
    Streamed,
    data_of,
    is_text,
    message_id_of,
    metadata,
    sequence_of,
    state_name,
)
from helix_transport.testing.conformance._contract import Failed, Skipped, require
from helix_transport.testing.conformance._inputs import rejected_input

SCHEMA_EXTENSION = "urn:helix-mesh:a2a:schemas:v1"
EVENTS_EXTENSION = "urn:helix-mesh:a2a:events:v1"
HUMAN_INPUT = "human_input"
STREAM_CHECKS = (
    "a2a.send",
    "a2a.get_task",
    "a2a.resubscribe.ended",
    "a2a.resubscribe.from_sequence",
)


async def run_a2a(kit: A2AKit) -> None:
    """Every check of the section, in the order its tasks allow."""
    if not await kit.check("a2a.card", lambda: check_card(kit)) and kit.card is None:
        kit.not_run(("a2a.stream", *STREAM_CHECKS), "no Agent Card")
        return
    if await kit.check("a2a.stream", lambda: check_stream(kit)) and kit.main is not None:
        await kit.check("a2a.send", lambda: check_send(kit))
        await kit.check("a2a.get_task", lambda: check_get_task(kit))
        await kit.check("a2a.resubscribe.ended", lambda: check_resubscribe_ended(kit))
        await kit.check("a2a.resubscribe.from_sequence", lambda: check_from_sequence(kit))
    else:
        kit.not_run(STREAM_CHECKS, "the first stream failed")
    await kit.check("a2a.resubscribe.mid_run", lambda: check_resubscribe_mid_run(kit))
    await kit.check("a2a.cancel", lambda: check_cancel(kit))
    await kit.check("a2a.not_found", lambda: check_not_found(kit))
    await kit.check("a2a.invalid_params", lambda: check_invalid_params(kit))
    await kit.check("a2a.input_required", lambda: check_input_required(kit))


async def check_card(kit: A2AKit) -> str:
    card = await A2ACardResolver(kit.http, kit.url).get_agent_card()
    kit.card = card
    bindings = [i.protocol_binding for i in card.supported_interfaces]
    require(
        TransportProtocol.JSONRPC.value in bindings,
        f"the card lists no JSON-RPC interface (only {bindings})",
    )
    require(card.capabilities.streaming, "the card does not declare streaming")
    require(len(card.skills) >= 1, "the card lists no skill")
    skill = card.skills[0]
    kit.skill_tags = frozenset(skill.tags)
    extensions = {e.uri: e for e in card.capabilities.extensions}
    require(
        EVENTS_EXTENSION in extensions,
        f"the card does not declare {EVENTS_EXTENSION} (the sequence in every event)",
    )
    require(SCHEMA_EXTENSION in extensions, f"the card does not declare {SCHEMA_EXTENSION}")
    schemas = json_format.MessageToDict(extensions[SCHEMA_EXTENSION].params)
    schema = schemas.get(skill.id, {}).get("input_schema")
    require(
        isinstance(schema, dict),
        f"{SCHEMA_EXTENSION} has no input_schema object for skill {skill.id!r}",
    )
    kit.input_schema = schema
    return f"agent {card.name!r}, bindings {bindings}, skill tags {sorted(skill.tags)}"


async def check_stream(kit: A2AKit) -> str:
    streamed = await kit.send_stream(kit.input_message())
    streamed.require_gapless("SendStreamingMessage", first=1)
    assert streamed.task is not None
    task_id = streamed.task.id
    require(bool(task_id), "the Task the stream began with has no id")
    foreign = [u for u in streamed.updates if _task_of(u) != task_id]
    require(not foreign, f"{len(foreign)} update(s) of another task than {task_id!r}")
    state = streamed.last_state
    require(
        state in TERMINAL_STATES,
        f"the stream's last status is {state_name(state) if state else 'none'}, not a final state",
    )
    finals = [u for u in streamed.updates if _state(u) in TERMINAL_STATES]
    require(len(finals) == 1, f"{len(finals)} final statuses (one ends a task)")
    require(_state(streamed.updates[-1]) in TERMINAL_STATES, "updates after the final status")
    streamed.require_ended("SendStreamingMessage")
    kit.main = streamed
    return f"task {task_id}: {len(streamed.updates)} updates, 1..{streamed.sequences[-1]}, " + (
        state_name(state) if state is not None else "?"
    )


async def check_send(kit: A2AKit) -> str:
    client = await kit.client(streaming=False)
    message = kit.input_message()
    answers = [r async for r in client.send_message(a2a.SendMessageRequest(message=message))]
    require(len(answers) == 1 and answers[0].HasField("task"), "SendMessage did not answer a Task")
    task = answers[0].task
    require(
        task.status.state in TERMINAL_STATES,
        f"SendMessage answered the task {state_name(task.status.state)}, not ended",
    )
    last = metadata(task).get("last_sequence")
    again = [r async for r in client.send_message(a2a.SendMessageRequest(message=message))]
    require(
        len(again) == 1 and again[0].task.id == task.id,
        f"the same messageId again made task {again[0].task.id if again else '?'}, "
        f"not {task.id} again",
    )
    require(
        metadata(again[0].task).get("last_sequence") == last,
        f"the same messageId again ran more (last_sequence {last} -> "
        f"{metadata(again[0].task).get('last_sequence')})",
    )
    return f"task {task.id} {state_name(task.status.state)}; the same messageId: the same task"


async def check_get_task(kit: A2AKit) -> str:
    assert kit.main is not None and kit.main.task is not None
    client = await kit.client()
    task = await client.get_task(a2a.GetTaskRequest(id=kit.main.task.id))
    require(
        task.status.state == kit.main.last_state,
        f"GetTask says {state_name(task.status.state)}, the stream ended "
        f"{state_name(kit.main.last_state or 0)}",
    )
    last = kit.main.sequences[-1]
    require(
        metadata(task).get("last_sequence") == last,
        f"GetTask's metadata.helix.last_sequence is {metadata(task).get('last_sequence')}, "
        f"the stream's last sequence {last}",
    )
    streamed = [
        data_of(u.artifact_update.artifact.parts[0])
        for u in kit.main.updates
        if u.HasField("artifact_update") and u.artifact_update.artifact.artifact_id == "output"
    ]
    got = [data_of(a.parts[0]) for a in task.artifacts if a.artifact_id == "output" and a.parts]
    require(got == streamed, f"GetTask's output artifact {got} is not the stream's {streamed}")
    return f"{state_name(task.status.state)} at sequence {last}, {len(got)} output artifact(s)"


async def check_resubscribe_ended(kit: A2AKit) -> str:
    assert kit.main is not None and kit.main.task is not None
    again = await kit.subscribe(kit.main.task.id)
    again.require_gapless("SubscribeToTask of the ended task", first=1)
    again.require_ended("SubscribeToTask of the ended task")
    _require_same(kit.main, again, "the replay")
    return f"replayed {len(again.updates)} updates, identical"


async def check_from_sequence(kit: A2AKit) -> str:
    assert kit.main is not None and kit.main.task is not None
    middle = len(kit.main.updates) // 2
    half = sequence_of(kit.main.updates[middle - 1]) or 0 if middle else 0
    again = await kit.subscribe(kit.main.task.id, from_sequence=half)
    again.require_gapless(f"SubscribeToTask after sequence {half}", first=half + 1)
    _require_same(kit.main, again, f"the replay after {half}", after=half)
    return f"after {half}: {len(again.updates)} updates, {half + 1}.."


async def check_resubscribe_mid_run(kit: A2AKit) -> str:
    client = await kit.client()
    request = a2a.SendMessageRequest(message=kit.input_message())
    first = await kit.stream(client.send_message(request), leave_after=1)
    require(first.task is not None, "the stream did not begin with the Task")
    assert first.task is not None
    if first.end != "left":
        raise Skipped("the task ended before the kit could leave its stream")
    rest = await kit.subscribe(first.task.id)
    rest.require_gapless("SubscribeToTask after leaving mid-run", first=1)
    rest.require_ended("SubscribeToTask after leaving mid-run")
    _require_same(first, rest, "the resubscription", partial=True)
    state = rest.last_state
    require(state in TERMINAL_STATES, "the resubscription did not reach the task's end")
    return f"left after 1 update; the resubscription gave 1..{rest.sequences[-1]}"


async def check_cancel(kit: A2AKit) -> str:
    client = await kit.client(streaming=False)
    request = a2a.SendMessageRequest(message=kit.input_message())
    request.configuration.return_immediately = True
    answers = [r async for r in client.send_message(request)]
    require(len(answers) == 1 and answers[0].HasField("task"), "SendMessage did not answer a Task")
    task_id = answers[0].task.id
    try:
        canceled = await client.cancel_task(a2a.CancelTaskRequest(id=task_id))
    except TaskNotCancelableError:
        ended = "the task ended before CancelTask"
    else:
        require(
            canceled.status.state == a2a.TASK_STATE_CANCELED,
            f"CancelTask answered the task {state_name(canceled.status.state)}, not canceled",
        )
        ended = "canceled"
    again = await kit.expect_error(
        TaskNotCancelableError, client.cancel_task(a2a.CancelTaskRequest(id=task_id))
    )
    return f"{ended}; again: TaskNotCancelable ({again})"


async def check_not_found(kit: A2AKit) -> str:
    client = await kit.client()
    unknown = f"conformance-unknown-{uuid.uuid4().hex[:10]}"
    await kit.expect_error(TaskNotFoundError, client.get_task(a2a.GetTaskRequest(id=unknown)))
    await kit.expect_error(TaskNotFoundError, client.cancel_task(a2a.CancelTaskRequest(id=unknown)))
    await kit.expect_error(TaskNotFoundError, kit.subscribe(unknown))
    return "GetTask, CancelTask and SubscribeToTask: TaskNotFound"


async def check_invalid_params(kit: A2AKit) -> str:
    rejected = kit.bad_input_json, "was given as rejected"
    if kit.bad_input_json is None:
        derived = rejected_input(kit.input_schema)
        if derived is None:
            raise Skipped("no input the schema certainly rejects (give --bad-input)")
        rejected = derived
    bad, why = rejected
    assert bad is not None
    fields = _schema_fields(kit.input_schema)
    got = await kit.expect_error(InvalidParamsError, kit.send_stream(kit.input_message(bad)))
    require(
        any(name in got for name in fields),
        f"InvalidParams {got!r} for an input that {why} names no field of the schema {fields}",
    )
    empty = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER)
    none = await kit.expect_error(InvalidParamsError, kit.send_stream(empty))
    require("parts" in none, f"InvalidParams {none!r} for a message without parts names no field")
    return f"{got!r}; no parts: {none!r}"


async def check_input_required(kit: A2AKit) -> str:
    if HUMAN_INPUT not in kit.skill_tags:
        raise Skipped(f"the card's skill does not list {HUMAN_INPUT!r}: the agent does not ask")
    if kit.input_required_json is None:
        raise Skipped("no input that makes the agent ask was given (--input-required)")
    asked = await kit.send_stream(kit.input_message(kit.input_required_json))
    asked.require_gapless("the stream of a task that asks", first=1)
    asked.require_ended("the stream that reached input-required")
    assert asked.task is not None
    require(
        asked.last_state == a2a.TASK_STATE_INPUT_REQUIRED,
        f"the stream ended {state_name(asked.last_state or 0)}, not input-required",
    )
    requests = _requests(asked.updates[-1])
    require(bool(requests), "the input-required status carries no input_required requests")
    first = requests[0]
    for key in ("request_id", "tool_name", "kind", "path"):
        require(key in first, f"the request {first} has no {key!r}")
    client = await kit.client()
    task = await client.get_task(a2a.GetTaskRequest(id=asked.task.id))
    require(
        task.status.state == a2a.TASK_STATE_INPUT_REQUIRED,
        f"GetTask says {state_name(task.status.state)} of the task waiting for input",
    )
    answer = kit.message(
        {"request_id": first["request_id"], "approved": True, "reason": "conformance"},
        task_id=asked.task.id,
    )
    resumed = await kit.send_stream(answer)
    last = asked.sequences[-1] or 0
    resumed.require_gapless("the stream after the answer", first=last + 1)
    require(
        resumed.last_state in TERMINAL_STATES,
        f"after the answer the task is {state_name(resumed.last_state or 0)}, not ended",
    )
    return (
        f"asked {first['tool_name']!r} ({first['kind']}, depth {len(first['path'])}); "
        f"answered on the same task: {last + 1}..{resumed.sequences[-1]}, "
        f"{state_name(resumed.last_state or 0)}"
    )


def _task_of(update: a2a.StreamResponse) -> str:
    if update.HasField("status_update"):
        return update.status_update.task_id
    return update.artifact_update.task_id


def _state(update: a2a.StreamResponse) -> int | None:
    return update.status_update.status.state if update.HasField("status_update") else None


def _requests(update: a2a.StreamResponse) -> list[dict[str, Any]]:
    for part in update.status_update.status.message.parts:
        data = data_of(part)
        if isinstance(data, dict) and isinstance(data.get("input_required"), list):
            return list(data["input_required"])
    return []


def _require_same(
    seen: Streamed, again: Streamed, what: str, *, after: int = 0, partial: bool = False
) -> None:
    """``again`` delivers what ``seen`` did after sequence ``after``: the same updates
    (sequence, message id, payload), except that chunks of the ``text`` artifact may
    be joined otherwise (an endpoint joins what a reader is behind on), so the text
    they carry is compared whole (``partial``: ``seen`` is a prefix of ``again``)."""
    mine = [u for u in seen.updates if (sequence_of(u) or 0) > after]
    theirs = again.updates
    texts = _text(mine), _text(theirs)
    same_text = texts[1].startswith(texts[0]) if partial else texts[0] == texts[1]
    require(same_text, f"{what}: the text artifact differs from the first delivery's")
    mine, theirs = [u for u in mine if not is_text(u)], [u for u in theirs if not is_text(u)]
    if partial:
        theirs = theirs[: len(mine)]
    require(
        len(theirs) == len(mine),
        f"{what} gave {len(theirs)} other update(s), the first delivery {len(mine)}",
    )
    for a, b in zip(mine, theirs, strict=True):
        if sequence_of(a) != sequence_of(b) or _payload(a) != _payload(b):
            raise Failed(
                f"{what}: the update at sequence {sequence_of(b)} differs from the first "
                f"delivery ({message_id_of(a)!r} vs {message_id_of(b)!r})"
            )


def _text(updates: list[a2a.StreamResponse]) -> str:
    return "".join(
        part.text for u in updates if is_text(u) for part in u.artifact_update.artifact.parts
    )


def _payload(update: a2a.StreamResponse) -> str:
    return json.dumps(json_format.MessageToDict(update), sort_keys=True)


def _schema_fields(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    return list(schema.get("properties", {}))
