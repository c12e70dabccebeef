"""``helix-mesh inspect ADDRESS``: a local web page of a service's sessions and their
live delegation trees (``helix_transport.cli.inspector``).

The page's web stack (starlette, uvicorn) is imported only when this command runs:
the other commands never load it.
"""

from __future__ import annotations

import argparse

from helix_transport.cli.flags import client_auth, client_options

DEFAULT_PORT = 8470
"""Where the page is served on 127.0.0.1 unless ``--port`` says otherwise."""


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: give a port from 0 (any free one) to 65535")
    return port


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``inspect`` to the subcommands ``sub`` (an ``add_subparsers`` result)."""
    inspect_ = sub.add_parser(
        "inspect",
        help="serve a local web page of the service's sessions and live delegation trees",
    )
    inspect_.add_argument("address")
    inspect_.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"the page's port on 127.0.0.1 (default {DEFAULT_PORT}; 0: any free port)",
    )
    inspect_.add_argument("--session", default="", help="open this session's tree first")
    client_options(inspect_)


async def inspect(args: argparse.Namespace) -> int:
    """Serve the page until Ctrl-C or SIGTERM."""
    from helix_transport.cli.inspector import serve_inspector  # the web stack, on demand

    await serve_inspector(
        args.address, port=args.port, auth=client_auth(args), session_id=args.session
    )
    return 0
