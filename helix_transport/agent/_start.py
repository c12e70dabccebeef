"""Where a run begins: a new session's first step, a checkpoint to resume from, or
a continued session's new turn (``helix_transport.agent.turns``).

A run is a function of its checkpoint and its log, never of memory: each of these
rebuilds the run's state from the store, and tells the hooks where the run is.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from helix_transport._exceptions import HelixError
from helix_transport._metadata import INHERITED_CONTEXT_KEY
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent._steps import FINISH_INSTRUCTIONS, RunProgress, resumed_event
from helix_transport.agent.definition import Agent
from helix_transport.agent.hooks import NO_HOOKS, RunHooks
from helix_transport.agent.state import InputState, RunState, TurnState, split_state
from helix_transport.agent.turns import (
    StartedTurn,
    heal,
    read_turns,
    turn_started_at,
)
from helix_transport.log import SessionWriter
from helix_transport.store import Checkpoint, SessionRecord, Store

logger = logging.getLogger("helix.loop")


class RunStart:
    """Rebuilds the state one run of ``record``'s session starts from."""

    def __init__(
        self,
        agent: Agent,
        record: SessionRecord,
        *,
        store: Store,
        writer: SessionWriter,
        hooks: RunHooks,
    ) -> None:
        self.agent = agent
        self.record = record
        self.store = store
        self.writer = writer
        self.hooks = hooks
        self.session_id = record.session_id

    async def state(self, resume_reason: str) -> tuple[RunProgress, bool]:
        """The run's state, and whether it needs a checkpoint before its first step."""
        record = self.record
        if record.last_sequence == 0:  # a new run (no checkpoint without run_started)
            self.writer.emit(
                pb.StreamEvent(
                    run_started=pb.RunStarted(
                        input_json=record.input_json,
                        parent_session_id=record.parent_session_id,
                        # A sub-agent's inherited context is not the log's to repeat
                        # (its parent forwards this event into its own log).
                        metadata={
                            k: v for k, v in record.metadata.items() if k != INHERITED_CONTEXT_KEY
                        },
                    )
                ),
                # Written with the first step's step_started (or the run's end, if
                # an interrupt comes first): one write and one task, not two.
                defer=True,
            )
            # No checkpoint before step 1: it would hold only what the record's input
            # gives (see initial), so the first model call does not wait for a write.
            state = RunProgress(step=0, messages=self.initial().messages)
            self.hooks.on_run_start(resumed=False, step=1)
            return state, False
        # None saved: the run ended or died before its first step's checkpoint. Its
        # start is that checkpoint (a resumed run emits run_resumed, not run_started).
        checkpoint = await self.store.load_checkpoint(self.session_id) or self.initial()
        # A continued session: a turn committed after the checkpoint begins now.
        pending = await read_turns(
            self.store, self.session_id, from_sequence=checkpoint.last_sequence
        )
        if pending:
            return await self._begin_turn(checkpoint, pending[-1], resume_reason)
        self.writer.step = checkpoint.step + 1
        self.writer.emit(resumed_event(checkpoint.step + 1, resume_reason))
        self.hooks.on_run_start(resumed=True, step=checkpoint.step + 1)
        user, run = split_state(checkpoint.state)
        await self._resumed_turn(run)
        state = RunProgress(
            step=checkpoint.step,
            messages=list(checkpoint.messages),
            usage=checkpoint.usage,
            state=user,
            run=run,
            from_sequence=checkpoint.last_sequence,
        )
        return state, False

    def initial(self) -> Checkpoint:
        """The checkpoint a run has before its first step: its input, nothing done."""
        # The model sees the validated input, defaults filled in.
        model = self.agent.input_model.model_validate_json(self.record.input_json)
        messages = self._first_messages(model.model_dump_json())
        return Checkpoint(session_id=self.session_id, step=0, messages=messages)

    def _first_messages(self, user: str) -> list[dict[str, Any]]:
        system = "\n\n".join(p for p in (self.agent.system_prompt, FINISH_INSTRUCTIONS) if p)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    async def _begin_turn(
        self, checkpoint: Checkpoint, turn: StartedTurn, resume_reason: str
    ) -> tuple[RunProgress, bool]:
        """Start a continued session's new turn (see ``helix_transport.agent.turns``)."""
        # Steps go on numbering across turns; the budget counts from the turn's start.
        base = max(checkpoint.step, self.record.step_count)
        user, run = split_state(checkpoint.state)
        if turn.fresh:
            messages = self._first_messages(turn.message)
        else:
            messages = await heal(
                self.store,
                self.session_id,
                list(checkpoint.messages),
                from_sequence=checkpoint.last_sequence,
                until=turn.sequence,
                started=frozenset(run.inputs.started),
            )
            messages.append({"role": "user", "content": turn.message})
        turns = TurnState(
            turn=turn.turn,
            base_step=base,
            sequence=turn.sequence,  # so Continue need not read the log for it
            fresh=turn.fresh,
        )
        state = RunProgress(
            step=base,
            messages=messages,
            usage=checkpoint.usage,
            state=user,
            # What the last turn's cut-off step waited for (input, suspended children) is
            # over: its calls are answered above, or gone with a fresh turn.
            run=dataclasses.replace(run, turns=turns, inputs=InputState()),
        )
        self.writer.step = base + 1
        if resume_reason:  # the process that accepted the turn died before it began
            self.writer.emit(resumed_event(base + 1, resume_reason))
        self.hooks.on_run_start(resumed=bool(resume_reason), step=base + 1)
        self.hooks.on_turn_start(turn=turn.turn, message=turn.message, fresh=turn.fresh)
        return state, True

    async def _resumed_turn(self, run: RunState) -> None:
        """Tell the hooks which turn a resumed run is in, when it is not the first: one
        read of its ``turn_started``, and none without hooks (tracing off)."""
        at = run.turns.sequence
        if at is None or self.hooks is NO_HOOKS:
            return
        try:
            turn = await turn_started_at(self.store, self.session_id, at)
        except HelixError:  # only the trace would show it; the run's own reads will tell
            logger.warning("session %s: its turn's message is not traced", self.session_id)
            return
        if turn is not None:
            self.hooks.on_turn_start(turn=turn.turn, message=turn.message, fresh=turn.fresh)
