"""Answering requests for input from the CLI, without a server that suspends: the
``respond`` flags, finding a request's path in a folded log, the terminal's questions,
``call``'s watch in its three modes, and ``respond`` as a real process against a small
recording servicer (``tests/transport/test_submit_input.py``'s).

End to end, against real services that suspend: ``tests/cli/test_respond.py``.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from helix_transport import AgentClient, SessionTree, UsageError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.agent.inputs import Answer
from helix_transport.cli import _parser
from helix_transport.cli.answer import RequestWatch, ask, locate
from helix_transport.cli.respond import answer_of
from helix_transport.tree import PendingRequest
from tests.cli.run import cli
from tests.test_tree_input import _asked, _suspended_tree
from tests.transport.test_submit_input import Recording


def _respond(*flags: str) -> Answer:
    return answer_of(_parser().parse_args(["respond", "addr", "root", "call_1_0", *flags]))


def test_the_respond_flags_give_one_answer() -> None:
    assert _respond("--approve", "--reason", "looks fine") == Answer(
        approved=True, reason="looks fine"
    )
    assert _respond("--deny") == Answer(approved=False)
    assert _respond("--result", '{"sent": true}') == Answer(result_json='{"sent": true}')
    assert _respond("--error", "smtp down") == Answer(error="smtp down")
    args = _parser().parse_args(
        ["respond", "a", "root", "r", "--deny", "--path", "root", "mid", "--path", "leaf"]
    )
    assert args.path == ["root", "mid", "leaf"]


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--result", "{nope"], "--result: not JSON"),
        (["--result", "{}", "--reason", "x"], "--reason goes with --approve or --deny"),
        (["--error", " "], "--error: say what failed"),
    ],
)
def test_answers_that_cannot_work_are_refused(flags: list[str], problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        _respond(*flags)


@pytest.mark.parametrize("flags", [[], ["--approve", "--deny"], ["--approve", "--result", "{}"]])
def test_not_exactly_one_answer_flag_is_an_argparse_error(flags: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _respond(*flags)
    assert exited.value.code == 2


def test_locate_gives_the_path_from_the_session_held() -> None:
    _, tree = _suspended_tree()
    assert locate(tree, "root", "call_1_0") == ("root", "mid", "leaf")
    assert locate(tree, "mid", "call_1_0") == ("mid", "leaf")  # asked of mid's service


def test_locate_finds_an_answered_request_so_a_repeat_is_a_no_op() -> None:
    log, tree = _suspended_tree()
    answered = pb.InputAnswered(request_id="call_1_0", outcome=pb.INPUT_OUTCOME_APPROVED)
    tree.add(log.add("leaf", input_answered=answered))
    assert tree.pending_requests() == []
    assert locate(tree, "root", "call_1_0") == ("root", "mid", "leaf")


def test_locate_refuses_an_unknown_or_ambiguous_request() -> None:
    log, tree = _suspended_tree()
    with pytest.raises(UsageError, match="no request 'call_7_0' in the tree of session 'root'"):
        locate(tree, "root", "call_7_0")
    # The same call id in another session (each model numbers its own calls).
    tree.add(log.add("mid", input_required=_asked("call_1_0", ["root", "mid"])))
    with pytest.raises(UsageError, match=r"asked by 2 sessions.*--path") as ambiguous:
        locate(tree, "root", "call_1_0")
    assert "root mid leaf" in str(ambiguous.value) and "root mid;" in str(ambiguous.value)


def _read(*lines: str) -> Callable[[str], str]:
    """A terminal where the person types ``lines``, then closes its input (the prompt
    is printed by ``ask`` itself)."""
    said = iter(lines)

    def read(prompt: str) -> str:
        try:
            return next(said)
        except StopIteration:
            raise EOFError from None

    return read


def _request(kind: str = "approval") -> PendingRequest:
    return PendingRequest(
        session_id="leaf",
        request_id="call_1_0",
        tool_name="send_email",
        arguments_json="{}",
        kind=kind,
        path=("root", "leaf"),
    )


async def test_the_terminal_is_asked_for_an_approval_or_a_result() -> None:
    out = io.StringIO()
    approve = await ask(_request(), read=_read("y", "ok by me"), out=out)
    assert approve == Answer(approved=True, reason="ok by me")
    assert await ask(_request(), read=_read("", ""), out=out) == Answer(approved=False)
    assert await ask(_request(), read=_read(), out=out) is None  # end of input: no answer
    result = await ask(_request("client_result"), read=_read("{nope", '{"a": 1}'), out=out)
    assert result == Answer(result_json='{"a": 1}') and "not JSON" in out.getvalue()
    failed = await ask(_request("client_result"), read=_read("!printer on fire"), out=out)
    assert failed == Answer(error="printer on fire")


@pytest.fixture
async def recording() -> AsyncIterator[tuple[Recording, str]]:
    servicer = Recording([])  # type: ignore[abstract]  # the RPCs it leaves out are UNIMPLEMENTED
    server = grpc.aio.server()
    pb_grpc.add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_the_watch_without_a_terminal_says_how_to_answer_once(
    recording: tuple[Recording, str],
) -> None:
    servicer, address = recording
    log, _ = _suspended_tree()
    out = io.StringIO()
    async with await AgentClient.connect(address) as client:
        watch = RequestWatch(client, "root", mode="hint", out=out)
        for event in [*log.events, *log.events]:  # a replay shows nothing twice
            await watch.add(event)
    text = out.getvalue()
    assert text.count("input required: send_email") == 1
    assert (
        f"answer it with: helix-mesh respond {address} root call_1_0 --approve|--deny "
        "[--reason TEXT] --path root mid leaf\n"
    ) in text
    assert servicer.got == []


async def test_the_watch_auto_approves_approvals_and_says_so(
    recording: tuple[Recording, str],
) -> None:
    servicer, address = recording
    log, _ = _suspended_tree()
    client_tool = _asked("call_2_0", ["root", "mid"])
    client_tool.kind = pb.INPUT_KIND_CLIENT_RESULT
    log.add("mid", input_required=client_tool)
    out = io.StringIO()
    async with await AgentClient.connect(address) as client:
        watch = RequestWatch(client, "root", mode="auto", out=out)
        for event in log.events:
            await watch.add(event)
    (sent,) = servicer.got  # the client tool's result is not the CLI's to make up
    assert (sent.request_id, list(sent.path)) == ("call_1_0", ["root", "mid", "leaf"])
    assert sent.approval.approved and sent.approval.reason == "automatic: --auto-approve"
    text = out.getvalue()
    assert "--auto-approve: approving send_email by itself" in text
    assert "call_1_0: approved" in text and "(sent; session running)" in text
    assert (
        f"the answer went to {address}, the service of root, and down the path root > mid > leaf"
        in text
    )
    assert "root call_2_0 --result JSON|--error TEXT --path root mid\n" in text


async def test_respond_as_a_process(recording: tuple[Recording, str]) -> None:
    servicer, address = recording
    code, out, err = await cli(
        "respond", address, "root", "call_1_0", "--deny", "--reason", "no", "--path", "root", "leaf"
    )
    assert (code, err) == (0, "")
    assert out.strip() == "call_1_0: denied (no) (sent; session running)"
    assert list(servicer.got[0].path) == ["root", "leaf"]
    servicer.replies = [grpc.StatusCode.NOT_FOUND]
    code, _, err = await cli("respond", address, "root", "call_9_0", "--approve", "--path", "root")
    assert code == 2 and err.startswith(
        "helix-mesh: session 'root': no request for input 'call_9_0'"
    )


def test_a_fold_of_nothing_locates_nothing() -> None:
    with pytest.raises(UsageError, match="no request"):
        locate(SessionTree(), "root", "call_1_0")
