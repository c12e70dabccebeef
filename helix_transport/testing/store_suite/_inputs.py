"""The store suite: people's input (``InputStore`` answers, interrupts that abort)."""

from __future__ import annotations

import asyncio
import json

import pytest

from helix_transport._exceptions import UsageError
from helix_transport.store import Interrupt, InterruptLookup, Store
from helix_transport.testing.store_suite._helpers import make_command

APPROVED = '{"approved": true, "reason": "looks right"}'
DENIED = '{"approved": false, "reason": "not that file"}'


class InputConformance:
    """Answers are stored once per request, whoever asks first; an abort outranks a stop."""

    pytestmark = pytest.mark.asyncio

    async def test_the_first_answer_is_stored_and_later_ones_get_it_back(
        self, store: Store
    ) -> None:
        assert await store.put_answer("s-1", "call-1", APPROVED) == (APPROVED, True)
        assert await store.list_answers("s-1") == {"call-1": APPROVED}
        # The same answer again (a retried SubmitInput): not stored again.
        assert await store.put_answer("s-1", "call-1", APPROVED) == (APPROVED, False)
        # A different one: refused by handing back the first.
        assert await store.put_answer("s-1", "call-1", DENIED) == (APPROVED, False)
        assert await store.list_answers("s-1") == {"call-1": APPROVED}

    async def test_of_concurrent_answers_exactly_one_is_stored(self, store: Store) -> None:
        answers = [json.dumps({"result_json": json.dumps({"n": n})}) for n in range(20)]
        results = await asyncio.gather(
            *(store.put_answer("s-1", "call-1", answer) for answer in answers)
        )
        winners = [answer for answer, (_, stored) in zip(answers, results, strict=True) if stored]
        assert len(winners) == 1, results
        assert {stored for stored, _ in results} == {winners[0]}  # every caller sees it
        assert await store.list_answers("s-1") == {"call-1": winners[0]}

    async def test_answers_are_kept_per_request_and_per_session(self, store: Store) -> None:
        assert await store.list_answers("nobody") == {}
        await store.put_answer("s-1", "call-1", APPROVED)
        await store.put_answer("s-1", "call-2", '{"error": "the client gave up"}')
        # The same request id in another session is another request.
        assert await store.put_answer("s-2", "call-1", DENIED) == (DENIED, True)
        assert await store.list_answers("s-1") == {
            "call-1": APPROVED,
            "call-2": '{"error": "the client gave up"}',
        }
        assert await store.list_answers("s-2") == {"call-1": DENIED}
        assert await store.list_answers("s-3") == {}

    async def test_a_mebibyte_answer_is_kept_exactly(self, store: Store) -> None:
        # A client tool's result can be large; the store keeps it as it came, escapes,
        # quotes, non-ASCII and all.
        result = {"rows": ["é\\\"'\n\t✓𝄞" * 8, "x" * (1 << 20)]}
        answer = json.dumps({"result_json": json.dumps(result)}, ensure_ascii=False)
        assert len(answer.encode()) > 1 << 20
        assert await store.put_answer("s-1", "call-1", answer) == (answer, True)
        assert await store.put_answer("s-1", "call-1", APPROVED) == (answer, False)
        assert await store.list_answers("s-1") == {"call-1": answer}

    async def test_an_answer_is_stored_as_storable_text(self, store: Store) -> None:
        # NUL and lone surrogates, which not every backend can hold, become U+FFFD.
        stored, created = await store.put_answer("s-1", "call-1", '{"reason": "a\x00b\ud800"}')
        assert (stored, created) == ('{"reason": "a\ufffdb\ufffd"}', True)
        assert await store.list_answers("s-1") == {"call-1": stored}

    @pytest.mark.parametrize("request_id", ["", "call\x00", "call-\udc00"])
    async def test_a_request_id_that_is_not_storable_is_refused(
        self, store: Store, request_id: str
    ) -> None:
        # Rewritten, it would answer another request.
        with pytest.raises(UsageError, match="request id"):
            await store.put_answer("s-1", request_id, APPROVED)
        assert await store.list_answers("s-1") == {}

    async def test_an_abort_is_taken_as_one(self, store: Store) -> None:
        await store.set_interrupt("s-1", "cancelled by the user", abort=True)
        assert await store.take_interrupt("s-1") == Interrupt("cancelled by the user", abort=True)
        assert await store.take_interrupt("s-1") is None  # taking clears it
        await store.set_interrupt("s-1", "")
        assert await store.take_interrupt("s-1") == Interrupt("", abort=False)

    async def test_a_plain_interrupt_never_replaces_an_abort(self, store: Store) -> None:
        await store.set_interrupt("s-1", "abort it", abort=True)
        await store.set_interrupt("s-1", "just stop")
        assert await store.take_interrupt("s-1") == Interrupt("abort it", abort=True)
        # An abort replaces a plain interrupt, and a later abort the earlier one.
        await store.set_interrupt("s-1", "just stop")
        await store.set_interrupt("s-1", "abort it", abort=True)
        await store.set_interrupt("s-1", "abort it now", abort=True)
        await store.set_interrupt("s-1", "stop after all")
        assert await store.take_interrupt("s-1") == Interrupt("abort it now", abort=True)
        # Once taken, a plain interrupt is plain again.
        await store.set_interrupt("s-1", "stop")
        assert await store.take_interrupt("s-1") == Interrupt("stop")

    async def test_an_interrupt_reason_is_stored_as_storable_text(self, store: Store) -> None:
        await store.set_interrupt("s-1", "a\x00b\udfff", abort=True)
        assert await store.take_interrupt("s-1") == Interrupt("a\ufffdb\ufffd", abort=True)

    async def test_a_pending_abort_is_a_pending_interrupt(self, store: Store) -> None:
        if not isinstance(store, InterruptLookup):  # optional; every built-in store has it
            pytest.skip("no pending_interrupts")
        await store.set_interrupt("s-1", "abort", abort=True)
        await store.set_interrupt("s-1", "stop")
        await store.set_interrupt("s-2", "stop")
        assert await store.pending_interrupts(["s-1", "s-2", "s-3"]) == {"s-1", "s-2"}
        assert await store.take_interrupt("s-1") == Interrupt("abort", abort=True)
        assert await store.pending_interrupts(["s-1", "s-2", "s-3"]) == {"s-2"}

    async def test_an_abort_command_is_kept_beside_an_interrupt(self, store: Store) -> None:
        # One command of each kind per child: an abort cascading to a child does not
        # take the place of an interrupt already owed to it.
        interrupt = make_command("p", "c", created_at=1.0, reason="stop")
        abort = make_command("p", "c", kind="abort", created_at=2.0, reason="abort")
        await store.put_commands([interrupt, abort])
        assert await store.list_commands() == [interrupt, abort]
        await store.delete_command(interrupt)
        assert await store.list_commands() == [abort]
