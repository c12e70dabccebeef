"""The writer: the one writer of a session's log, appending with group commit.

Events emitted while a store write is in flight are appended together by the next
write, so a fast producer costs one store round trip per batch, not per event. Every
append is fenced (``expected_sequence``). An event is published to the hub only after
the store has assigned its sequence. The writer serializes each event once: the store,
the hub and the ``Stream`` responses all use those bytes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence

from helix_transport._events import is_terminal, stamp
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport._wire import SEQUENCE_KEY, sequenced_all, varint
from helix_transport.log.hub import EventHub
from helix_transport.metrics.instruments import instruments
from helix_transport.store import Checkpoint, SessionUpdate, Store

_TEXT_DELTA_KEY = b"\x62"
"""``StreamEvent.text_delta``: field 12, length-delimited."""
_TEXT_KEY = b"\x0a"
"""``TextDelta.text``: field 1, length-delimited."""
_PAYLOAD_KEYS = b"\x30"
"""The smallest key byte of a field past ``step`` (field 6 on): a serialized event
whose first byte is at least this sets none of the stamped fields (protobuf writes
fields in number order), so the stamp's bytes can go before it as they are."""
_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


class SessionWriter:
    """Appends one session's events with group commit. One writer per session.

    ``emit`` never blocks; ``flush`` waits until everything emitted is durable and
    raises the store's error if a write failed (e.g. ``SequenceConflict`` when
    another process took the session over).
    """

    def __init__(
        self,
        store: Store,
        hub: EventHub,
        *,
        session_id: str,
        agent_type: str,
        last_sequence: int,
        event_session_id: str = "",
    ) -> None:
        self._store = store
        self._hub = hub
        self.session_id = session_id
        """The session's key in the store (and the hub)."""
        self.event_session_id = event_session_id or session_id
        """The id the events carry: their readers', when the store's key is another."""
        self.agent_type = agent_type
        self.last_sequence = last_sequence
        """The sequence of the last event in the store."""
        self.step = 0
        self._next_sequence = last_sequence + 1
        """The sequence the next emitted event gets: writes go in order, and a failed
        one stops the writer, so an event's sequence is known when it is emitted."""
        self._pending: list[bytes] = []
        """Emitted events not yet written, serialized with their sequences."""
        self._run: list[bytes] = []
        """Emitted payloads after ``_pending``, not yet stamped: they get ``_run_head``
        and their sequences (from ``_run_first`` on) in one pass when the run closes
        (``_close_run``)."""
        self._run_head = b""
        """The stamp of the open run's first event: sequence, session, agent type, time
        and step (fields 1-5)."""
        self._run_first = 0
        """The sequence of ``_run[0]``."""
        self._run_step: int | None = None
        """The step of the open run's stamp; None while no run is open."""
        self._last: StreamEvent | None = None
        """The last pending event, when emitted as a message: whether it ends the
        session's stream is asked once per write, not of every event (forwarded bytes
        never do)."""
        self._update: SessionUpdate | None = None
        """A record update to apply with the next batch (see ``flush``)."""
        self._checkpoint: Checkpoint | None = None
        """A checkpoint to save with the next batch, at its end (see ``flush``)."""
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._stamp = StreamEvent(session_id=self.event_session_id, agent_type=agent_type)
        """A run's stamp (``_open_run``), set in place: protobuf's setters and serializer
        beat building the same bytes in Python."""
        self._clock = self._stamp.time
        """``_stamp.time``, read once: each read of a sub-message makes a wrapper."""
        hub.expect(session_id, self._next_sequence)

    def emit(self, event: StreamEvent, *, defer: bool = False) -> None:
        """Queue ``event`` for the log, stamped with session, agent type, step, time and
        the sequence it will have (in the logged bytes: ``event`` itself is stamped only
        when it sets one of those fields itself, keeping its ``step``).

        The time is that of the first event of its write (see ``_open_run``).

        With ``defer`` no write starts for it: the next ``emit`` or ``flush`` carries
        it. For an event the caller follows at once with more (a run's last events
        before its end), so they go in one write, not two.
        """
        if self._error is not None:
            raise self._error
        # Serialized once, here: the store, the hub and every reader's response use these
        # bytes. The usual event sets only its payload: it joins the open run, stamped
        # with the run when the run closes (``_close_run``), not one event at a time.
        payload = event.SerializeToString()
        if payload >= _PAYLOAD_KEYS or not payload:  # its first byte, unsliced
            if self._run_step != self.step:  # no run open, or the step moved on
                self._open_run()
            self._run.append(payload)
        else:  # it sets a stamped field (its own step, say): stamped as a message
            self._close_run()
            stamp(
                event, session_id=self.event_session_id, agent_type=self.agent_type, step=self.step
            ).sequence = self._next_sequence
            self._pending.append(event.SerializeToString())
        self._next_sequence += 1
        self._last = event
        if self._task is None and not defer:
            self._task = asyncio.create_task(self._drain())

    def emit_text(self, text: str) -> None:
        """``emit`` of a ``text_delta`` carrying ``text``, encoded straight to bytes: a
        streamed model's every fragment comes this way."""
        if self._error is not None:
            raise self._error
        raw = text.encode()
        size = len(raw)
        # protobuf leaves out an empty string: so does this, to keep the bytes canonical.
        inner = (
            (_TEXT_KEY + (_ONE_BYTE[size] if size < 0x80 else varint(size)) + raw) if raw else b""
        )
        if self._run_step != self.step:
            self._open_run()
        self._run.append(_TEXT_DELTA_KEY + varint(len(inner)) + inner)
        self._next_sequence += 1
        self._last = None  # not a terminal event
        if self._task is None:
            self._task = asyncio.create_task(self._drain())

    def emit_encoded(self, payloads: Sequence[bytes]) -> None:
        """Queue events given as their serialized payload: each one ``StreamEvent``
        oneof field (a forwarded child event, say), stamped like ``emit``. Nothing
        parses or serializes them: the store and readers get these bytes behind the
        stamp. None of them may end the stream.
        """
        if self._error is not None:
            raise self._error
        if not payloads:
            return
        if self._run_step != self.step:
            self._open_run()
        self._run += payloads
        self._next_sequence += len(payloads)
        self._last = None
        if self._task is None:
            self._task = asyncio.create_task(self._drain())

    def _open_run(self) -> None:
        """Close the open run, if any, and open one stamped now, at the current step.

        Every event of a run gets the one stamp (its time is when the run's first
        event was emitted: at most the burst before its write is taken, and never
        after its own emit or its append, which ``StreamEvent.time`` stands for):
        stamping each event on its own was about half of ``emit``'s cost.
        """
        if self._run:
            self._close_run()
        head = self._stamp
        head.sequence = self._run_first = self._next_sequence
        head.step = self._run_step = self.step
        # divmod beats Timestamp.FromNanoseconds, which is pure Python.
        self._clock.seconds, self._clock.nanos = divmod(time.time_ns(), 1_000_000_000)
        # With the first event's sequence: a run of one (a paced writer's every event)
        # is this and its payload, as an event was stamped before runs.
        self._run_head = head.SerializeToString()

    def _close_run(self) -> None:
        """Stamp the open run's payloads into ``_pending``, in one pass."""
        run = self._run
        if len(run) == 1:
            self._pending.append(self._run_head + run[0])
            self._run = []
        elif run:
            # The sequence is field 1, so the head's bytes start with its key and varint.
            first = self._run_first
            head = self._run_head[len(SEQUENCE_KEY) + len(varint(first)) :]
            self._pending += sequenced_all(first, head, run)
            self._run = []
        self._run_step = None

    async def _drain(self) -> None:
        try:
            while self._pending or self._run:
                self._close_run()
                batch, self._pending = self._pending, []
                update, self._update = self._update, None
                checkpoint, self._checkpoint = self._checkpoint, None
                if checkpoint is not None:  # taken where this batch leaves the log
                    checkpoint = dataclasses.replace(
                        checkpoint, last_sequence=self._next_sequence - 1
                    )
                terminal = self._last is not None and is_terminal(self._last)
                await self._write(batch, terminal, update, checkpoint)
        except BaseException as exc:
            self._error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            self._task = None

    async def _write(
        self,
        encoded: list[bytes],
        terminal: bool,
        update: SessionUpdate | None,
        checkpoint: Checkpoint | None,
    ) -> None:
        # The fence fixed these events' sequences when they were emitted.
        first = self.last_sequence + 1
        self.last_sequence = await self._store.append(
            self.session_id,
            (),
            expected_sequence=self.last_sequence,
            update=update,
            encoded=encoded,
            checkpoint=checkpoint,
        )
        instruments().events_appended.add(len(encoded))
        if not self._closed:
            self._hub.publish_encoded(self.session_id, first, encoded, terminal=terminal)

    def close(self) -> None:
        """The run is over: a write still in flight lands in the store, but its events
        are not published. Its hub tail is gone (``EventHub.forget``), and publishing
        would make a new one that nothing drops, which readers would wait on."""
        self._closed = True

    async def flush(
        self, update: SessionUpdate | None = None, *, checkpoint: Checkpoint | None = None
    ) -> None:
        """Wait until every emitted event is in the store.

        With ``update``, also apply it to the session record, and with ``checkpoint``
        save it (its ``last_sequence`` set to where the log then ends): in the same
        atomic write as the pending events when there are any (one store round trip,
        not two or three), else on their own.
        """
        if self._error is not None:
            raise self._error
        if update is not None:
            self._update = update
        if checkpoint is not None:
            self._checkpoint = checkpoint
        if self._task is None and (self._pending or self._run):  # emitted with defer
            self._task = asyncio.create_task(self._drain())
        while self._task is not None:
            await asyncio.shield(self._task)
        if self._error is not None:
            raise self._error
        if checkpoint is not None and self._checkpoint is not None:  # no batch carried it
            # An append of no events: the update (if no batch carried it either) and
            # the checkpoint in one fenced write.
            self._checkpoint = None
            update, self._update = self._update, None
            await self._store.append(
                self.session_id,
                (),
                expected_sequence=self.last_sequence,
                update=update,
                encoded=[],
                checkpoint=dataclasses.replace(checkpoint, last_sequence=self.last_sequence),
            )
        elif update is not None and self._update is not None:  # no batch carried it
            self._update = None
            await self._store.update_session(self.session_id, update)

    async def finish(
        self, event: StreamEvent, update: SessionUpdate, *, checkpoint: Checkpoint | None = None
    ) -> None:
        """Append a terminal ``event`` together with the session ``update`` (and a
        ``checkpoint``, see ``flush``), atomically.

        Events still pending go in the same write (the run's last events, its output
        and its end: usually one store round trip, not two).
        """
        self.emit(event)
        await self.flush(update, checkpoint=checkpoint)
