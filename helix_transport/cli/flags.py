"""Flags more than one command shares: durations and a client's credentials."""

from __future__ import annotations

import argparse

from helix_transport.cli.durations import duration_arg, positive_duration_arg
from helix_transport.config import Environment
from helix_transport.transport import ClientAuth


def seconds(text: str) -> float:
    """A duration flag in seconds, zero or more: ``90``, ``90s``, ``1m30s``
    (``durations.parse_duration``, the one grammar)."""
    return duration_arg(text).total_seconds()


def positive_seconds(text: str) -> float:
    """A duration flag in seconds that cannot be zero (a timeout, a lease, an interval)."""
    return positive_duration_arg(text).total_seconds()


def client_options(parser: argparse.ArgumentParser) -> None:
    """The credentials a client command presents (``client_auth`` reads them)."""
    group = parser.add_argument_group("credentials (see docs/security.md)")
    group.add_argument(
        "--token", default="", help="bearer token (prefer $HELIX_TOKEN: flags show in ps)"
    )
    group.add_argument("--token-file", default="", help="file holding the bearer token")
    group.add_argument("--tls-ca", default="", help="CA to verify the server by (enables TLS)")
    group.add_argument("--tls-cert", default="", help="client certificate (mutual TLS)")
    group.add_argument("--tls-key", default="", help="client private key (mutual TLS)")
    group.add_argument("--tls-server-name", default="", help="expected server name")


def client_auth(args: argparse.Namespace) -> ClientAuth | None:
    """The credentials of a client command: flags, else the environment."""
    env = Environment().client_credentials()
    return ClientAuth.from_files(
        token=args.token or env.token,
        token_file=args.token_file or env.token_file,
        tls_ca_file=args.tls_ca or env.tls_ca_file,
        tls_cert_file=args.tls_cert or env.tls_cert_file,
        tls_key_file=args.tls_key or env.tls_key_file,
        tls_server_name=args.tls_server_name or env.tls_server_name,
    )
