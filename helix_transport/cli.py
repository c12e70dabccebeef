"""``helix-mesh``: serve an agent, call one, inspect and interrupt sessions.

helix-mesh serve services.researcher:agent --port 50061 [--store sqlite:///r.db]
helix-mesh call 127.0.0.1:50061 --input '{"topic": "gRPC"}'
helix-mesh status 127.0.0.1:50061 SESSION_ID
helix-mesh interrupt 127.0.0.1:50061 SESSION_ID --reason "user stop"
helix-mesh describe 127.0.0.1:50061
helix-mesh conformance 127.0.0.1:50061 --input '{"topic": "gRPC"}'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import TextIO

from google.protobuf import json_format

from helix_transport._config import ClientConfig
from helix_transport._exceptions import ConnectError, HelixError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.store import STORE_URL_ENV
from helix_transport.transport import AgentClient
from helix_transport.transport._auth import SUBSTITUTE, ClientAuth

_STATUS_NAMES = {v: k.removeprefix("SESSION_STATUS_").lower() for k, v in pb.SessionStatus.items()}


def status_name(value: pb.SessionStatus.ValueType) -> str:
    """``completed`` for ``SESSION_STATUS_COMPLETED``."""
    return _STATUS_NAMES.get(value, str(value))


_SLOW_S = 2.0  # when `call` says it is still waiting for the service
_MORE = "…"  # where a line of text was broken off, and where it goes on


class EventPrinter:
    """Renders events for people: one line each, children indented under their parent.

    Text deltas stream live on one open line. When several sessions stream at once
    (concurrent children), the others' text is buffered and printed as a whole line
    when that session's next event arrives, and another session's event ends the open
    line first (marked ``…``, its rest buffered likewise), so lines never interleave.
    A child is named by its agent type and what its id adds to its parent's
    (``[researcher call_1_0]``), so siblings of one type tell apart.
    """

    def __init__(self, out: TextIO = sys.stdout, *, color: bool | None = None) -> None:
        self.out = out
        self.color = out.isatty() if color is None else color
        self._open: tuple[str, str] | None = None  # the open text line: (session, prefix)
        self._buffered: dict[str, tuple[str, list[str]]] = {}  # session -> (prefix, text)

    def _c(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def print(self, event: pb.StreamEvent, depth: int = 0, *, parent: str = "") -> None:
        """Print one event (and, for a forwarded child event, the child's event nested)."""
        kind = event.WhichOneof("payload")
        if kind == "child_event":
            self.print(event.child_event.event, depth + 1, parent=event.session_id)
            return
        session = event.session_id
        who = _who(event, parent)
        if kind == "text_delta":
            prefix = "  " * depth + self._c("2", f"[{who}]") + " "
            self._text(session, prefix, event.text_delta.text)
            return
        self._flush_text(session)
        self._break_open_line()
        label = self._c("2", f"[{who} #{event.sequence}]")
        self.out.write(f"{'  ' * depth}{label} {self._describe(event, kind)}\n")
        self.out.flush()

    def _text(self, session: str, prefix: str, text: str) -> None:
        text = text.replace("\n", " ")
        if self._open is None and session not in self._buffered:
            self.out.write(prefix)
            self._open = (session, prefix)
        if self._open is not None and self._open[0] == session:
            self.out.write(text)
            self.out.flush()
        else:
            self._buffered.setdefault(session, (prefix, []))[1].append(text)

    def _break_open_line(self) -> None:
        """End another session's open line; the rest of its text is buffered."""
        if self._open is not None:
            session, prefix = self._open
            self.out.write(_MORE + "\n")
            self._open = None
            self._buffered[session] = (prefix, [_MORE])

    def _flush_text(self, session: str) -> None:
        if self._open is not None and self._open[0] == session:
            self.out.write("\n")
            self._open = None
        buffered = self._buffered.pop(session, None)
        if buffered is not None and buffered[1] != [_MORE]:  # a broken line that went on
            self._break_open_line()
            prefix, parts = buffered
            self.out.write(prefix + "".join(parts) + "\n")

    def _describe(self, event: pb.StreamEvent, kind: str | None) -> str:
        if kind == "run_started":
            return (
                self._c("1", "started")
                + f" {event.session_id} input={event.run_started.input_json}"
            )
        if kind == "step_started":
            return f"step {event.step}"
        if kind == "tool_start":
            t = event.tool_start
            return f"→ {t.tool_name}({_short(t.arguments_json)})"
        if kind == "tool_end":
            end = event.tool_end
            mark = self._c("31", "✗") if end.is_error else "←"
            return f"{mark} {end.tool_name}: {_short(end.result_json)}"
        if kind == "subagent_start":
            s = event.subagent_start
            return f"⇢ delegating to {s.child_agent_type} ({s.child_session_id})"
        if kind == "subagent_end":
            done = event.subagent_end
            return f"⇠ {done.child_agent_type} {status_name(done.status)}"
        if kind == "output":
            return f"output {event.output.output_json}"
        if kind == "completed":
            return self._c("32", "completed")
        if kind == "failed":
            f = event.failed
            return self._c("31", f"failed ({f.failure_reason}): {f.error}")
        if kind == "interrupted":
            return self._c("33", f"interrupted: {event.interrupted.reason or '-'}")
        if kind == "terminated":
            return self._c("33", f"terminated: {event.terminated.reason or '-'}")
        if kind == "run_resumed":
            r = event.run_resumed
            return self._c("36", f"resumed at step {r.step} ({r.reason})")
        if kind == "error":
            return self._c("31", f"error: {event.error.message}")
        if kind == "turn_started":
            turn = event.turn_started
            fresh = " (fresh)" if turn.fresh else ""
            return self._c("1", f"turn {turn.turn}{fresh}") + f" message={_short(turn.message)}"
        return f"({kind or 'unknown event'})"

    def close(self) -> None:
        """End the open line and print any buffered text."""
        if self._open is not None:
            self._flush_text(self._open[0])
        for session in list(self._buffered):
            self._flush_text(session)
        self.out.flush()


_SCOPE = re.compile(r"-[0-9a-f]{16}$")  # a child id's last part (agent.tools.child_scope)


def _who(event: pb.StreamEvent, parent: str) -> str:
    """``researcher``, or for a child ``researcher call_2_0``: what its id adds to its
    parent's (``{parent}-remote-call_2_0-{scope}``, ``{parent}-task-call_1_0-0-{scope}``),
    less the scope, which is the same for every child of one parent."""
    if not parent or not event.session_id.startswith(parent + "-"):
        return event.agent_type
    added = _SCOPE.sub("", event.session_id[len(parent) + 1 :])
    return f"{event.agent_type} {added.partition('-')[2] or added}"


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _proto_json(
    message: pb.GetStatusResponse | pb.DescribeResponse | pb.StreamEvent, *, indent: int | None = 2
) -> str:
    """JSON with the proto's own field names, as every command prints them."""
    return json_format.MessageToJson(message, preserving_proto_field_name=True, indent=indent)


def _client_auth(args: argparse.Namespace) -> ClientAuth | None:
    """The credentials of a client command: flags, else the environment."""
    env = os.environ
    return ClientAuth.from_files(
        token=args.token or env.get("HELIX_TOKEN", ""),
        token_file=args.token_file or env.get("HELIX_TOKEN_FILE", ""),
        tls_ca_file=args.tls_ca or env.get("HELIX_CLIENT_TLS_CA", ""),
        tls_cert_file=args.tls_cert or env.get("HELIX_CLIENT_TLS_CERT", ""),
        tls_key_file=args.tls_key or env.get("HELIX_CLIENT_TLS_KEY", ""),
        tls_server_name=args.tls_server_name or env.get("HELIX_CLIENT_TLS_SERVER_NAME", ""),
    )


async def _connect(args: argparse.Namespace, config: ClientConfig | None = None) -> AgentClient:
    return await AgentClient.connect(
        args.address, config=config or ClientConfig.default, auth=_client_auth(args)
    )


@contextlib.contextmanager
def _say_if_slow(message: str, *, after_s: float = _SLOW_S) -> Iterator[None]:
    """Print ``message`` on stderr if the block is still running after ``after_s``:
    the client retries an unreachable service for its whole reconnect deadline (30 s),
    which would otherwise look like a hang."""
    handle = asyncio.get_running_loop().call_later(
        after_s, lambda: print(f"helix-mesh: {message}", file=sys.stderr, flush=True)
    )
    try:
        yield
    finally:
        handle.cancel()


def _deadline_s(deadline: timedelta | None) -> float:
    return math.inf if deadline is None else deadline.total_seconds()


async def _call(args: argparse.Namespace) -> int:
    config = ClientConfig(rpc_timeout=timedelta(seconds=args.timeout))
    waiting = (
        f"{args.address} is not serving yet (not listening, starting or draining); "
        f"retrying for up to {_deadline_s(config.reconnect.deadline):g} s (Ctrl-C stops)"
    )
    async with await _connect(args, config) as client:
        session_id = args.session_id
        if args.follow:
            # Fails at once, as `status` does, where nothing listens or no such session
            # is: the stream would retry the first for 30 s, and its first event may
            # rightly be long in coming.
            await client.get_status(session_id)
        else:
            with _say_if_slow(waiting):
                started = await client.start(args.input, session_id=session_id)
            session_id = started.session_id
            if not started.created and args.session_id:  # a chosen id, not our own retry
                print(f"(session {session_id} already existed; streaming it)", file=sys.stderr)
        printer = EventPrinter()
        final: pb.StreamEvent | None = None
        async for event in client.stream(session_id, from_sequence=args.from_sequence):
            if args.json:
                print(_proto_json(event, indent=None), flush=True)
            else:
                printer.print(event)
            final = event
        printer.close()
        kind = final.WhichOneof("payload") if final is not None else None
        if kind == "completed" and not args.json:
            print(json.dumps(json.loads(final.completed.output_json), indent=2))  # type: ignore[union-attr]
        return 0 if kind in ("completed", None) else 1


async def _status(args: argparse.Namespace) -> int:
    wait = None if args.wait is None else timedelta(seconds=args.wait)
    async with await _connect(args) as client:
        print(_proto_json(await client.get_status(args.session_id, wait=wait)))
    return 0


async def _interrupt(args: argparse.Namespace) -> int:
    async with await _connect(args) as client:
        result = await client.interrupt(args.session_id, reason=args.reason)
    state = "interrupt recorded" if result.accepted else "already finished; nothing changed"
    print(f"{args.session_id}: {status_name(result.status)} ({state})")
    return 0


async def _describe(args: argparse.Namespace) -> int:
    async with await _connect(args) as client:
        print(_proto_json(await client.describe()))
    return 0


async def _conformance(args: argparse.Namespace) -> int:
    from helix_transport.testing.conformance import format_results, run_conformance

    try:
        results = await run_conformance(
            args.address,
            input_json=args.input,
            bad_input_json=args.bad_input,
            timeout_s=args.timeout,
            auth=_client_auth(args),
        )
    except ValueError as exc:
        print(f"helix-mesh: --input: {exc}", file=sys.stderr)
        return 2
    print(f"conformance of the agent service at {args.address}")
    print(format_results(results))
    return 0 if all(r.passed for r in results) else 1


def _serve(args: argparse.Namespace) -> int:
    from helix_transport.server.app import ServerConfig, configure_logging, load_agent, serve
    from helix_transport.server.auth import AuthConfig
    from helix_transport.server.limits import Limits

    configure_logging()
    agent = load_agent(args.agent)
    store_url = args.store or os.environ.get(STORE_URL_ENV) or f"sqlite:///.helix/{agent.name}.db"
    reflection = not args.no_reflection and os.environ.get(
        "HELIX_REFLECTION", "on"
    ).lower() not in (
        "0",
        "off",
        "false",
        "no",
    )
    config = ServerConfig(
        host=args.host,
        port=args.port,
        replica_id=args.replica_id or os.environ.get("HELIX_REPLICA_ID", ""),
        lease_ttl_s=args.lease_ttl,
        graceful_shutdown_timeout_s=args.drain_timeout,
        heartbeat_interval_s=args.heartbeat_interval,
        reflection=reflection,
        health_port=args.health_port,
        # Unset (None) leaves it to HELIX_ALLOW_VOLATILE_STORE.
        allow_volatile_store=True if args.allow_volatile_store else None,
        limits=Limits.from_env(
            max_message_bytes=args.max_message_bytes,
            max_input_bytes=args.max_input_bytes,
            max_json_depth=args.max_json_depth,
            max_running_sessions=args.max_running_sessions,
            max_delegation_depth=args.max_delegation_depth,
            rate_per_s=args.rate_limit,
            rate_burst=args.rate_burst,
        ),
    )
    auth = AuthConfig.from_env(
        tokens_file=args.auth_tokens,
        jwt_key_file=args.jwt_key,
        jwt_audience=args.jwt_audience,
        jwt_issuer=args.jwt_issuer,
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        tls_client_ca_file=args.tls_client_ca,
        allow_unauthenticated=args.allow_unauthenticated,
    )
    if args.auth_reload_interval is not None:  # 0 (off) is no override for from_env
        auth = dataclasses.replace(auth, reload_interval_s=args.auth_reload_interval)
    auth.check()  # fail closed before importing or opening anything else
    env = os.environ
    client_auth = ClientAuth.from_files(
        token_file=args.client_token_file or env.get("HELIX_CLIENT_TOKEN_FILE", ""),
        tls_ca_file=env.get("HELIX_CLIENT_TLS_CA", ""),
        tls_cert_file=env.get("HELIX_CLIENT_TLS_CERT", ""),
        tls_key_file=env.get("HELIX_CLIENT_TLS_KEY", ""),
        tls_server_name=env.get("HELIX_CLIENT_TLS_SERVER_NAME", ""),
        identity=args.client_identity or env.get("HELIX_CLIENT_IDENTITY", "") or SUBSTITUTE,
    )
    asyncio.run(
        serve(agent, store_url=store_url, config=config, auth=auth, client_auth=client_auth)
    )
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="helix-mesh", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve an agent (MODULE:ATTR) as a gRPC service")
    serve.add_argument(
        "agent", help="the agent, as module:attribute (e.g. services.researcher:agent)"
    )
    _serve_options(serve)

    call = sub.add_parser("call", help="start a session and stream its events")
    call.add_argument("address")
    call.add_argument("--input", default="{}", help="the input as JSON")
    call.add_argument("--session-id", default="", help="choose the session id (idempotent)")
    call.add_argument("--follow", action="store_true", help="only stream an existing session")
    call.add_argument("--from-sequence", type=int, default=0)
    call.add_argument("--json", action="store_true", help="print events as JSON lines")
    call.add_argument(
        "--timeout", type=_positive_seconds, default=10.0, help="seconds per unary call"
    )
    _client_options(call)

    status = sub.add_parser("status", help="show a session's status")
    status.add_argument("address")
    status.add_argument("session_id")
    status.add_argument(
        "--wait",
        type=_seconds,
        metavar="SECONDS",
        help="if the session is running, answer when it ends or after SECONDS (at most 60)",
    )
    _client_options(status)

    interrupt = sub.add_parser("interrupt", help="interrupt a running session")
    interrupt.add_argument("address")
    interrupt.add_argument("session_id")
    interrupt.add_argument("--reason", default="")
    _client_options(interrupt)

    describe = sub.add_parser("describe", help="show an agent's type and schemas")
    describe.add_argument("address")
    _client_options(describe)

    conformance = sub.add_parser(
        "conformance", help="check an agent service (any language) against the contract"
    )
    conformance.add_argument("address")
    conformance.add_argument("--input", required=True, help="a valid input for the agent, as JSON")
    conformance.add_argument(
        "--bad-input", default=None, help="an input its schema rejects (default: from Describe)"
    )
    conformance.add_argument(
        "--timeout", type=_positive_seconds, default=60.0, help="seconds for the run"
    )
    _client_options(conformance)

    # Listed for --help only: main() hands `bench ...` to helix_transport.bench whole.
    sub.add_parser("bench", help="run the benchmark suite (helix-mesh bench --help)")
    return parser


def _seconds(text: str) -> float:
    """A duration flag: a finite number of seconds, zero or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds, 0 or more")
    return value


def _positive_seconds(text: str) -> float:
    """A duration flag that cannot be zero (a timeout, a lease, an interval)."""
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value


def _client_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("credentials (see README, Security)")
    group.add_argument(
        "--token", default="", help="bearer token (prefer $HELIX_TOKEN: flags show in ps)"
    )
    group.add_argument("--token-file", default="", help="file holding the bearer token")
    group.add_argument("--tls-ca", default="", help="CA to verify the server by (enables TLS)")
    group.add_argument("--tls-cert", default="", help="client certificate (mutual TLS)")
    group.add_argument("--tls-key", default="", help="client private key (mutual TLS)")
    group.add_argument("--tls-server-name", default="", help="expected server name")


def _serve_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default=os.environ.get("HELIX_HOST", "127.0.0.1"), help="(default $HELIX_HOST)"
    )
    # A string default: argparse converts it, so a bad HELIX_PORT is a usage error of
    # `serve` alone, not a traceback of every command.
    parser.add_argument(
        "--port",
        type=int,
        default=os.environ.get("HELIX_PORT", "50051"),
        help="(default $HELIX_PORT)",
    )
    parser.add_argument(
        "--store", default="", help=f"store URL (default ${STORE_URL_ENV} or sqlite)"
    )
    parser.add_argument("--replica-id", default="", help="lease owner id (default hostname:port)")
    parser.add_argument(
        "--lease-ttl",
        type=_positive_seconds,
        default=5.0,
        help="session lease seconds (default %(default)s)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=_seconds,
        default=10.0,
        help="seconds to drain on SIGTERM (default %(default)s)",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=_positive_seconds,
        default=5.0,
        help="seconds before a quiet stream beats (default %(default)s)",
    )
    parser.add_argument(
        "--no-reflection",
        action="store_true",
        help="disable server reflection (HELIX_REFLECTION=off)",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        default=os.environ.get("HELIX_HEALTH_PORT") or None,  # converted as --port's
        help="plaintext health-only port, 0 to pick one (HELIX_HEALTH_PORT)",
    )
    parser.add_argument(
        "--allow-volatile-store",
        action="store_true",
        help="accept a Redis store that keeps nothing on disk, which a Redis restart "
        "empties (HELIX_ALLOW_VOLATILE_STORE=1; throwaway data only)",
    )
    auth = parser.add_argument_group("authentication (see README, Security)")
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
        type=_seconds,
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


_COMMANDS = {
    "call": _call,
    "status": _status,
    "interrupt": _interrupt,
    "describe": _describe,
    "conformance": _conformance,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``helix-mesh`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from helix_transport.bench import main as bench_main  # heavy: imported on demand

        return bench_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
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


def serve_main(reference: str, argv: Sequence[str] | None = None) -> None:
    """``python -m services.NAME [options]``: serve that package's agent."""
    parser = argparse.ArgumentParser(prog=f"python -m {reference.split(':')[0]}")
    _serve_options(parser)
    args = parser.parse_args(argv)
    args.agent = reference
    args.command = "serve"
    try:
        raise SystemExit(_serve(args))
    except HelixError as exc:
        print(f"helix-mesh: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    raise SystemExit(main())
