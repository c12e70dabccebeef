"""``run_conformance``: every check of the sections asked for, in the order the kit's
sessions allow. Sections: ``contract`` (the ``AgentService`` gRPC contract) and ``a2a``
(the service's A2A endpoint, through the official ``a2a-sdk`` client)."""

from __future__ import annotations

import json
from collections.abc import Collection

from helix_transport._optional import requires
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.testing.conformance._abort import check_abort_running, check_abort_suspended
from helix_transport.testing.conformance._continue import check_continue
from helix_transport.testing.conformance._contract import SESSION_CHECKS
from helix_transport.testing.conformance._describe import check_describe, check_health
from helix_transport.testing.conformance._errors import check_errors
from helix_transport.testing.conformance._finished import check_finished
from helix_transport.testing.conformance._human_input import (
    check_answered,
    check_input_errors,
    check_suspended,
)
from helix_transport.testing.conformance._interrupt import check_interrupt_running
from helix_transport.testing.conformance._kit import Kit
from helix_transport.testing.conformance._limits import check_limits
from helix_transport.testing.conformance._listing import check_listing
from helix_transport.testing.conformance._start import check_start
from helix_transport.testing.conformance._stream import check_streams, observe
from helix_transport.testing.conformance.report import CheckResult
from helix_transport.transport import ClientAuth, open_channel

CONTRACT = "contract"
A2A = "a2a"
SECTIONS = (CONTRACT, A2A)
"""The kit's sections, in the order they run."""


async def run_conformance(
    address: str,
    *,
    input_json: str,
    bad_input_json: str | None = None,
    input_required_json: str | None = None,
    timeout_s: float = 60,
    auth: ClientAuth | None = None,
    a2a_url: str | None = None,
    sections: Collection[str] | None = None,
) -> list[CheckResult]:
    """Run the checks of ``sections`` against the agent service at ``address``.

    Args:
        address: ``host:port`` (plaintext gRPC unless ``auth`` configures TLS); an
            ``http(s)://`` URL is an A2A endpoint (the ``a2a`` section alone by default).
        a2a_url: the service's A2A endpoint (its base URL), for the ``a2a`` section.
        sections: which to run (``SECTIONS``); by default ``contract`` for a gRPC
            address, and ``a2a`` too when ``a2a_url`` is given.
        input_json: a valid input for the agent; every session the kit starts uses it.
        bad_input_json: an input the agent's schema rejects; derived from ``Describe``
            when ``None`` (``{}`` when the schema has required fields).
        input_required_json: an input that makes the agent ask for an approval of one
            tool call (its own, or a sub-agent's); checks the suspension and the answer
            when given (capability ``human_input``), else they are skipped.
        timeout_s: how long the whole run may take; sessions still running then fail.
        auth: the credentials to present (a bearer token, TLS, a client certificate).

    Returns one ``CheckResult`` per check, in the order they ran. The kit leaves the
    sessions it started in the service (ids start with ``conformance-`` or are generated).

    Raises:
        ValueError: ``input_json`` or ``input_required_json`` is not JSON, or a section
            is unknown or lacks its address.
    """
    for name, value in (("input_json", input_json), ("input_required_json", input_required_json)):
        try:
            if value is not None:
                json.loads(value)
        except ValueError as exc:
            raise ValueError(f"{name} is not valid JSON: {exc}") from None
    if address.startswith(("http://", "https://")):
        address, a2a_url = "", a2a_url or address
    chosen = _sections(sections, grpc=bool(address), a2a=a2a_url is not None)
    results: list[CheckResult] = []
    if CONTRACT in chosen:
        results += await _contract(
            address, input_json, bad_input_json, input_required_json, timeout_s, auth
        )
    if A2A in chosen and a2a_url is not None:
        # The a2a section needs the a2a extra; the contract section runs without it.
        with requires("a2a", "the conformance kit's a2a section"):
            from helix_transport.testing.conformance._a2a import run_a2a
            from helix_transport.testing.conformance._a2a_kit import A2AKit

        kit = A2AKit(
            a2a_url,
            input_json=input_json,
            bad_input_json=bad_input_json,
            input_required_json=input_required_json,
            timeout_s=timeout_s,
            token=auth.token if auth is not None else "",
        )
        try:
            await run_a2a(kit)
        finally:
            await kit.aclose()
        results += kit.results
    return results


def _sections(asked: Collection[str] | None, *, grpc: bool, a2a: bool) -> list[str]:
    if asked is None:
        return [s for s, there in ((CONTRACT, grpc), (A2A, a2a)) if there]
    unknown = sorted(set(asked) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}: the kit has {list(SECTIONS)}")
    if CONTRACT in asked and not grpc:
        raise ValueError("the contract section needs the service's gRPC address")
    if A2A in asked and not a2a:
        raise ValueError("the a2a section needs the service's A2A URL")
    return [s for s in SECTIONS if s in asked]


async def _contract(
    address: str,
    input_json: str,
    bad_input_json: str | None,
    input_required_json: str | None,
    timeout_s: float,
    auth: ClientAuth | None,
) -> list[CheckResult]:
    async with open_channel(address, auth) as channel:
        kit = Kit(
            pb_grpc.AgentServiceStub(channel),
            channel,
            input_json=input_json,
            bad_input_json=bad_input_json,
            input_required_json=input_required_json,
            timeout_s=timeout_s,
        )
        return await _run(kit)


async def _run(kit: Kit) -> list[CheckResult]:
    await kit.check("health", lambda: check_health(kit))
    described = await kit.check("describe", lambda: check_describe(kit))
    if not described and kit.results[-1].detail.startswith("unexpected UNAVAILABLE"):
        return kit.results  # nothing listens there: every other check would say so
    sessions = await check_start(kit)
    if sessions is not None:
        main, other = sessions
        kit.main_session_id = main.session_id
        run = await observe(kit, main.session_id)
        if await check_streams(kit, run):
            await check_finished(kit, run)
        await kit.check("interrupt.running", lambda: check_interrupt_running(kit, other))
    else:
        kit.not_run(SESSION_CHECKS, "Start failed")
    await check_errors(kit)
    await kit.check("input.errors", lambda: check_input_errors(kit))
    await kit.check("input.suspended", lambda: check_suspended(kit))
    await kit.check("input.answered", lambda: check_answered(kit))
    await kit.check("abort.running", lambda: check_abort_running(kit))
    await kit.check("abort.suspended", lambda: check_abort_suspended(kit))
    await check_limits(kit)
    if sessions is not None:  # last: it adds a turn to the main session
        await kit.check("sessions.list", lambda: check_listing(kit))
        await kit.check("continue.new_turn", lambda: check_continue(kit))
    else:
        kit.not_run(("sessions.list", "continue.new_turn"), "Start failed")
    return kit.results
