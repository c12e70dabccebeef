"""``helix-mesh``: serve an agent, call one, inspect and interrupt sessions.

helix-mesh serve services.researcher:agent --port 50061 [--store sqlite:///r.db]
helix-mesh call 127.0.0.1:50061 --input '{"topic": "gRPC"}'
helix-mesh status 127.0.0.1:50061 SESSION_ID
helix-mesh interrupt 127.0.0.1:50061 SESSION_ID --reason "user stop"
helix-mesh describe 127.0.0.1:50061
helix-mesh sessions 127.0.0.1:50061 [--status running] [--since 1h] [--json]
helix-mesh conformance 127.0.0.1:50061 --input '{"topic": "gRPC"}'
helix-mesh gc sqlite:///.helix/researcher.db --retention 7d [--dry-run]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from helix_transport._exceptions import ConnectError, HelixError
from helix_transport.cli import client, conformance, gc, serve, sessions

_COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "call": client.call,
    "status": client.status,
    "interrupt": client.interrupt,
    "describe": client.describe,
    "conformance": conformance.conformance,
    "gc": gc.gc,
    "sessions": sessions.sessions,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="helix-mesh", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve.add_command(sub)
    client.add_commands(sub)
    conformance.add_command(sub)
    gc.add_command(sub)
    sessions.add_command(sub)
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
        print(f"helix-mesh: {exc}{_hint(exc, args)}", file=sys.stderr)
        return 2 if type(exc).__name__ == "UsageError" else 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`helix-mesh call ... | head`): not an error. Point stdout at
        # /dev/null so the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _hint(exc: HelixError, args: argparse.Namespace) -> str:
    """The likely cause of ``exc`` where its message cannot name it."""
    plaintext = not (getattr(args, "tls_ca", "") or os.environ.get("HELIX_CLIENT_TLS_CA"))
    if isinstance(exc, ConnectError) and exc.detail.endswith("Socket closed") and plaintext:
        # What a plaintext client sees of a TLS server: the server drops the connection.
        return (
            "\n  (the service closed a plaintext connection: if it serves TLS, give its CA "
            "with --tls-ca or HELIX_CLIENT_TLS_CA)"
        )
    return ""
