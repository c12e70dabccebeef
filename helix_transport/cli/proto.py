"""``helix-mesh proto --out DIR``: write the ``.proto`` contract the installed package
carries, for another language's build (``protoc -I DIR helix/agent/v1/agent.proto``).

The files are those the package's generated code was made from (shipped beside it), so
they always match the service that speaks them.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
from importlib.resources.abc import Traversable
from pathlib import Path

from helix_transport._exceptions import UsageError
from helix_transport.cli.exits import ExitCode


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``proto`` on the ``helix-mesh`` parser."""
    parser = sub.add_parser(
        "proto",
        help="write the .proto contract files (for another language's build)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="directory to write into (created if missing); the files keep their "
        "package paths, e.g. DIR/helix/agent/v1/agent.proto",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the written paths as a JSON list"
    )


def proto_files() -> dict[str, bytes]:
    """Every ``.proto`` the package ships, by its import path (``helix/agent/v1/agent.proto``)."""
    root = importlib.resources.files("helix_transport._proto")
    found: dict[str, bytes] = {}
    _collect(root, "", found)
    return dict(sorted(found.items()))


def _collect(node: Traversable, prefix: str, found: dict[str, bytes]) -> None:
    for child in node.iterdir():
        if child.is_dir() and child.name != "__pycache__":
            _collect(child, f"{prefix}{child.name}/", found)
        elif child.name.endswith(".proto"):
            found[prefix + child.name] = child.read_bytes()


async def write(args: argparse.Namespace) -> int:
    """Write every shipped ``.proto`` under ``args.out``; an existing file is replaced.

    Raises:
        UsageError: the package carries no ``.proto`` (a broken install), or ``--out``
            is not a directory that can be written.
    """
    files = proto_files()
    if not files:
        raise UsageError("this helix-mesh install carries no .proto files (reinstall it)")
    out = Path(args.out)
    written: list[str] = []
    try:
        for name, data in files.items():
            target = out / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            written.append(str(target))
    except OSError as exc:
        raise UsageError(f"cannot write the .proto files under {out}: {exc}") from None
    if args.json:
        print(json.dumps(written))
    else:
        for path in written:
            print(path)
    return ExitCode.COMPLETED
