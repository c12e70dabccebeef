"""Readers of a whole log go on past a short page: SQLite cuts a page at 4 MiB, so a page
of fewer than READ_LIMIT events is not the log's end (found by review: a resumed parent
would have forwarded a child's events again, and a turn after 4 MiB was not seen)."""

from __future__ import annotations

from pathlib import Path

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.turns import heal, read_turns
from helix_transport.log.children import ForwardedSoFar
from helix_transport.store import SessionRecord, Store, open_store

BIG = "r" * (600 << 10)  # a tool result under the 1 MiB cap; ten of them pass 4 MiB


async def _store(tmp_path: Path) -> Store:
    store = await open_store(f"sqlite:///{tmp_path}/short-pages.db")
    record = SessionRecord(session_id="p", agent_type="a", input_json="{}", input_hash="")
    await store.create_session(record)
    return store


async def test_a_resumed_parent_finds_the_last_forwarded_child_event(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    try:
        events = []
        for n in range(1, 11):
            child = pb.StreamEvent(sequence=n, session_id="c", tool_end=pb.ToolEnd(result_json=BIG))
            events.append(pb.StreamEvent(child_event=pb.ChildEvent(tool_call_id="t1", event=child)))
        await store.append("p", events, expected_sequence=0)
        assert len(await store.read("p")) < 10  # the short page this is about
        assert await ForwardedSoFar(store, "p").last("t1") == 10
    finally:
        await store.aclose()


async def test_turns_and_tool_results_past_a_short_page_are_found(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    try:
        ends = [
            pb.StreamEvent(tool_end=pb.ToolEnd(tool_call_id=f"c{i}", result_json=BIG))
            for i in range(10)
        ]
        turn = pb.StreamEvent(turn_started=pb.TurnStarted(turn=2, message="again"))
        await store.append("p", [*ends, turn], expected_sequence=0)
        assert [t.turn for t in await read_turns(store, "p")] == [2]
        calls = [{"id": f"c{i}", "function": {"name": "f", "arguments": "{}"}} for i in range(10)]
        messages = [{"role": "assistant", "content": "", "tool_calls": calls}]
        healed = await heal(store, "p", messages, from_sequence=0, until=turn.sequence)
        assert [m["content"] for m in healed[1:]] == [BIG] * 10
    finally:
        await store.aclose()
