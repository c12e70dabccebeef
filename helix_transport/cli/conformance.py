"""``helix-mesh conformance``: check an agent service, in any language, against the contract."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from helix_transport.cli.exits import ExitCode
from helix_transport.cli.flags import client_auth, client_options, positive_seconds

SECTIONS = ("contract", "a2a")
"""The kit's sections (``runner.SECTIONS``; spelled here so the CLI starts without the kit)."""


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``conformance`` to the subcommands ``sub`` (an ``add_subparsers`` result)."""
    conformance = sub.add_parser(
        "conformance", help="check an agent service (any language) against the contract"
    )
    conformance.add_argument(
        "address", help="the service's gRPC host:port, or its A2A endpoint's http(s):// URL"
    )
    conformance.add_argument(
        "--input", required=True, help="a valid input for the agent, as JSON (- reads stdin)"
    )
    conformance.add_argument(
        "--bad-input", default=None, help="an input its schema rejects (default: from Describe)"
    )
    conformance.add_argument(
        "--input-required",
        default=None,
        help="an input that makes the agent ask for an approval of one tool call "
        "(checks suspension and SubmitInput; default: those checks skip)",
    )
    conformance.add_argument(
        "--timeout", type=positive_seconds, default=60.0, help="seconds for the run"
    )
    conformance.add_argument(
        "--json", action="store_true", help="print the checks as JSON (name, passed, ...)"
    )
    conformance.add_argument(
        "--a2a", default=None, metavar="URL", help="also check the service's A2A endpoint"
    )
    conformance.add_argument(
        "--section",
        action="append",
        choices=SECTIONS,
        default=None,
        help="run only this section (repeatable; default: contract, and a2a with --a2a "
        "or a URL address)",
    )
    client_options(conformance)


async def conformance(args: argparse.Namespace) -> int:
    """Run the kit against ``args.address``: 0 if every check passed, 1 if not, 2 on bad input."""
    from helix_transport.cli.client import read_input
    from helix_transport.cli.jsonout import dumps
    from helix_transport.testing.conformance import format_results, run_conformance

    input_json = await read_input(args.input)
    try:
        results = await run_conformance(
            args.address,
            input_json=input_json,
            bad_input_json=args.bad_input,
            input_required_json=args.input_required,
            timeout_s=args.timeout,
            auth=client_auth(args),
            a2a_url=args.a2a,
            sections=args.section,
        )
    except ValueError as exc:
        flag = "--input-required" if str(exc).startswith("input_required") else "--input"
        if "section" in str(exc):
            flag = "--section"
        print(f"helix-mesh: {flag}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    passed = all(r.passed for r in results)
    if args.json:
        checks = [dataclasses.asdict(result) for result in results]
        print(dumps({"address": args.address, "passed": passed, "checks": checks}))
    else:
        print(f"conformance of the agent service at {args.address}")
        print(format_results(results))
    return ExitCode.COMPLETED if passed else ExitCode.FAILED
