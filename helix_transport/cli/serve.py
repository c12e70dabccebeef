"""``helix-mesh serve MODULE:ATTR`` and ``python -m services.NAME``: serve an agent.

The reference is imported from the working directory too (``load_agent``), so
``helix-mesh serve services.researcher:agent`` works from a checkout of the
repository, where ``services/`` is; the wheel does not install it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from helix_transport._exceptions import HelixError
from helix_transport.cli._connection_age import add_connection_age_options
from helix_transport.cli.flags import positive_seconds, seconds
from helix_transport.cli.gc import admin_option, retention_option
from helix_transport.config import Environment
from helix_transport.transport import SUBSTITUTE, ClientAuth

if TYPE_CHECKING:
    from helix_transport._config import ClientConfig, ServerConfig
    from helix_transport.metrics import MetricsEndpoint
    from helix_transport.server.auth import AuthConfig


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` to the subcommands ``sub`` (an ``add_subparsers`` result)."""
    serve = sub.add_parser("serve", help="serve an agent (MODULE:ATTR) as a gRPC service")
    serve.add_argument(
        "agent", help="the agent, as module:attribute (e.g. services.researcher:agent)"
    )
    serve_options(serve)


def run(args: argparse.Namespace) -> int:
    """Serve ``args.agent`` until SIGTERM or SIGINT."""
    # Imported here: the client commands never load the server (or litellm).
    from helix_transport.server.app import configure_logging, load_agent, serve

    configure_logging(args.log_format)
    agent = load_agent(args.agent)
    env = Environment()  # each setting: its flag, else its HELIX_* variable, else the default
    store_url = args.store or env.store_url(f"sqlite:///.helix/{agent.name}.db")
    config = _server_config(args, env)
    auth = _auth_config(args, env)
    auth.check()  # fail closed before importing or opening anything else
    own = env.service_credentials()
    client_auth = ClientAuth.from_files(
        token_file=args.client_token_file or own.token_file,
        tls_ca_file=own.tls_ca_file,
        tls_cert_file=own.tls_cert_file,
        tls_key_file=own.tls_key_file,
        tls_server_name=own.tls_server_name,
        identity=args.client_identity or own.identity or SUBSTITUTE,
    )
    metrics = _start_metrics(args, env, agent.name)
    try:
        asyncio.run(
            serve(agent, store_url=store_url, config=config, auth=auth, client_auth=client_auth)
        )
    finally:
        if metrics is not None:
            metrics.shutdown()
    return 0


def _start_metrics(
    args: argparse.Namespace, env: Environment, service_name: str
) -> MetricsEndpoint | None:
    """Serve ``/metrics`` when ``--metrics-port`` or ``HELIX_METRICS_PORT`` asks for it."""
    from helix_transport.metrics import MetricsConfig, start_metrics
    from helix_transport.server.app import announce

    port = env.metrics_port()  # read even under the flag: a bad variable is an error
    port = port if args.metrics_port is None else args.metrics_port
    if port is None:
        return None
    endpoint = start_metrics(MetricsConfig(host=args.host, port=port, service_name=service_name))
    announce(f"metrics on {endpoint.url}", metrics_url=endpoint.url)
    return endpoint


def _server_config(args: argparse.Namespace, env: Environment) -> ServerConfig:
    from helix_transport._config import ServerConfig

    retention = args.retention or env.retention()
    return ServerConfig(
        host=args.host,
        port=args.port,
        replica_id=args.replica_id or env.replica_id(),
        lease_ttl_s=args.lease_ttl,
        graceful_shutdown_timeout_s=args.drain_timeout,
        heartbeat_interval_s=args.heartbeat_interval,
        reflection=not args.no_reflection and env.reflection(),
        health_port=args.health_port,
        a2a_port=args.a2a_port,
        a2a_url=args.a2a_url,
        a2a_grpc_port=args.a2a_grpc_port,
        a2a_card_key=args.a2a_card_key,
        retention_s=None if retention is None else retention.total_seconds(),
        admins=tuple(args.admin_principal) if args.admin_principal else env.admins(),
        # Unset (None) leaves it to HELIX_ALLOW_VOLATILE_STORE.
        allow_volatile_store=True if args.allow_volatile_store else None,
        connection_age=env.connection_age(
            max_age_s=args.max_connection_age, grace_s=args.max_connection_age_grace
        ),
        client=_client_config(args.reconnect_deadline),
        limits=env.limits(
            max_message_bytes=args.max_message_bytes,
            max_input_bytes=args.max_input_bytes,
            max_json_depth=args.max_json_depth,
            max_running_sessions=args.max_running_sessions,
            max_delegation_depth=args.max_delegation_depth,
            rate_per_s=args.rate_limit,
            rate_burst=args.rate_burst,
        ),
    )


def _client_config(reconnect_deadline_s: float | None) -> ClientConfig:
    """The service's calls to other services: the default, or a shorter or longer
    reconnect deadline (tests of outages past it set it short)."""
    from helix_transport._config import ClientConfig, RetryConfig

    if reconnect_deadline_s is None:
        return ClientConfig.default
    deadline = timedelta(seconds=reconnect_deadline_s)
    return ClientConfig(reconnect=dataclasses.replace(RetryConfig.default, deadline=deadline))


def _auth_config(args: argparse.Namespace, env: Environment) -> AuthConfig:
    from helix_transport.server.auth import AuthConfig

    flags = {
        "tokens_file": args.auth_tokens,
        "jwt_key_file": args.jwt_key,
        "jwt_audience": args.jwt_audience,
        "jwt_issuer": args.jwt_issuer,
        "tls_cert_file": args.tls_cert,
        "tls_key_file": args.tls_key,
        "tls_client_ca_file": args.tls_client_ca,
        "allow_unauthenticated": args.allow_unauthenticated,
    }
    values = env.server_auth() | {k: v for k, v in flags.items() if v}  # a flag given wins
    if args.auth_reload_interval is not None:  # 0 (off) is a value here, unlike above
        values["reload_interval_s"] = args.auth_reload_interval
    return AuthConfig(**values)


def serve_options(parser: argparse.ArgumentParser) -> None:
    """Every option of ``serve`` but the agent: listening, store, auth and limits."""
    _listen_options(parser)
    _auth_options(parser)
    _limit_options(parser)
    add_connection_age_options(parser)


def _listen_options(parser: argparse.ArgumentParser) -> None:
    env = Environment()
    parser.add_argument("--host", default=env.host(), help="(default $HELIX_HOST)")
    # A string default: argparse converts it, so a bad HELIX_PORT is a usage error of
    # `serve` alone, not a traceback of every command.
    parser.add_argument(
        "--port",
        type=int,
        default=env.port(),
        help="(default $HELIX_PORT)",
    )
    parser.add_argument(
        "--store", default="", help="store URL (default $HELIX_STORE_URL or sqlite)"
    )
    parser.add_argument("--replica-id", default="", help="lease owner id (default hostname:port)")
    parser.add_argument(
        "--lease-ttl",
        type=positive_seconds,
        default=5.0,
        help="session lease seconds (default %(default)s)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=seconds,
        default=10.0,
        help="seconds to drain on SIGTERM (default %(default)s)",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=positive_seconds,
        default=5.0,
        help="seconds before a quiet stream beats (default %(default)s)",
    )
    parser.add_argument(
        "--reconnect-deadline",
        type=positive_seconds,
        default=None,
        metavar="DURATION",
        help="how long a call to another service retries while it is unreachable before "
        "it gives up (delegation itself waits on; default 30s)",
    )
    parser.add_argument(
        "--no-reflection",
        action="store_true",
        help="disable server reflection (HELIX_REFLECTION=off)",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        default=env.health_port(),  # converted as --port's
        help="plaintext health-only port, 0 to pick one (HELIX_HEALTH_PORT)",
    )
    _a2a_options(parser, env)
    retention_option(parser, what="remove sessions finished this long ago; unset: keep them")
    admin_option(parser)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,  # unset: HELIX_METRICS_PORT (run reads it: a bad one is serve's error)
        help="serve Prometheus /metrics on this port, 0 to pick one (HELIX_METRICS_PORT; "
        "default off)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="text, or one JSON object per line (default $HELIX_LOG_FORMAT, else text)",
    )
    parser.add_argument(
        "--allow-volatile-store",
        action="store_true",
        help="accept a Redis store that keeps nothing on disk, which a Redis restart "
        "empties (HELIX_ALLOW_VOLATILE_STORE=1; throwaway data only)",
    )


def _a2a_options(parser: argparse.ArgumentParser, env: Environment) -> None:
    """A2A (docs/a2a.md): the same agent, sessions and auth, for any A2A client."""
    parser.add_argument(
        "--a2a-port",
        type=int,
        default=env.a2a_port(),  # converted as --port's
        help="also serve A2A (JSON-RPC, HTTP+JSON) on this port, 0 to pick one (HELIX_A2A_PORT)",
    )
    parser.add_argument(
        "--a2a-grpc-port",
        type=int,
        default=None,
        help="also serve A2A's gRPC binding on this port, 0 to pick one (with --a2a-port)",
    )
    parser.add_argument(
        "--a2a-url",
        default=env.a2a_url(),
        help="base URL the Agent Card names, behind a proxy (HELIX_A2A_URL)",
    )
    parser.add_argument(
        "--a2a-card-key",
        default=env.a2a_card_key(),
        help="PEM private key (RSA, EC, Ed25519) that signs the Agent Card (HELIX_A2A_CARD_KEY)",
    )


def _auth_options(parser: argparse.ArgumentParser) -> None:
    auth = parser.add_argument_group("authentication (see docs/security.md)")
    auth.add_argument("--auth-tokens", default="", help="token file (HELIX_AUTH_TOKENS_FILE)")
    auth.add_argument(
        "--jwt-key", default="", help="JWT verification key file (HELIX_JWT_KEY_FILE)"
    )
    auth.add_argument("--jwt-audience", default="", help="required JWT aud (HELIX_JWT_AUDIENCE)")
    auth.add_argument("--jwt-issuer", default="", help="required JWT iss (HELIX_JWT_ISSUER)")
    auth.add_argument("--tls-cert", default="", help="server certificate (HELIX_TLS_CERT_FILE)")
    auth.add_argument("--tls-key", default="", help="server private key (HELIX_TLS_KEY_FILE)")
    auth.add_argument(
        "--tls-client-ca", default="", help="require client certificates from this CA (mTLS)"
    )
    auth.add_argument(
        "--auth-reload-interval",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="check the credential files for changes this often, 0 for never "
        "(HELIX_AUTH_RELOAD_INTERVAL_S, default 10)",
    )
    auth.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve without authentication (loopback demos and tests only)",
    )
    auth.add_argument(
        "--client-token-file", default="", help="this service's token for its children"
    )
    auth.add_argument(
        "--client-identity",
        choices=("substitute", "forward"),
        default=None,
        help="present this service's own identity to children, or forward the caller's",
    )


def _limit_options(parser: argparse.ArgumentParser) -> None:
    # Defaults live in Limits (imported only by `serve`: the client commands stay light).
    limits = parser.add_argument_group("limits (unset: $HELIX_* or the default; 0 turns one off)")
    for flag, kind, env, what in (
        ("--max-message-bytes", int, "HELIX_MAX_MESSAGE_BYTES", "largest gRPC message (4 MiB)"),
        ("--max-input-bytes", int, "HELIX_MAX_INPUT_BYTES", "largest input_json (1 MiB)"),
        ("--max-json-depth", int, "HELIX_MAX_JSON_DEPTH", "deepest input_json nesting (64)"),
        ("--max-running-sessions", int, "HELIX_MAX_RUNNING_SESSIONS", "per replica (1000)"),
        ("--rate-limit", float, "HELIX_RATE_LIMIT", "calls/s per principal (500)"),
        ("--rate-burst", int, "HELIX_RATE_BURST", "calls at once per principal (1000)"),
    ):
        limits.add_argument(flag, type=kind, help=f"{what}; ${env}")
    limits.add_argument(
        "--max-delegation-depth",
        type=int,
        help="levels a delegation tree may have, its root included (8)",
    )


def serve_main(reference: str, argv: Sequence[str] | None = None) -> None:
    """``python -m services.NAME [options]``: serve that package's agent."""
    parser = argparse.ArgumentParser(prog=f"python -m {reference.split(':')[0]}")
    serve_options(parser)
    args = parser.parse_args(argv)
    args.agent = reference
    args.command = "serve"
    try:
        raise SystemExit(run(args))
    except HelixError as exc:
        print(f"helix-mesh: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
