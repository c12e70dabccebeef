"""``AgentClient.submit_input`` and ``interrupt(abort=)`` on the wire, against a small
servicer on 127.0.0.1 that records what it got and answers as told.

The request carries exactly the one answer given; an UNAVAILABLE reply is retried (an
answer is idempotent per request id); a NOT_FOUND naming the request in its ErrorInfo
is ``RequestNotFound``, one without is ``SessionNotFound``.
"""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from helix_transport import (
    AgentClient,
    RequestNotFound,
    SessionNotFound,
    SessionStateConflict,
    UsageError,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport._rich_status import REQUEST_NOT_FOUND, trailing_metadata


class Recording(pb_grpc.AgentServiceServicer):
    """Answers ``SubmitInput`` with the next of ``replies`` (a status code fails it)."""

    def __init__(self, replies: list[grpc.StatusCode | None]) -> None:
        self.replies = replies
        self.got: list[pb.SubmitInputRequest] = []
        self.interrupts: list[pb.InterruptRequest] = []

    async def SubmitInput(
        self, request: pb.SubmitInputRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SubmitInputResponse:
        self.got.append(request)
        code = self.replies.pop(0) if self.replies else None
        if code is grpc.StatusCode.NOT_FOUND:
            message = f"request {request.request_id!r} not found"
            await context.abort(
                code,
                message,
                trailing_metadata=trailing_metadata(code, message, reason=REQUEST_NOT_FOUND),
            )
        if code is not None:
            await context.abort(code, "no")
        return pb.SubmitInputResponse(status=pb.SESSION_STATUS_RUNNING, applied=True)

    async def Interrupt(
        self, request: pb.InterruptRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.InterruptResponse:
        self.interrupts.append(request)
        return pb.InterruptResponse(accepted=True, status=pb.SESSION_STATUS_TERMINATED)


@pytest.fixture
async def serving() -> AsyncIterator[tuple[Recording, str]]:
    servicer = Recording([])  # type: ignore[abstract]  # the RPCs it leaves out are UNIMPLEMENTED
    server = grpc.aio.server()
    pb_grpc.add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_each_answer_goes_as_its_own_kind(serving: tuple[Recording, str]) -> None:
    servicer, address = serving
    async with await AgentClient.connect(address) as client:
        reply = await client.submit_input(
            "root", "call_1_0", path=["root", "child"], approved=False, reason="not now"
        )
        await client.submit_input("root", "call_2_0", result_json='{"ok": 1}')
        await client.submit_input("root", "call_3_0", error="the client tool broke")
        # A service passing a ClientResult on gives both; the error wins, as on the wire.
        await client.submit_input("root", "call_4_0", result_json="", error="it broke")
    assert reply.applied and reply.status == pb.SESSION_STATUS_RUNNING
    denied, result, failed, passed_on = servicer.got
    assert denied.session_id == "root" and list(denied.path) == ["root", "child"]
    assert denied.WhichOneof("answer") == "approval"
    assert (denied.approval.approved, denied.approval.reason) == (False, "not now")
    assert result.WhichOneof("answer") == "result" and result.result.result_json == '{"ok": 1}'
    assert (
        failed.WhichOneof("answer") == "result" and failed.result.error == "the client tool broke"
    )
    assert passed_on.result.error == "it broke"


@pytest.mark.parametrize(
    "answer",
    [{}, {"approved": True, "result_json": "{}"}, {"approved": False, "error": "x"}],
)
async def test_not_exactly_one_answer_is_refused_before_sending(
    serving: tuple[Recording, str], answer: dict[str, Any]
) -> None:
    servicer, address = serving
    async with await AgentClient.connect(address) as client:
        with pytest.raises(UsageError, match="exactly one answer"):
            await client.submit_input("root", "call_1_0", **answer)
    assert servicer.got == []


async def test_an_unavailable_service_is_asked_again(serving: tuple[Recording, str]) -> None:
    servicer, address = serving
    servicer.replies = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE]
    async with await AgentClient.connect(address) as client:
        reply = await client.submit_input("root", "call_1_0", approved=True)
    assert reply.applied and len(servicer.got) == 3
    assert {r.request_id for r in servicer.got} == {"call_1_0"}


async def test_not_found_tells_a_request_from_a_session(serving: tuple[Recording, str]) -> None:
    servicer, address = serving
    servicer.replies = [grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION]
    async with await AgentClient.connect(address) as client:
        with pytest.raises(RequestNotFound) as missing:
            await client.submit_input("root", "call_9_9", approved=True)
        assert (missing.value.session_id, missing.value.request_id) == ("root", "call_9_9")
        assert isinstance(missing.value, SessionNotFound) and "call_9_9" in str(missing.value)
        again = pickle.loads(pickle.dumps(missing.value))
        assert (type(again), again.request_id) == (RequestNotFound, "call_9_9")
        with pytest.raises(SessionStateConflict):
            await client.submit_input("root", "call_1_0", approved=False)


async def test_interrupt_can_abort(serving: tuple[Recording, str]) -> None:
    servicer, address = serving
    async with await AgentClient.connect(address) as client:
        await client.interrupt("root", reason="stop")
        await client.interrupt("root", reason="end it", abort=True)
    assert [(i.reason, i.abort) for i in servicer.interrupts] == [("stop", False), ("end it", True)]
