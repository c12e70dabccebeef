"""``helix-mesh``: serve an agent, call one, inspect and interrupt sessions.

helix-mesh serve services.researcher:agent --port 50061 [--store sqlite:///r.db]
helix-mesh call 127.0.0.1:50061 --input '{"topic": "gRPC"}'
helix-mesh status 127.0.0.1:50061 SESSION_ID
helix-mesh interrupt 127.0.0.1:50061 SESSION_ID --reason "user stop" [--abort]
helix-mesh respond 127.0.0.1:50061 SESSION_ID REQUEST_ID --approve [--reason TEXT]
helix-mesh describe 127.0.0.1:50061
helix-mesh sessions 127.0.0.1:50061 [--status running] [--since 1h] [--json]
helix-mesh tree 127.0.0.1:50061 SESSION_ID --follow
helix-mesh inspect 127.0.0.1:50061
helix-mesh conformance 127.0.0.1:50061 --input '{"topic": "gRPC"}'
helix-mesh gc sqlite:///.helix/researcher.db --retention 7d [--dry-run]
helix-mesh proto --out protos/

Exit codes: ``ExitCode`` in exits.py (and docs/cli.md).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from helix_transport._exceptions import ConnectError, HelixError
from helix_transport.cli import (
    client,
    conformance,
    gc,
    inspect_command,
    proto,
    respond,
    serve,
    sessions,
    tree,
)
from helix_transport.cli.exits import ExitCode, for_error
from helix_transport.config import Environment

_COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "call": client.call,
    "status": client.status,
    "interrupt": client.interrupt,
    "respond": respond.respond,
    "describe": client.describe,
    "tree": tree.tree,
    "inspect": inspect_command.inspect,
    "conformance": conformance.conformance,
    "gc": gc.gc,
    "sessions": sessions.sessions,
    "proto": proto.write,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="helix-mesh",
        description=__doc__.split("\n\n")[0],
        epilog="exit codes: " + ", ".join(f"{c.value} {c.name.lower()}" for c in ExitCode),
    )
    parser.add_argument("--version", action="version", version=f"helix-mesh {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve.add_command(sub)
    client.add_commands(sub)
    respond.add_command(sub)
    tree.add_command(sub)
    inspect_command.add_command(sub)
    conformance.add_command(sub)
    gc.add_command(sub)
    sessions.add_command(sub)
    proto.add_command(sub)
    # Listed for --help only: main() hands `bench ...` to helix_transport.bench whole.
    sub.add_parser("bench", help="run the benchmark suite (helix-mesh bench --help)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``helix-mesh`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from helix_transport.bench import main as bench_main  # heavy: imported on demand

        return bench_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return serve.run(args)
        return asyncio.run(_COMMANDS[args.command](args))
    except HelixError as exc:
        code = for_error(exc)
        _fatal(f"{exc}{_hint(exc, args)}", args, code)
        return code
    except KeyboardInterrupt:
        return ExitCode.CTRL_C
    except BrokenPipeError:
        # The reader left (`helix-mesh call ... | head`): not an error. Point stdout at
        # /dev/null so the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.BROKEN_PIPE


def _fatal(message: str, args: argparse.Namespace, code: int) -> None:
    """Why the command ends, on stderr: ``helix-mesh: message``, or for a ``serve``
    logging JSON (``--log-format``, else ``$HELIX_LOG_FORMAT``) one JSON line like its
    others, with the exit code, so a collector that parses every line loses none."""
    if args.command == "serve":
        chosen = (args.log_format or Environment().log_format()).lower()
        if chosen == "json":
            from helix_transport.server.app import configure_logging

            configure_logging("json")  # again: the error may have come before it
            logging.getLogger("helix.cli").error(message, extra={"exit_code": int(code)})
            return
    print(f"helix-mesh: {message}", file=sys.stderr)


def _version() -> str:
    """The installed distribution's version (``unknown`` when run from a bare checkout)."""
    try:
        return importlib.metadata.version("helix-mesh")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _hint(exc: HelixError, args: argparse.Namespace) -> str:
    """The likely cause of ``exc`` where its message cannot name it."""
    plaintext = not (getattr(args, "tls_ca", "") or Environment().client_credentials().tls_ca_file)
    if isinstance(exc, ConnectError) and exc.detail.endswith("Socket closed") and plaintext:
        # What a plaintext client sees of a TLS server: the server drops the connection.
        return (
            "\n  (the service closed a plaintext connection: if it serves TLS, give its CA "
            "with --tls-ca or HELIX_CLIENT_TLS_CA)"
        )
    return ""
