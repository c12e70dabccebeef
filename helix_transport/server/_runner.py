"""Runs this process's sessions: leases, local interrupt signals, resume, drain."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import math
import time
from dataclasses import dataclass, replace

from helix_transport._events import SessionStatus
from helix_transport._exceptions import LeaseLost, SequenceConflict, StoreUnavailable
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent, HooksFactory
from helix_transport.agent.hooks import NO_HOOKS, RunHooks
from helix_transport.agent.interrupt_signal import InterruptSignal
from helix_transport.agent.loop import MAX_RESULT_BYTES, RunLoop
from helix_transport.delegation.cascade import CASCADE_TIMEOUT_S, Cascade
from helix_transport.log import EventHub, SessionWriter
from helix_transport.metrics.instruments import instruments
from helix_transport.server._logging import bind as bind_log_context
from helix_transport.server._ownership import caller_id
from helix_transport.server._wakeups import wake_reason
from helix_transport.store import (
    ChildCommand,
    InterruptLookup,
    SessionRecord,
    SessionUpdate,
    Store,
)
from helix_transport.transport import ClientPool

logger = logging.getLogger("helix.runner")

_LIMIT_CASCADE_WAIT_S = 1.0
"""How long a session whose limit passed waits for its children to be asked to stop."""
_LAPSE_MARGIN_S = 0.02
"""How long after a lease would lapse the orphan scan looks at it again."""


class _Outage:
    """Logs a housekeeping call that keeps failing once, not at every pass.

    The first failure is a warning with its traceback; while it goes on, a reminder
    at most every ``remind_s``; then one line when the call works again. A store
    outage would otherwise log a warning every poll interval from each loop.
    """

    def __init__(self, what: str, *, remind_s: float = 60.0) -> None:
        self.what = what
        self.remind_s = remind_s
        self._failures = 0
        self._since = 0.0
        self._reminded = 0.0

    def failed(self) -> None:
        now = time.monotonic()
        self._failures += 1
        if self._failures == 1:
            self._since = self._reminded = now
            logger.warning("%s failed (logged again only if it goes on)", self.what, exc_info=True)
        elif now - self._reminded >= self.remind_s:
            self._reminded = now
            logger.warning(
                "%s still failing: %d times in %.0f s",
                self.what,
                self._failures,
                now - self._since,
                exc_info=True,
            )

    def worked(self) -> None:
        if self._failures:
            failures = f"{self._failures} failure" + ("s" if self._failures > 1 else "")
            logger.warning(
                "%s works again, after %s in %.1f s",
                self.what,
                failures,
                time.monotonic() - self._since,
            )
            self._failures = 0


@dataclass
class _Run:
    task: asyncio.Task[None]
    interrupt: asyncio.Event


def _matches(exc: BaseException, kinds: tuple[type[Exception], ...]) -> bool:
    """True when ``exc`` is one of ``kinds``, also inside an ExceptionGroup (errors
    raised in a step's tool TaskGroup arrive wrapped in one)."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_matches(inner, kinds) for inner in exc.exceptions)
    return isinstance(exc, kinds)


class SessionRunner:
    """Owns the runs executing in this process.

    Each run holds a lease on its session in the store, renewed every third of
    its TTL; a process that dies stops renewing, so a restarted process (or
    another replica) can claim the session and resume it from its checkpoint.
    """

    def __init__(
        self,
        agent: Agent,
        store: Store,
        hub: EventHub,
        *,
        owner: str,
        lease_ttl_s: float,
        clients: ClientPool,
        hooks: HooksFactory | None = None,
        interrupt_poll_s: float = 0.5,
        max_result_bytes: int = MAX_RESULT_BYTES,
    ) -> None:
        self.agent = agent
        self.store = store
        self.hub = hub
        self.owner = owner
        self.lease_ttl_s = lease_ttl_s
        self.clients = clients
        self.hooks = hooks
        self.cascade = Cascade(store, clients)
        """Interrupts on their way to children (from ``Interrupt`` and failed runs)."""
        self._runs: dict[str, _Run] = {}
        self._starting: set[str] = set()
        """Sessions between ``start`` being called and their run being registered."""
        self._creating: collections.Counter[str] = collections.Counter()
        """Sessions ``create_and_start`` is creating: leased to us, not yet started."""
        self._renewer: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._closing = False
        """Set by ``shutdown``: no run starts here any more."""
        self._pending: set[asyncio.Task[None]] = set()
        """New turns waiting for another replica to release their session's lease."""
        self.max_result_bytes = max_result_bytes
        """The largest tool result or output a run logs (see ``RunLoop``)."""
        self.interrupt_poll_s = interrupt_poll_s
        """How often runs are checked for interrupts taken by another replica."""
        self._next_lapse = math.inf
        """The soonest a lease the last orphan scan saw held elsewhere would lapse."""

    @property
    def running(self) -> int:
        """Runs executing in this process now."""
        return len(self._runs)

    async def create_and_start(self, record: SessionRecord) -> tuple[SessionRecord, bool]:
        """Create ``record`` leased to this process and start its run, in one store round
        trip before the run; or return the existing session (untouched) and ``False``."""
        session_id = record.session_id
        # The orphan scan must not take a session created here, leased to us, for one
        # this process left behind before a restart.
        self._creating[session_id] += 1
        try:
            existing, created = await self.store.create_session(
                replace(record, owner=self.owner), lease_ttl_s=self.lease_ttl_s
            )
            if created:
                await self.start(existing, leased=True)
            return existing, created
        finally:
            self._creating[session_id] -= 1
            if not self._creating[session_id]:
                del self._creating[session_id]

    async def start(
        self, record: SessionRecord, *, resume_reason: str = "", leased: bool = False
    ) -> bool:
        """Run ``record`` here if its lease can be taken; False when another process owns it.

        ``leased``: the store created it leased to this process (``create_and_start``).
        """
        session_id = record.session_id
        # Claimed before the first await: a Start and the orphan scan (or a retried
        # Start) racing for one session must not both build a run of it here.
        if session_id in self._runs or session_id in self._starting:
            return True
        self._starting.add(session_id)
        try:
            return await self._start(record, resume_reason, leased)
        finally:
            self._starting.discard(session_id)

    async def _start(self, record: SessionRecord, resume_reason: str, leased: bool) -> bool:
        if not leased and not await self.store.acquire_lease(
            record.session_id, self.owner, ttl_s=self.lease_ttl_s
        ):
            return False
        if resume_reason:
            # A resume acts on the store's record now, not on the listing it came
            # from: that run may have finished (or moved on) in the meantime.
            fresh = await self.store.get_session(record.session_id)
            if fresh is None or fresh.status is not SessionStatus.RUNNING:
                await self.store.release_lease(record.session_id, self.owner)
                return False
            record = fresh
        if self._closing:
            # A Start or Continue that was in flight as the drain began: its session is
            # in the store, for another replica (or this one restarted) to run. Run
            # here, it would outlive the shutdown and race that run.
            with contextlib.suppress(Exception):
                await self.store.release_lease(record.session_id, self.owner)
            return False
        writer = SessionWriter(
            self.store,
            self.hub,
            session_id=record.session_id,
            agent_type=self.agent.name,
            last_sequence=record.last_sequence,
            event_session_id=caller_id(record.session_id),  # never the namespaced key
        )
        signal = InterruptSignal()  # set by an interrupt; each step races it
        loop = RunLoop(
            self.agent,
            record,
            store=self.store,
            writer=writer,
            interrupt_signal=signal,
            clients=self.clients,
            hooks=self._hooks_for(record),
            max_result_bytes=self.max_result_bytes,
            stop_children=lambda reason: self._interrupt_children(record.session_id, reason),
        )
        task = asyncio.create_task(self._run(loop, resume_reason), name=f"run:{record.session_id}")
        self._runs[record.session_id] = _Run(task=task, interrupt=signal)
        if self._renewer is None:
            # A fresh context: not the first caller's principal and token for ever.
            self._renewer = asyncio.create_task(
                self._renew_leases(), name="lease-renewer", context=contextvars.Context()
            )
        if self._watcher is None and isinstance(self.store, InterruptLookup):
            self._watcher = asyncio.create_task(
                self._watch_interrupts(self.store),
                name="interrupt-watch",
                context=contextvars.Context(),
            )
        return True

    async def continue_turn(self, record: SessionRecord) -> bool:
        """Run the new turn of a continued session (see ``start``).

        The previous turn's run may still be unwinding here after its terminal
        event; it is awaited first, so the new run is not mistaken for it.
        """
        previous = self._runs.get(record.session_id)
        if previous is not None:
            await asyncio.wait({previous.task})
        if await self.start(record):
            return True
        # The last turn's owner is another replica, still releasing its lease (it ended
        # that turn: the session was terminal when this one began), or dead (its lease
        # lapses within a TTL). Take the turn once the lease is free, not at the next
        # orphan scan, which would also log the turn as a resumed run.
        task = asyncio.create_task(self._start_when_free(record), name="continue-turn")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return False

    async def _start_when_free(self, record: SessionRecord) -> None:
        deadline = time.monotonic() + self.lease_ttl_s + _LAPSE_MARGIN_S
        delay = 0.01
        while time.monotonic() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
            try:
                fresh = await self.store.get_session(record.session_id)
                # Someone else took the turn up (or ended it): theirs to run.
                if fresh is None or (fresh.status, fresh.last_sequence) != (
                    SessionStatus.RUNNING,
                    record.last_sequence,
                ):
                    return
                if await self.start(fresh):
                    return
            except Exception:  # the orphan scan is still there
                logger.warning("session %s: new turn not started", record.session_id, exc_info=True)
                return

    def _hooks_for(self, record: SessionRecord) -> RunHooks:
        if self.hooks is None:
            return NO_HOOKS
        try:
            return self.hooks(self.agent, record)
        except Exception:  # tracing must never stop a run
            logger.warning("session %s: no run hooks", record.session_id, exc_info=True)
            return NO_HOOKS

    async def _run(self, loop: RunLoop, resume_reason: str) -> None:
        session_id = loop.session_id
        bind_log_context(session_id=session_id)  # this task's lines, and its tools'
        suspended = False
        try:
            status = await loop.run(resume_reason=resume_reason)
            suspended = status is SessionStatus.SUSPENDED
            logger.info(
                "session %s %s",
                session_id,
                "suspended" if suspended else f"ended {status}",
                extra={"status": status.value},
            )
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # a library's own BaseException is a crash too
            if _matches(exc, (SequenceConflict, LeaseLost)):
                logger.warning(
                    "session %s: stopped, another process owns it now (%s)", session_id, exc
                )
            elif _matches(exc, (StoreUnavailable,)):
                # Not the session's fault: leave it running and checkpointed; the orphan
                # watcher (here or on another replica) resumes it once the store is back.
                logger.warning("session %s: paused, the store is unavailable (%s)", session_id, exc)
            else:
                logger.exception("session %s: run loop crashed", session_id)
                await self._fail_internal(loop)
        finally:
            self._runs.pop(session_id, None)
            loop.writer.close()
            self.hub.forget(session_id)  # no local writer any more
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release_lease(session_id, self.owner))
        # After the release: a Continue does not wait for the children's services.
        if loop.endings.closing:
            await self._stop_children(session_id, loop.endings.closing)
        if suspended:
            await self._wake_if_due(session_id)

    async def wake(self, record: SessionRecord, *, reason: str) -> bool:
        """Run ``record``'s SUSPENDED session here, if its lease is free (``reason``: why,
        as its ``run_resumed`` says). True when it runs here now (or already did); False
        when another process holds it, or it is not suspended any more.

        The status turns RUNNING under the lease before the run starts: if this process
        dies next, the orphan scan resumes the session like any running one.
        """
        session_id = record.session_id
        if session_id in self._runs or session_id in self._starting:
            return True
        if self._closing:
            return False
        self._starting.add(session_id)
        try:
            if not await self.store.acquire_lease(session_id, self.owner, ttl_s=self.lease_ttl_s):
                return False
            running = await self.store.update_session(
                session_id,
                SessionUpdate(status=SessionStatus.RUNNING),
                expected_status=SessionStatus.SUSPENDED,
            )
            if running is None:
                await self.store.release_lease(session_id, self.owner)
                return False
            return await self._start(running, reason, leased=True)
        finally:
            self._starting.discard(session_id)

    async def _wake_if_due(self, session_id: str) -> None:
        """Look once more after suspending: an answer (or a child's progress) that came
        while the run was suspending found it still running, and woke nothing."""
        try:
            record = await self.store.get_session(session_id)
            reason = None if record is None else await wake_reason(self.store, self.clients, record)
            if record is not None and reason is not None:
                await self.wake(record, reason=reason)
        except Exception:  # the periodic scan looks again
            logger.warning("session %s: not woken after suspending", session_id, exc_info=True)

    async def wake_suspended(self) -> int:
        """Wake this agent's suspended sessions that have a reason to run (an answer, a
        deadline passed, a child that moved on); how many now run here."""
        woken = 0
        for record in await self.store.list_sessions(status=SessionStatus.SUSPENDED):
            if record.agent_type != self.agent.name or record.session_id in self._runs:
                continue
            reason = await wake_reason(self.store, self.clients, record)
            if reason is not None and await self.wake(record, reason=reason):
                woken += 1
        return woken

    async def _fail_internal(self, loop: RunLoop) -> None:
        """End the run failed (``internal``), its children closed by their policies; if
        that write does not go through, the session stays running, to be resumed."""
        try:
            await loop.endings.record_close(None, SessionStatus.FAILED)
            await loop.writer.finish(
                pb.StreamEvent(failed=pb.Failed(error="internal error", failure_reason="internal")),
                SessionUpdate(
                    status=SessionStatus.FAILED, error="internal error", failure_reason="internal"
                ),
            )
        except Exception:
            loop.endings.closing = []  # recorded in the outbox, if at all: delivered once it ends

    async def _stop_children(self, session_id: str, commands: list[ChildCommand]) -> None:
        """Deliver what the run's end recorded for its children (their close policies:
        interrupts, or aborts for an aborted run; ``agent._closing``).

        Only once that end is durable: the commands were written before it, and a run
        stopped any other way (a crash, a lost lease, a drain) is resumed later and
        rejoins its children. An ``Interrupt`` has cascaded already, but only to the
        children recorded when it did: the run, still going until it saw the interrupt,
        may have started more. The children it reached are asked again and answer that
        they have stopped: one more ``Interrupt`` each, after the run's end. What is not
        delivered here stays in the outbox, for ``Cascade.run``.
        """
        try:
            async with asyncio.timeout(CASCADE_TIMEOUT_S):
                await self.cascade.deliver(commands)
        except TimeoutError:
            pass  # the first asks were slow; they go on in the background
        except Exception:  # the outbox asks again
            logger.warning(
                "session %s: interrupting its children failed", session_id, exc_info=True
            )

    async def _interrupt_children(self, session_id: str, reason: str) -> None:
        """Interrupt the running session's running children now, through the outbox (a
        limit exceeded: the session goes on to its end). Waits a moment for the first
        asks; the outbox asks again until each child is reached."""
        try:
            children = await self.store.list_subsession_refs(session_id)
        except Exception:  # best effort: the session's end cascades again
            logger.warning("session %s: could not list its children", session_id, exc_info=True)
            return
        try:
            async with asyncio.timeout(_LIMIT_CASCADE_WAIT_S):
                await self.cascade.interrupt_refs(children, reason=reason)
        except TimeoutError:
            pass
        except Exception:  # best effort: the session's end cascades again
            logger.warning("session %s: stopping its children failed", session_id, exc_info=True)

    def signal_interrupt(self, session_id: str) -> None:
        """Wake a local run so it stops now rather than at its next step boundary."""
        run = self._runs.get(session_id)
        if run is not None:
            run.interrupt.set()

    async def resume_orphans(self) -> int:
        """Resume running sessions with no live owner (or owned by this replica id)."""
        resumed = 0
        next_lapse = math.inf
        for record in await self.store.list_sessions(status=SessionStatus.RUNNING):
            if record.session_id in self._runs or record.session_id in self._creating:
                continue
            # Services of several agent types may share one store: each resumes its own.
            if record.agent_type != self.agent.name:
                continue
            # Never leased and younger than a lease: its Start (on a replica of a version
            # that leased after creating) may be between the two. Older, its creator died.
            if not record.owner and time.time() - record.created_at < self.lease_ttl_s:
                next_lapse = min(next_lapse, record.created_at + self.lease_ttl_s)
                continue
            # Our own id: this replica restarted. Anyone else's: their lease lapsed.
            reason = "restart" if record.owner in ("", self.owner) else "takeover"
            if await self.start(record, resume_reason=reason):
                resumed += 1
                labels = {"helix.agent_type": self.agent.name, "helix.resume.reason": reason}
                instruments().sessions_resumed.add(1, labels)
            elif record.owner:  # held elsewhere (as read before the attempt)
                next_lapse = min(next_lapse, record.lease_expires_at)
        self._next_lapse = next_lapse
        return resumed

    async def watch_orphans(self) -> None:
        """Resume running sessions whose owner stopped renewing.

        Scans every lease TTL, and sooner when a lease held elsewhere would lapse
        before then: a dead replica's sessions are taken over just after their leases
        lapse, not up to a TTL later. A live owner renews a third of a TTL at a time,
        so its leases cost at most one scan per two-thirds of a TTL.
        """
        outage = _Outage("orphan scan")
        next_suspended_scan = 0.0
        while True:
            await asyncio.sleep(self._until_next_scan())
            try:
                await self.resume_orphans()
                # Suspended sessions once a TTL: deadlines, and wakes a dead process lost.
                if time.monotonic() >= next_suspended_scan:
                    next_suspended_scan = time.monotonic() + self.lease_ttl_s
                    await self.wake_suspended()
            except Exception:
                outage.failed()
            else:
                outage.worked()

    def _until_next_scan(self) -> float:
        ttl = self.lease_ttl_s
        until = self._next_lapse - time.time() + _LAPSE_MARGIN_S
        if until <= _LAPSE_MARGIN_S:
            # Held though lapsed by our clock: Redis and PostgreSQL judge leases by
            # their own, which may lag ours. A quarter TTL, not a busy loop. (Applied to
            # every lapse, this floor took a lease seen in its last quarter TTL over up
            # to 230 ms after it lapsed: issue 50's ~220 ms takeovers.)
            until = ttl / 4
        return min(ttl, until)

    async def _renew_leases(self) -> None:
        outage = _Outage("lease renewal")
        while True:
            await asyncio.sleep(self.lease_ttl_s / 3)
            # Every run's lease in one store call: renewing them one by one took a
            # round trip each, so with hundreds of runs a pass could outlast the TTL
            # and let live leases lapse (and queued every store write behind it).
            runs = dict(self._runs)
            if not runs:
                continue
            try:
                held = await self.store.renew_leases(list(runs), self.owner, ttl_s=self.lease_ttl_s)
            except Exception:
                outage.failed()
                continue
            outage.worked()
            for session_id, run in runs.items():
                if session_id not in held and self._runs.get(session_id) is run:
                    logger.warning("session %s: lease lost, stopping the local run", session_id)
                    run.task.cancel()

    async def _watch_interrupts(self, store: InterruptLookup) -> None:
        """Wake the runs whose session another replica was asked to interrupt.

        That replica stores the interrupt, which a run reads at its next step boundary;
        a step can be a long model call. One store call a poll interval for all runs.
        """
        outage = _Outage("looking for interrupts")
        while True:
            await asyncio.sleep(self.interrupt_poll_s)
            runs = {sid: run for sid, run in self._runs.items() if not run.interrupt.is_set()}
            if not runs:
                continue
            try:
                pending = await store.pending_interrupts(list(runs))
            except Exception:
                outage.failed()
                continue
            outage.worked()
            for session_id in pending & runs.keys():
                runs[session_id].interrupt.set()

    async def shutdown(self, *, grace_s: float) -> None:
        """Let runs finish for ``grace_s``, then cancel the rest (they stay resumable)."""
        self._closing = True
        for waiting in list(self._pending):  # their turns: for the orphan scan elsewhere
            waiting.cancel()
        tasks = [run.task for run in self._runs.values()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        for housekeeping in (self._renewer, self._watcher):
            if housekeeping is not None:
                housekeeping.cancel()
                await asyncio.wait({housekeeping})
        self._renewer = self._watcher = None
