"""Interrupts on their way from a session to its children, through the parent's outbox.

An interrupt for a child is first a row in the parent's store (a ``ChildCommand``
of kind ``interrupt``, or ``abort`` for an abort, which ends the child TERMINATED),
written before anything else changes, and only then a call to the child's service.
The row goes when the child's service has taken it (or answered that the child is
finished, or never existed); until then every replica sharing the store asks again
(``Cascade.run``), with backoff and without a deadline: a child whose service is
down for minutes is still stopped when it is back, and a parent process that dies
meanwhile loses nothing, since the next process finds the row. Interrupts are
idempotent, so two replicas asking at once do no harm.

A ``close`` command (a parent's close policy, ``agent._closing``) is written before
the parent's terminal write and delivered only once the parent's session is not
running or suspended: a parent killed between the two writes is resumed and may go
on, and its children must not be stopped by accident meanwhile. Once it has ended
(or is gone) the command is an interrupt like any other.

A child the service does not know is asked again for ``ClientConfig.rpc_timeout``
from when the command was written: parents record a child before they start it, so
its ``Start`` may still be on its way. Past that the child was never created.

Each call is made on behalf of the parent (``on_behalf_of``): a traced service gives
it a CLIENT span in the parent's trace, however far from any run of it the call is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import Protocol

from helix_transport._events import SessionStatus
from helix_transport._exceptions import HelixError, SessionNotFound
from helix_transport._trace_context import on_behalf_of
from helix_transport.store import ChildCommand, OutboxStore, SessionStore, SubSessionRef
from helix_transport.transport import ClientPool

logger = logging.getLogger(__name__)

CASCADE_TIMEOUT_S = 5.0
"""How long a caller waits for a cascade (``Cascade.deliver``) to ask each
running child once before it goes on (the outbox asks again until each is reached)."""
POLL_S = 1.0
"""How often a replica looks for commands left undelivered (by it, or by a process
that died)."""
MAX_BACKOFF_S = 1.0
"""The longest wait between two attempts at one command."""
_BATCH = 1000
"""Commands read per pass, oldest first: more than this many undeliverable ones (to services
gone for good) would keep newer ones from their retries (each still gets its first ask)."""
_CONCURRENCY = 16


class CascadeStore(OutboxStore, SessionStore, Protocol):
    """The roles a cascade uses: the outbox, and the parents' records (a ``close``
    waits for its parent's end; a call joins the parent's trace)."""


_GOING_ON = frozenset({SessionStatus.RUNNING, SessionStatus.SUSPENDED})


class Cascade:
    """The outbox of one store: records commands for children and delivers them."""

    def __init__(self, store: CascadeStore, clients: ClientPool) -> None:
        self._store = store
        self._clients = clients
        self._next_attempt: dict[tuple[str, str, str], float] = {}
        self._slots = asyncio.Semaphore(_CONCURRENCY)
        self._in_flight: set[tuple[str, str, str]] = set()

    async def interrupt_refs(
        self, refs: Sequence[SubSessionRef], *, reason: str, abort: bool = False
    ) -> None:
        """``record`` an interrupt (an abort, with ``abort``) for each running remote
        child among ``refs``, then ``deliver`` them."""
        await self.deliver(await self.record(refs, reason=reason, abort=abort))

    async def record(
        self, refs: Sequence[SubSessionRef], *, reason: str, abort: bool = False
    ) -> list[ChildCommand]:
        """Put an interrupt (an abort, with ``abort``) for each running remote child
        among ``refs`` in the outbox (durable once this returns; the store's error when
        it could not be)."""
        commands = [
            ChildCommand(
                parent_session_id=ref.parent_session_id,
                child_session_id=ref.child_session_id,
                address=ref.address,
                kind="abort" if abort else "interrupt",
                reason=reason or ("parent aborted" if abort else "parent interrupted"),
            )
            for ref in refs
            if not ref.status.is_terminal and ref.address  # running or suspended
        ]
        if commands:
            await self._store.put_commands(commands)
        return commands

    async def deliver(self, commands: Sequence[ChildCommand]) -> None:
        """Ask each child once, concurrently; what a child's service did not take stays
        in the outbox for ``run``."""
        if commands:
            await asyncio.gather(*(self._deliver(command) for command in commands))

    async def run(self) -> None:
        """Deliver what the outbox holds, until cancelled (one per server process)."""
        failing = False
        while True:
            try:
                commands = await self._store.list_commands(limit=_BATCH)
            except HelixError as exc:
                if not failing:  # once per outage, not once a second
                    logger.warning("outbox: cannot read pending commands: %s", exc.message)
                failing = True
                commands = []
            else:
                failing = False
            if len(commands) < _BATCH:  # the whole outbox: forget what another replica took
                listed = {_key(c) for c in commands}
                self._next_attempt = {k: t for k, t in self._next_attempt.items() if k in listed}
            now = time.monotonic()
            due = [c for c in commands if self._next_attempt.get(_key(c), 0.0) <= now]
            if due:
                await asyncio.gather(*(self._deliver(command) for command in due))
            await asyncio.sleep(POLL_S)

    async def _deliver(self, command: ChildCommand) -> None:
        """One attempt at ``command``: gone from the outbox once it has an answer."""
        key = _key(command)
        if key in self._in_flight:  # the first ask and the loop's may meet
            return
        self._in_flight.add(key)
        try:
            async with self._slots:
                await self._attempt(command)
        finally:
            self._in_flight.discard(key)

    async def _attempt(self, command: ChildCommand) -> None:
        try:
            if command.kind == "close":
                parent = await self._store.get_session(command.parent_session_id)
                if parent is not None and parent.status in _GOING_ON:
                    # Not ended (yet, or again: resumed after a crash before its end, or
                    # continued); the policy applies when it ends.
                    await self._retry_later(command, quiet=True)
                    return
            client = await self._clients.get(command.address)
            with on_behalf_of(partial(self._store.get_session, command.parent_session_id)):
                await client.interrupt(
                    command.child_session_id, reason=command.reason, abort=command.kind == "abort"
                )
        except SessionNotFound:
            patience = self._clients.config.rpc_timeout.total_seconds()
            if time.time() - command.created_at >= patience:
                await self._done(command)  # never created: its Start never landed
            else:
                await self._retry_later(command)
        except HelixError as exc:
            if exc.retryable:
                await self._retry_later(command)
                return
            logger.warning(
                "session %s: child %s at %s refused its interrupt: %s",
                command.parent_session_id,
                command.child_session_id,
                command.address,
                exc.message,
            )
            await self._done(command)
        else:
            await self._done(command)

    async def _done(self, command: ChildCommand) -> None:
        self._next_attempt.pop(_key(command), None)
        # Left there, it is asked again later: an interrupt repeats safely.
        with contextlib.suppress(HelixError):
            await self._store.delete_command(command)

    async def _retry_later(self, command: ChildCommand, *, quiet: bool = False) -> None:
        attempts = command.attempts + 1
        delay = min(MAX_BACKOFF_S, 0.25 * 2 ** min(attempts, 8))
        self._next_attempt[_key(command)] = time.monotonic() + delay
        if not quiet and (attempts in (1, 10) or attempts % 100 == 0):
            logger.warning(
                "session %s: child %s at %s not reached yet (attempt %d); still trying",
                command.parent_session_id,
                command.child_session_id,
                command.address,
                attempts,
            )
        with contextlib.suppress(HelixError):
            await self._store.record_attempt(command)


def _key(command: ChildCommand) -> tuple[str, str, str]:
    return (command.parent_session_id, command.child_session_id, command.kind)
