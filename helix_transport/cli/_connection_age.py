"""``serve``'s connection-age flags: how long a client connection may live (``ConnectionAge``)."""

from __future__ import annotations

import argparse

from helix_transport.cli.flags import seconds


def add_connection_age_options(parser: argparse.ArgumentParser) -> None:
    """``--max-connection-age`` and ``--max-connection-age-grace`` (unset: env, then default;
    ``config.Environment.connection_age`` lays them over)."""
    group = parser.add_argument_group(
        "connection balancing (unset: $HELIX_* or the default; see docs/deploying.md)"
    )
    group.add_argument(
        "--max-connection-age",
        type=seconds,
        metavar="SECONDS",
        help="send GOAWAY to a client connection this old, so clients re-resolve and "
        "reach new replicas; 0 for never ($HELIX_MAX_CONNECTION_AGE_S, default 300)",
    )
    group.add_argument(
        "--max-connection-age-grace",
        type=seconds,
        metavar="SECONDS",
        help="then let its calls in flight go on this long before closing it; a stream "
        "cut later resumes ($HELIX_MAX_CONNECTION_AGE_GRACE_S, default 600)",
    )
