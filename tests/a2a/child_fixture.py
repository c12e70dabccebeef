"""An A2A agent built only with ``a2a-sdk``'s server, in its own process: the child a
helix parent delegates to in ``test_child_processes``.

``python -m tests.a2a.child_fixture --port P --state DIR`` serves JSON-RPC at ``/`` and
its card at ``/.well-known/agent-card.json``. It keeps what survives a SIGKILL in DIR:

- ``tasks/``: every task, one JSON file each, written (atomically) on each save of the
  SDK's task store: a restarted agent has its tasks, as with ``DatabaseTaskStore``.
- ``received.log``: one line per message received (its id, and the ``traceparent``
  header it came with), appended before the SDK handles it: the proof of how many
  times a message was sent.

Its work, for the input ``{"steps": n, "delay_s": d, "ask": bool, "usage": bool}``:
for each step a ``working`` status message (``step i``) and a part appended to the
artifact ``progress``; with ``ask``, halfway through, ``input-required`` for an
approval (continued by the answer, the follow-up message on the task); then the
artifact ``result`` (``{"steps": n, "approved": ...}``) and ``completed``, with the
usage it reports in the task's metadata.

A restarted agent resumes its unfinished tasks from what the store says they did
(a step is a status message and a part). The SDK does not do that itself: a task
store keeps tasks, not the executions behind them, so the fixture hands each such
task to its request handler's task registry again (an internal of ``a2a-sdk``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
)
from google.protobuf.json_format import MessageToDict, MessageToJson, Parse
from google.protobuf.struct_pb2 import Struct, Value
from starlette.applications import Starlette

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "steps": {"type": "integer"},
        "delay_s": {"type": "number"},
        "ask": {"type": "boolean"},
        "usage": {"type": "boolean"},
    },
    "required": ["steps"],
}
WORKING = (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)


def _data(message: Message) -> dict[str, Any]:
    for part in message.parts:
        if part.HasField("data"):
            value = MessageToDict(part.data)
            return value if isinstance(value, dict) else {}
    return {}


def _conversation(task: Task) -> list[Message]:
    messages = list(task.history)
    if task.status.HasField("message") and (
        not messages or messages[-1].message_id != task.status.message.message_id
    ):
        messages.append(task.status.message)
    return messages


class StepsExecutor(AgentExecutor):
    """Works through its steps, resuming a task from what its store holds."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        task_id, context_id = str(context.task_id), str(context.context_id)
        updater = TaskUpdater(event_queue, task_id, context_id)
        if task is None:
            assert context.message is not None  # a task is only ever started by a message
            task = Task(id=task_id, context_id=context_id, history=[context.message])
            task.status.state = TaskState.TASK_STATE_SUBMITTED
            await event_queue.enqueue_event(task)
            conversation = [context.message]
        else:
            conversation = _conversation(task)
            if context.message is not None and all(
                m.message_id != context.message.message_id for m in conversation
            ):
                conversation.append(context.message)
        spec = _data(conversation[0]) if conversation else {}
        steps, delay = int(spec.get("steps", 3)), float(spec.get("delay_s", 0.2))
        said = [m for m in conversation if m.role == Role.ROLE_AGENT]
        done = sum(1 for m in said if m.message_id.startswith(f"{task_id}-step-"))
        answers = [_data(m) for m in conversation[1:] if m.role == Role.ROLE_USER]
        approved = next((a["approved"] for a in answers if "approved" in a), None)
        asked = any(m.message_id == f"{task_id}-ask" for m in said)
        parts = len(task.artifacts[0].parts) if task is not None and task.artifacts else 0
        for step in range(done, steps):
            if spec.get("ask") and step == steps // 2 and approved is None:
                if not asked:
                    question = updater.new_agent_message(
                        [Part(text="May I go on?"), Part(data=_value({"kind": "approval"}))]
                    )
                    question.message_id = f"{task_id}-ask"
                    await updater.requires_input(question)
                return
            message = updater.new_agent_message([Part(text=f"step {step + 1}")])
            message.message_id = f"{task_id}-step-{step + 1}"
            await updater.update_status(TaskState.TASK_STATE_WORKING, message=message)
            if parts <= step:
                await updater.add_artifact(
                    [Part(text=f"part {step + 1};")], artifact_id="progress", append=step > 0
                )
            await asyncio.sleep(delay)
        result = {"steps": steps, "approved": approved}
        await updater.add_artifact([Part(data=_value(result))], artifact_id="result")
        if spec.get("usage"):
            usage = {"prompt_tokens": 7 * steps, "completion_tokens": 3 * steps}
            await updater.update_status(TaskState.TASK_STATE_WORKING, metadata={"usage": usage})
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, str(context.task_id), str(context.context_id))
        await updater.cancel()


def _value(data: dict[str, Any]) -> Value:
    value = Value()
    value.struct_value.update(data)
    return value


class FileTaskStore(InMemoryTaskStore):
    """The SDK's in-memory store, each task also written to a file on every save."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    async def load(self) -> list[Task]:
        tasks = [Parse(p.read_text(), Task()) for p in sorted(self.directory.glob("*.json"))]
        for task in tasks:
            await super().save(task, ServerCallContext())
        return tasks

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await super().save(task, context)
        await asyncio.to_thread(self._write, task.id, MessageToJson(task))

    def _write(self, task_id: str, text: str) -> None:
        path = self.directory / f"{task_id}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(text)
        os.replace(temporary, path)


class CountingHandler(DefaultRequestHandler):
    """Notes each message received, before the SDK handles it."""

    received: Path

    def _note(self, params: SendMessageRequest, context: ServerCallContext) -> None:
        headers = context.state.get("headers", {})
        line = json.dumps(
            {"message_id": params.message.message_id, "traceparent": headers.get("traceparent")}
        )
        with self.received.open("a") as log:
            log.write(line + "\n")

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Any:
        self._note(params, context)
        return await super().on_message_send(params, context)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Any:
        self._note(params, context)
        async for event in super().on_message_send_stream(params, context):
            yield event


def card(port: int) -> AgentCard:
    extension_params = Struct()
    extension_params.update({"steps": {"input_schema": INPUT_SCHEMA}})
    return AgentCard(
        name="steps-agent",
        description="Works through a number of steps; may ask for approval halfway.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://127.0.0.1:{port}/", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=AgentCapabilities(streaming=True, extensions=[]),
        default_input_modes=["application/json", "text/plain"],
        default_output_modes=["application/json", "text/plain"],
        skills=[AgentSkill(id="steps", name="steps", description="Counts steps.", tags=["test"])],
    )


async def resume_unfinished(handler: CountingHandler, tasks: list[Task]) -> None:
    """Run again the executions a killed process left unfinished."""
    registry = handler._active_task_registry
    for task in tasks:
        if task.status.state not in WORKING:
            continue
        context = ServerCallContext()
        active = await registry.get_or_create(
            task.id, call_context=context, context_id=task.context_id
        )
        await active.enqueue_request(
            RequestContext(context, task_id=task.id, context_id=task.context_id, task=task)
        )


def build(port: int, state: Path) -> Starlette:
    store = FileTaskStore(state / "tasks")
    agent_card = card(port)
    agent_card.capabilities.extensions.add(
        uri="urn:helix-mesh:a2a:schemas:v1",
        params=_struct({"steps": {"input_schema": INPUT_SCHEMA}}),
    )
    handler = CountingHandler(StepsExecutor(), store, agent_card)
    handler.received = state / "received.log"

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        await resume_unfinished(handler, await store.load())
        yield

    routes = [*create_agent_card_routes(agent_card), *create_jsonrpc_routes(handler, rpc_url="/")]
    return Starlette(routes=routes, lifespan=lifespan)


def _struct(data: dict[str, Any]) -> Struct:
    struct = Struct()
    struct.update(data)
    return struct


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", type=Path, required=True)
    args = parser.parse_args()
    app = build(args.port, args.state)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
