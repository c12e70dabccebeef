"""The conformance kit: the ``AgentService`` contract checked against any running service.

``helix-mesh conformance ADDRESS --input JSON [--bad-input JSON] [--input-required JSON]``
runs it from the command line; ``await run_conformance(address, input_json=...)`` from Python (this
package, ``helix_transport.testing.conformance``). The service may be written in any
language: the kit speaks only the wire, through the raw generated stub (never
``AgentClient``, whose reconnects and duplicate filtering would hide a server's
mistakes), and checks what ``proto/helix/agent/v1/agent.proto`` promises:

- ``Start`` generates an id when none is given, is idempotent (the same id with an
  equal JSON input is ``created=false`` and never runs twice), and answers a
  different input under an existing id with ``ALREADY_EXISTS``;
- the log is gapless from 1, begins with ``run_started`` and ends with exactly one
  terminal event, after which the stream ends; two readers at once, a reader that
  leaves mid-run and comes back from its last sequence, and replays from the start,
  the middle and the end all see the same events;
- ``GetStatus`` agrees with the log; ``Interrupt`` of a finished session changes
  nothing and says so, and of a running one is reported truthfully;
- ``NOT_FOUND`` for unknown sessions and ``INVALID_ARGUMENT`` (``field: problem``)
  for bad requests, with no session created by a rejected ``Start``.
- ``Describe`` lists the optional parts the service implements (``capabilities``); the
  checks of one it does not list are skipped, saying so. A service that lists none
  predates the list: ``Continue`` and ``ListSessions`` are then probed (``UNIMPLEMENTED``
  makes a skip), and the newer ``human_input`` and ``abort`` taken as absent. One listed
  but answered ``UNIMPLEMENTED`` fails.
- ``SubmitInput`` (``human_input``): an empty ``session_id``, ``request_id`` or answer is
  ``INVALID_ARGUMENT`` naming the field, an unknown session or request ``NOT_FOUND``.
  Given ``--input-required`` (an input that makes the agent ask for an approval of one
  tool call, its own or a sub-agent's), a session started with it logs
  ``input_required`` (a request id, kind approval, a path from the session to the one
  that asks) and ``suspended``, GetStatus says SUSPENDED at that sequence and its
  stream stays open (``timing.SUSPENDED_OPEN_S``); the approval is ``applied`` once, a
  repeat is ``applied=false``, a different answer ``FAILED_PRECONDITION``; the stream
  then shows ``input_answered`` (approved, with the reason) and the session ends.
- ``Interrupt`` with ``abort`` (``abort``): a session aborted right after its Start
  ends ``terminated`` with the request's reason (a skip when it ended first), a
  suspended one too (with ``--input-required``; an answer after it is
  ``FAILED_PRECONDITION``); neither is interrupted again nor continued with its memory.
- ``Continue`` (optional: ``UNIMPLEMENTED`` makes it a skip) starts a fresh second
  turn on the finished main session once, even when retried; the turn's stream
  begins with ``turn_started`` right after the old terminal event and ends at its
  own, and a replay from 0 still ends at the first turn's terminal event; another
  message for that turn is ``ALREADY_EXISTS``, a turn out of order
  ``FAILED_PRECONDITION``. It runs last, since it adds to the main session.
- ``ListSessions`` (optional: ``UNIMPLEMENTED`` makes it a skip) lists the main
  session once, newest first across pages of one, agreeing with ``GetStatus``; a
  status filter keeps or drops it; ``page_size=-1`` and a forged ``page_token`` are
  ``INVALID_ARGUMENT`` naming the field.
- ``GetStatus`` with ``wait`` (the optional long poll): of a finished session it
  answers at once (within ``timing.WAIT_PROMPT_S`` of a ``timing.WAIT_FINISHED_S``
  wait) with the log's end, whether the service implements ``wait`` or not. Of the
  main session while it runs, it answers the log's terminal status and sequence when the session ends,
  RUNNING once the wait has passed, or RUNNING at once (within half the wait: ``wait``
  not implemented); never a terminal reply the log disagrees with, RUNNING after the
  log's end reached a reader, or a reply later than the end or the wait by more than
  ``timing.END_GRACE_S`` (a skip when the session had ended before the kit could poll
  it).
  A wait below 0 or over 60 s is ``INVALID_ARGUMENT`` (``field: wait``); rejecting
  one but not the other fails. A service that ignores ``wait`` accepts both, so
  accepting both is a skip when the kit saw the service answer the running session
  at once, or could not tell (the session ended first; a slower run tells), and a
  failure when it saw the service hold that reply for half the wait or more (the
  line ``dispatch`` draws too): a service that implements ``wait`` must check it.

Those are the ``contract`` section. The ``a2a`` section (``--a2a URL``, or an
``http(s)://`` address; ``--section`` picks sections) runs the official ``a2a-sdk``
client against the service's A2A endpoint (``_a2a``, its plumbing ``_a2a_kit``): the card,
a stream whose ``metadata.helix.sequence`` is gapless from 1, a plain send (the same
``messageId`` twice is one task), ``GetTask``, resubscription (an ended task replayed
identically, one left mid-run, ``helix-from-sequence``), ``CancelTask``, ``TaskNotFound``
for an unknown task, ``InvalidParams`` naming the field, and, when the card's skill lists
``human_input`` and ``--input-required`` is given, ``input-required`` answered on the same
task.

The caller gives a valid input; an input the schema rejects is derived from
``Describe`` when not given. Each session the kit starts uses that input, so a
service whose runs are slow makes the kit slow, not wrong; a run slowed down (e.g.
``HELIX_SCRIPTED_DELAY_MS``) exercises the live tail more.

Its modules, one area each: ``runner`` (``run_conformance``, the order of the checks),
``report`` (``CheckResult``, ``format_results``), ``timing`` (the time limits, read when
a check runs, so tests can shorten them), and private ones for the plumbing (``_kit``),
what the contract fixes (``_contract``), derived inputs (``_inputs``) and the checks of
Describe and health, Start, Stream, the finished session, Interrupt, ListSessions,
Continue, bad requests, input from people and abort (``_describe``, ``_start``,
``_stream``, ``_finished``, ``_interrupt``, ``_listing``, ``_continue``, ``_errors``,
``_human_input``, ``_abort``).
"""

from __future__ import annotations

from helix_transport.testing.conformance.report import CheckResult, format_results
from helix_transport.testing.conformance.runner import run_conformance

__all__ = ["CheckResult", "format_results", "run_conformance"]
