"""The session operations one ``AgentService`` serves, in domain terms.

Admission (draining, capacity and the count of starts on their way), Start's
create-and-run, a new turn (``_continue``), Interrupt's cascade through the outbox,
and the status of a session with its children's usage and the long-poll wait.
The servicer validates and converts; it hands over the store's key of the caller's
session (``_ownership.storage_id``, at its boundary) and the caller's ``session_id``,
which replies and errors name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator

from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    HelixError,
    ResourceExhausted,
    ServerUnavailable,
    SessionExists,
    SessionNotFound,
)
from helix_transport.agent.close_policy import ClosePolicy
from helix_transport.agent.definition import Agent
from helix_transport.delegation.cascade import CASCADE_TIMEOUT_S
from helix_transport.log import EventHub, follow
from helix_transport.metrics.instruments import instruments
from helix_transport.server._continue import ContinuedTurn, TurnRequest, continue_session
from helix_transport.server._expiry import not_found
from helix_transport.server._ownership import visible
from helix_transport.server._runner import SessionRunner
from helix_transport.server._shield import outlive_caller
from helix_transport.server.limits import Limits, check_capacity
from helix_transport.store import SessionRecord, Store, Usage
from helix_transport.transport import ClientPool
from helix_transport.tree import usage_from_proto

logger = logging.getLogger("helix.server")


class Sessions:
    """Starts, continues, interrupts and reports this agent's sessions."""

    def __init__(
        self,
        agent: Agent,
        store: Store,
        hub: EventHub,
        runner: SessionRunner,
        *,
        clients: ClientPool,
        poll_interval_s: float = 0.5,
        limits: Limits = Limits.default,
    ) -> None:
        self.agent = agent
        self.store = store
        self.hub = hub
        self.runner = runner
        self.clients = clients
        self.poll_interval_s = poll_interval_s
        self.limits = limits
        self.accepting = True
        """False once the server drains: no new session or turn starts."""
        self._starting = 0  # Starts between the capacity check and their run starting

    async def get(self, key: str, session_id: str) -> SessionRecord:
        """The caller's session ``session_id``, stored under ``key``.

        Another owner's session is under another key: not found, by the same lookup
        as an unknown id (see _ownership).
        """
        record = await self.store.get_session(key)
        # Another agent type's on a shared store: as if it did not exist, as for
        # Continue. A session is its own type's service's to serve, whether or not the
        # deployment happens to share a store between types.
        if record is None or record.agent_type != self.agent.name or not visible(record):
            raise await not_found(self.store, key, session_id)
        return record

    async def start(self, record: SessionRecord, session_id: str) -> tuple[SessionRecord, bool]:
        """Create and start ``record``'s session (the caller's ``session_id``), or get
        the existing one back.

        Refused while draining or at capacity, except as the replay of an existing
        session. Once the store has the session its run starts, even when the
        caller's deadline passes meanwhile: a created session never waits unrun.
        """
        refusal: Exception | None = None
        if not self.accepting:
            refusal = ServerUnavailable("server is shutting down; not starting new sessions")
        else:
            try:
                check_capacity(self.runner.running + self._starting, self.limits)
            except ResourceExhausted as exc:
                refusal = exc
        if refusal is not None:
            found = await self.store.get_session(record.session_id)
            if found is None:
                raise refusal
            existing, created = found, False
        else:
            self._starting += 1  # released by _create_and_run once its run is counted
            existing, created = await outlive_caller(
                self._create_and_run(record), what=f"starting session {session_id}"
            )
            if created:
                instruments().sessions_started.add(1, {"helix.agent_type": self.agent.name})
        # A pre-namespace session of another principal under a bare id (see _ownership).
        if (
            not visible(existing)
            or existing.input_hash != record.input_hash
            or existing.agent_type != self.agent.name
        ):
            raise SessionExists(session_id)
        return existing, created

    async def _create_and_run(self, record: SessionRecord) -> tuple[SessionRecord, bool]:
        try:
            # One atomic round trip: create (leased to us), or get the existing session back.
            return await self.runner.create_and_start(record)
        finally:
            self._starting -= 1  # in the same step the run joined runner.running

    async def continue_turn(self, request: TurnRequest) -> ContinuedTurn:
        """Start the turn ``request`` names, or answer the one already started."""
        return await continue_session(
            request, store=self.store, runner=self.runner, admit=self._admit_turn
        )

    @contextlib.contextmanager
    def _admit_turn(self) -> Iterator[None]:
        """A new turn is a run: refused while draining or at capacity, and counted as
        starting until its run is (as for ``start``). A replayed turn is not asked."""
        if not self.accepting:
            raise ServerUnavailable("server is shutting down; not starting new turns")
        check_capacity(self.runner.running + self._starting, self.limits)
        self._starting += 1
        try:
            yield
        finally:
            self._starting -= 1

    async def interrupt(
        self,
        key: str,
        session_id: str,
        reason: str,
        *,
        abort: bool = False,
        time_remaining: Callable[[], float | None],
    ) -> tuple[SessionRecord, bool]:
        """Stop the session and its children; the session as found, and whether the
        interrupt was accepted (not for a session already ended). With ``abort`` they
        end TERMINATED instead of INTERRUPTED.

        ``time_remaining()`` is what is left of the caller's deadline (None: none),
        read once the interrupts are durable: the children not asked by then are
        asked again by the outbox until they are.
        """
        record = await self.get(key, session_id)
        if record.status.is_terminal:
            return record, False
        # Durable first, the children's interrupts (in the outbox) before the session's
        # own (a run in another process sees it at its next step); then wake a local
        # run so it stops mid-step, then ask the children (each child's service
        # cascades to its own), so the whole tree stops.
        cascade = self.runner.cascade
        refs = await self.store.list_subsession_refs(key)
        if not abort:  # an abort ends the whole subtree; an interrupt spares ABANDON children
            agent = self.runner.agent
            refs = [
                r
                for r in refs
                if agent.close_policy_of(key, r.child_session_id, r.agent_type)
                is not ClosePolicy.ABANDON
            ]
        commands = await cascade.record(refs, reason=reason, abort=abort)
        await self.store.set_interrupt(key, reason, abort=abort)
        self.runner.signal_interrupt(key)
        # A suspended session has no run to see it: one starts here (unless another
        # process has the lease) and takes the interrupt at its first step boundary.
        # Read again now that the interrupt is durable: a run may have suspended since.
        current = await self.store.get_session(key)
        if current is not None and current.status is SessionStatus.SUSPENDED:
            await self.runner.wake(current, reason="interrupt")
        # Within the caller's deadline: every interrupt is already durable.
        remaining = time_remaining()
        budget = CASCADE_TIMEOUT_S if remaining is None else min(CASCADE_TIMEOUT_S, remaining)
        try:
            async with asyncio.timeout(max(budget - 0.05, 0.0)):
                await cascade.deliver(commands)
        except TimeoutError:
            logger.warning("session %s: still asking its children to stop", session_id)
        return record, True

    async def status(
        self, key: str, session_id: str, *, wait_s: float, include_children: bool
    ) -> tuple[SessionRecord, Usage | None]:
        """The session (once ended, if it ends within ``wait_s``), and with
        ``include_children`` the usage of its whole tree."""
        record = await self.get(key, session_id)
        if wait_s > 0 and not record.status.is_terminal:
            record = await self._until_end(record, session_id, wait_s)
        if not include_children:
            return record, None
        return record, await self._total_usage(record, seen={record.session_id})

    async def _total_usage(self, record: SessionRecord, *, seen: set[str]) -> Usage:
        """``record``'s usage plus every sub-session's below it, each counted once.

        A remote child reports its own subtree (``include_children`` on its service);
        a child in this store is summed here. An unreachable child service fails the
        call rather than report a short total. A child the caller may not see counts
        nothing, local or remote (there its service answers ``NOT_FOUND``, as it does
        for a child whose ``Start`` never landed): a total shows only what its caller
        could read session by session.
        """
        total = record.usage
        for ref in await self.store.list_subsession_refs(record.session_id):
            if ref.child_session_id in seen:
                continue
            seen.add(ref.child_session_id)
            if ref.address:
                total = total + await self._remote_usage(record, ref.child_session_id, ref.address)
            else:
                child = await self.store.get_session(ref.child_session_id)
                if child is not None and visible(child):
                    total = total + await self._total_usage(child, seen=seen)
        return total

    async def _remote_usage(self, record: SessionRecord, child_id: str, address: str) -> Usage:
        """The usage of the tree of ``record``'s child ``child_id`` at ``address``."""
        client = await self.clients.get(address)
        try:
            status = await client.get_status(child_id, include_children=True)
        except SessionNotFound:
            return Usage()  # its Start never landed (refused, or still on its way): no usage
        except HelixError as exc:
            # The child's service's trouble, not the caller's: retryable, and
            # without its address or its error's detail (that goes to the log).
            logger.warning(
                "session %s: usage of child %s at %s: %s",
                record.session_id,
                child_id,
                address,
                exc.message,
            )
            raise ServerUnavailable(
                f"could not read the usage of child session {child_id!r} "
                f"({type(exc).__name__}); retry later"
            ) from exc
        return usage_from_proto(status.total_usage)

    async def _until_end(
        self, record: SessionRecord, session_id: str, wait_s: float
    ) -> SessionRecord:
        """The session once its terminal event is in the log, or as it is after ``wait_s``.

        Follows the log as ``Stream`` does (this process's writer, else the store), so
        a caller waiting for a child's end makes one call, not one per poll.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                async for _ in follow(
                    self.store,
                    self.hub,
                    record.session_id,
                    from_sequence=record.last_sequence,
                    poll_interval_s=self.poll_interval_s,
                ):
                    pass  # follow ends after the terminal event
        return await self.get(record.session_id, session_id)
