"""Every ``HELIX_*`` environment variable: one table, one reader.

``VARIABLES`` is the table (name, type, default, meaning) that ``docs/operating.md``
is held to. ``Environment`` is the only code that reads them: it turns the variables
into the frozen config dataclasses (``Limits``, ``ConnectionAge``...) or typed values,
and the rest of the library receives those. Precedence stays where it was: a flag
wins over a variable, a variable over the default; an empty variable is unset.

Each group is read when it is used, not all at start: a bad ``HELIX_PORT`` is an
error of ``serve`` alone, and the per-type model variables are read at every model
call (so a changed ConfigMap needs no restart of a test's process, and tests may set
them late). A family whose name ends in ``<TYPE>`` has one variable per agent type.

``warn_unknown()`` names, once at a service's start, each ``HELIX_*`` variable that
nothing reads (a typo stays silent otherwise), with the closest known name.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from helix_transport import _durations
from helix_transport._config import ConnectionAge, Limits
from helix_transport._exceptions import UsageError

__all__ = [
    "PER_TYPE",
    "VARIABLES",
    "Credentials",
    "Environment",
    "ModelSettings",
    "Variable",
    "address_variable",
    "declare",
    "markdown_table",
    "parse_duration",
    "type_suffix",
    "warn_unknown",
]

logger = logging.getLogger("helix.config")

PER_TYPE: Final = "<TYPE>"
"""The placeholder of a per-agent-type family (``HELIX_MODEL_<TYPE>``)."""


@dataclass(frozen=True, kw_only=True)
class Variable:
    """One ``HELIX_*`` variable, as ``docs/operating.md`` lists it."""

    name: str
    """The variable; a per-type family ends in ``_<TYPE>``."""
    type: str
    """How its value is read: ``text``, ``path``, ``int``, ``number``, ``seconds``,
    ``port``, ``flag`` (``1``/``true``/``yes``/``on``), ``duration`` (``7d``) or
    ``list`` (comma-separated)."""
    default: str
    """What applies when it is unset or empty (``-``: nothing)."""
    meaning: str
    """What it sets, in one line."""

    @property
    def family(self) -> str | None:
        """``HELIX_MODEL_`` for ``HELIX_MODEL_<TYPE>``; None for a single variable."""
        return self.name.removesuffix(PER_TYPE) if self.name.endswith(PER_TYPE) else None


def _v(name: str, type_: str, default: str, meaning: str) -> Variable:
    return Variable(name=name, type=type_, default=default, meaning=meaning)


VARIABLES: Final[tuple[Variable, ...]] = (
    # serve: listening and the store
    _v("HELIX_HOST", "text", "127.0.0.1", "interface to bind (`--host`)"),
    _v("HELIX_PORT", "port", "50051", "port to bind (`--port`)"),
    _v("HELIX_STORE_URL", "text", "sqlite:///.helix/<agent>.db", "the store (`--store`)"),
    _v("HELIX_ALLOW_VOLATILE_STORE", "flag", "off", "accept a Redis that keeps nothing on disk"),
    _v("HELIX_REPLICA_ID", "text", "hostname:port", "lease owner id (`--replica-id`)"),
    _v("HELIX_REFLECTION", "flag", "on", "gRPC server reflection (`off`: `--no-reflection`)"),
    _v("HELIX_HEALTH_PORT", "port", "-", "plaintext health-only port (`--health-port`)"),
    _v("HELIX_A2A_PORT", "port", "-", "also serve A2A on this port (`--a2a-port`)"),
    _v("HELIX_A2A_URL", "text", "-", "base URL the Agent Card names (`--a2a-url`)"),
    _v("HELIX_A2A_CARD_KEY", "path", "-", "private key signing the Agent Card (`--a2a-card-key`)"),
    _v("HELIX_METRICS_PORT", "port", "-", "Prometheus `/metrics` port (`--metrics-port`)"),
    _v("HELIX_RETENTION", "duration", "off", "remove sessions finished this long ago"),
    _v("HELIX_ADMIN_PRINCIPALS", "list", "-", "principals that may call the admin RPC"),
    _v("HELIX_LOG_LEVEL", "text", "INFO", "log level"),
    _v("HELIX_LOG_FORMAT", "text", "text", "`text` or `json` (`--log-format`)"),
    # serve: limits and connection age
    _v("HELIX_MAX_MESSAGE_BYTES", "int", "4194304", "largest gRPC message, in and out"),
    _v("HELIX_MAX_INPUT_BYTES", "int", "1048576", "largest `input_json`"),
    _v("HELIX_MAX_JSON_DEPTH", "int", "64", "deepest `input_json` nesting"),
    _v("HELIX_MAX_RUNNING_SESSIONS", "int", "1000", "sessions running at once per replica"),
    _v("HELIX_RATE_LIMIT", "number", "500", "`AgentService` calls/s per principal"),
    _v("HELIX_RATE_BURST", "int", "1000", "calls at once per principal"),
    _v("HELIX_MAX_CONNECTION_AGE_S", "seconds", "300", "GOAWAY a connection this old"),
    _v("HELIX_MAX_CONNECTION_AGE_GRACE_S", "seconds", "600", "calls in flight after GOAWAY"),
    # serve: authentication of callers
    _v("HELIX_AUTH_TOKENS_FILE", "path", "-", "token file (`--auth-tokens`)"),
    _v("HELIX_JWT_KEY_FILE", "path", "-", "JWT verification key (`--jwt-key`)"),
    _v("HELIX_JWT_AUDIENCE", "text", "-", "required JWT `aud` (`--jwt-audience`)"),
    _v("HELIX_JWT_ISSUER", "text", "-", "required JWT `iss` (`--jwt-issuer`)"),
    _v("HELIX_JWT_TENANT_CLAIM", "text", "tenant", "the JWT claim naming the tenant"),
    _v("HELIX_TLS_CERT_FILE", "path", "-", "server certificate (`--tls-cert`)"),
    _v("HELIX_TLS_KEY_FILE", "path", "-", "server private key (`--tls-key`)"),
    _v("HELIX_TLS_CLIENT_CA_FILE", "path", "-", "CA of client certificates: mutual TLS"),
    _v("HELIX_ALLOW_UNAUTHENTICATED", "flag", "off", "serve without authentication"),
    _v("HELIX_AUTH_RELOAD_INTERVAL_S", "seconds", "10", "check credential files this often"),
    # credentials toward children (serve) and toward a service (client commands)
    _v("HELIX_CLIENT_TOKEN_FILE", "path", "-", "a service's token for its children"),
    _v("HELIX_CLIENT_TLS_CA", "path", "-", "CA to verify a service by (enables TLS)"),
    _v("HELIX_CLIENT_TLS_CERT", "path", "-", "client certificate (mutual TLS)"),
    _v("HELIX_CLIENT_TLS_KEY", "path", "-", "client private key (mutual TLS)"),
    _v("HELIX_CLIENT_TLS_SERVER_NAME", "text", "-", "expected server name"),
    _v("HELIX_CLIENT_IDENTITY", "text", "substitute", "`substitute` or `forward` the caller's"),
    _v("HELIX_TOKEN", "text", "-", "a client command's bearer token (`--token`)"),
    _v("HELIX_TOKEN_FILE", "path", "-", "a client command's token file (`--token-file`)"),
    # models and children
    _v("HELIX_MODEL", "text", "-", "the litellm model of every agent type"),
    _v("HELIX_MODEL_<TYPE>", "text", "-", "the litellm model of one agent type"),
    _v("HELIX_LLM_NUM_RETRIES", "int", "-", "litellm's `num_retries`"),
    _v("HELIX_LLM_NUM_RETRIES_<TYPE>", "int", "-", "litellm's `num_retries`, one agent type"),
    _v("HELIX_LLM_TIMEOUT_S", "seconds", "-", "litellm's `timeout`"),
    _v("HELIX_LLM_TIMEOUT_S_<TYPE>", "seconds", "-", "litellm's `timeout`, one agent type"),
    _v("HELIX_LLM_FALLBACKS", "list", "-", "litellm's `fallbacks`"),
    _v("HELIX_LLM_FALLBACKS_<TYPE>", "list", "-", "litellm's `fallbacks`, one agent type"),
    _v("HELIX_AGENT_ADDRESS_<TYPE>", "text", "-", "the address of an agent type's service"),
    _v("HELIX_REGISTRY_FILE", "path", "-", 'JSON `{"type": "address"}` of services'),
    # the scripted model (tests, demos) and the benchmarks
    _v("HELIX_SCRIPTED_DELAY_MS", "number", "0", "scripted model: delay per streamed chunk"),
    _v("HELIX_SCRIPTED_CALL_LOG", "path", "-", "scripted model: log each call to this file"),
    _v("HELIX_BENCH_REDIS_URL", "text", "redis://127.0.0.1:6379/0", "bench: the Redis"),
    _v(
        "HELIX_BENCH_POSTGRES_DSN",
        "text",
        "postgresql://postgres@127.0.0.1/test",
        "bench: the PostgreSQL",
    ),
    _v("HELIX_BENCH_CONCURRENCY_STORE", "text", "-", "bench: concurrency on this store URL"),
)
"""Every variable the library reads."""

_BY_NAME: Final = {v.name: v for v in VARIABLES}
_FAMILIES: Final = tuple(f for v in VARIABLES if (f := v.family) is not None)
_TRUE: Final = ("1", "true", "yes", "on")
_OFF: Final = ("0", "off", "false", "no")
_declared: set[str] = set()


def declare(name: str) -> str:
    """Mark ``name`` as read by an agent of its own (``HELIX_MAILER_OUTBOX``), so the
    start of its service does not warn about it; returns ``name``."""
    _declared.add(name)
    return name


def type_suffix(agent_type: str) -> str:
    """``translator-node`` -> ``TRANSLATOR_NODE``: the ``<TYPE>`` of a model variable."""
    return re.sub(r"[^A-Z0-9]", "_", agent_type.upper())


def address_variable(agent_type: str) -> str:
    """``HELIX_AGENT_ADDRESS_RESEARCHER`` for ``researcher``."""
    return "HELIX_AGENT_ADDRESS_" + agent_type.upper().replace("-", "_")


def parse_duration(text: str) -> timedelta:
    """A duration above 0 in the one grammar (``_durations``): ``90s``, ``1h30m``, ``7d``.

    Raises:
        ValueError: a message saying what is wrong.
    """
    value = _durations.parse_duration(text)
    if value <= timedelta(0):
        raise ValueError(f"{text!r}: give a duration above 0")
    return value


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """The credential files a client presents (``ClientAuth.from_files`` arguments)."""

    token: str = ""
    """A bearer token itself (client commands: ``HELIX_TOKEN``)."""
    token_file: str = ""
    """A file holding the bearer token."""
    tls_ca_file: str = ""
    """CA to verify the server by; TLS when set."""
    tls_cert_file: str = ""
    """Client certificate (mutual TLS)."""
    tls_key_file: str = ""
    """Client private key (mutual TLS)."""
    tls_server_name: str = ""
    """The name the server's certificate must carry, when not the address's host."""
    identity: str = ""
    """``substitute`` or ``forward`` (a service toward its children); empty: unset."""


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """What the environment sets for one agent type's model (None: unset)."""

    model: str | None = None
    """``HELIX_MODEL_<TYPE>``, else ``HELIX_MODEL``."""
    num_retries: int | None = None
    """``HELIX_LLM_NUM_RETRIES_<TYPE>``, else ``HELIX_LLM_NUM_RETRIES``."""
    timeout_s: float | None = None
    """``HELIX_LLM_TIMEOUT_S_<TYPE>``, else ``HELIX_LLM_TIMEOUT_S``."""
    fallbacks: tuple[str, ...] | None = None
    """``HELIX_LLM_FALLBACKS_<TYPE>``, else ``HELIX_LLM_FALLBACKS`` (comma-separated)."""

    def changes(self) -> dict[str, Any]:
        """The ``ModelConfig`` fields set, for ``dataclasses.replace``."""
        return {k: v for k, v in vars(self).items() if v is not None}


_LIMITS_ENV: Final = {
    "max_message_bytes": ("HELIX_MAX_MESSAGE_BYTES", int),
    "max_input_bytes": ("HELIX_MAX_INPUT_BYTES", int),
    "max_json_depth": ("HELIX_MAX_JSON_DEPTH", int),
    "max_running_sessions": ("HELIX_MAX_RUNNING_SESSIONS", int),
    "rate_per_s": ("HELIX_RATE_LIMIT", float),
    "rate_burst": ("HELIX_RATE_BURST", int),
}
_CONNECTION_AGE_ENV: Final = {
    "max_age_s": "HELIX_MAX_CONNECTION_AGE_S",
    "grace_s": "HELIX_MAX_CONNECTION_AGE_GRACE_S",
}


@dataclass(frozen=True)
class Environment:
    """The process's ``HELIX_*`` variables (or ``environ``'s), read through the table.

    ``Environment()`` reads ``os.environ`` as it is when a method is called.
    """

    environ: Mapping[str, str] = field(default_factory=lambda: os.environ, repr=False)
    """Where the variables are read from."""

    def get(self, name: str) -> str:
        """The raw value of a variable of the table ("" when unset)."""
        known = name in _BY_NAME or any(name.startswith(f) for f in _FAMILIES)
        if not known:  # a name missing from the table is a bug here, not the user's
            raise KeyError(f"{name} is not in helix_transport.config.VARIABLES")
        return self.environ.get(name, "")

    # serve

    def host(self) -> str:
        """``HELIX_HOST``, else ``127.0.0.1``."""
        return self.get("HELIX_HOST") or "127.0.0.1"

    def port(self) -> str:
        """``HELIX_PORT``, else ``50051``: text, which ``serve``'s parser converts (a bad
        value is a usage error of ``serve`` alone)."""
        return self.get("HELIX_PORT") or "50051"

    def health_port(self) -> str | None:
        """``HELIX_HEALTH_PORT`` as text (converted as ``port()``); None when unset."""
        return self.get("HELIX_HEALTH_PORT") or None

    def a2a_port(self) -> str | None:
        """``HELIX_A2A_PORT`` as text (converted as ``port()``); None when unset."""
        return self.get("HELIX_A2A_PORT") or None

    def a2a_url(self) -> str | None:
        """``HELIX_A2A_URL``; None when unset."""
        return self.get("HELIX_A2A_URL") or None

    def a2a_card_key(self) -> str | None:
        """``HELIX_A2A_CARD_KEY``; None when unset."""
        return self.get("HELIX_A2A_CARD_KEY") or None

    def store_url(self, default: str) -> str:
        """``HELIX_STORE_URL``, else ``default``."""
        return self.get("HELIX_STORE_URL") or default

    def allow_volatile_store(self) -> bool:
        """``HELIX_ALLOW_VOLATILE_STORE`` is ``1``/``true``/``yes``/``on``."""
        return self.get("HELIX_ALLOW_VOLATILE_STORE").strip().lower() in _TRUE

    def replica_id(self) -> str:
        """``HELIX_REPLICA_ID`` ("": ``hostname:port``)."""
        return self.get("HELIX_REPLICA_ID")

    def reflection(self) -> bool:
        """False when ``HELIX_REFLECTION`` is ``0``/``off``/``false``/``no``."""
        return (self.get("HELIX_REFLECTION") or "on").lower() not in _OFF

    def metrics_port(self) -> int | None:
        """``HELIX_METRICS_PORT``; None (no metrics) when unset or empty.

        Raises:
            UsageError: not a number.
        """
        if raw := self.get("HELIX_METRICS_PORT").strip():
            try:
                return int(raw)
            except ValueError:
                raise UsageError(f"HELIX_METRICS_PORT={raw!r} is not a port number") from None
        return None

    def retention(self) -> timedelta | None:
        """``HELIX_RETENTION`` as a duration; None when unset, empty, ``0`` or ``off``.

        Raises:
            UsageError: it is set to something that is not a duration.
        """
        text = self.get("HELIX_RETENTION").strip()
        if text.lower() in ("", "0", "off"):
            return None
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise UsageError(f"HELIX_RETENTION: {exc}") from None

    def admins(self) -> tuple[str, ...]:
        """``HELIX_ADMIN_PRINCIPALS``, comma-separated."""
        return tuple(n.strip() for n in self.get("HELIX_ADMIN_PRINCIPALS").split(",") if n.strip())

    def log_format(self) -> str:
        """``HELIX_LOG_FORMAT`` ("": unset, text)."""
        return self.get("HELIX_LOG_FORMAT")

    def log_level(self) -> str:
        """``HELIX_LOG_LEVEL`` upper-cased, else ``INFO``."""
        return (self.environ.get("HELIX_LOG_LEVEL", "INFO")).upper()

    def limits(self, **overrides: Any) -> Limits:
        """``Limits``: defaults, then the variables, then ``overrides`` (flags; None is unset).

        Raises:
            UsageError: a variable that is not a number, or limits that do not hold.
        """
        values: dict[str, Any] = {}
        for name, (variable, kind) in _LIMITS_ENV.items():
            if raw := self.get(variable):
                try:
                    values[name] = kind(raw)
                except ValueError:
                    raise UsageError(f"{variable}={raw!r} is not a number") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return Limits(**values)

    def connection_age(self, **overrides: float | None) -> ConnectionAge:
        """``ConnectionAge``: defaults, then the variables, then ``overrides`` (flags).

        Raises:
            UsageError: a variable that is not a number of seconds.
        """
        values: dict[str, float] = {}
        for name, variable in _CONNECTION_AGE_ENV.items():
            if raw := self.get(variable):
                try:
                    values[name] = float(raw)
                except ValueError:
                    raise UsageError(f"{variable}={raw!r} is not a number of seconds") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return ConnectionAge(**values)

    def server_auth(self) -> dict[str, Any]:
        """The ``AuthConfig`` fields the variables set (keyword arguments).

        Raises:
            UsageError: ``HELIX_AUTH_RELOAD_INTERVAL_S`` is not a number.
        """
        values: dict[str, Any] = {
            "tokens_file": self.get("HELIX_AUTH_TOKENS_FILE"),
            "jwt_key_file": self.get("HELIX_JWT_KEY_FILE"),
            "jwt_audience": self.get("HELIX_JWT_AUDIENCE"),
            "jwt_issuer": self.get("HELIX_JWT_ISSUER"),
            "jwt_tenant_claim": self.get("HELIX_JWT_TENANT_CLAIM") or "tenant",
            "tls_cert_file": self.get("HELIX_TLS_CERT_FILE"),
            "tls_key_file": self.get("HELIX_TLS_KEY_FILE"),
            "tls_client_ca_file": self.get("HELIX_TLS_CLIENT_CA_FILE"),
            "allow_unauthenticated": self.get("HELIX_ALLOW_UNAUTHENTICATED").strip().lower()
            in _TRUE,
        }
        if interval := self.get("HELIX_AUTH_RELOAD_INTERVAL_S").strip():
            try:
                values["reload_interval_s"] = float(interval)
            except ValueError:
                raise UsageError(
                    f"HELIX_AUTH_RELOAD_INTERVAL_S must be a number of seconds, not {interval!r}"
                ) from None
        return values

    # credentials

    def service_credentials(self) -> Credentials:
        """What a service presents to its children (``HELIX_CLIENT_*``)."""
        return Credentials(
            token_file=self.get("HELIX_CLIENT_TOKEN_FILE"),
            tls_ca_file=self.get("HELIX_CLIENT_TLS_CA"),
            tls_cert_file=self.get("HELIX_CLIENT_TLS_CERT"),
            tls_key_file=self.get("HELIX_CLIENT_TLS_KEY"),
            tls_server_name=self.get("HELIX_CLIENT_TLS_SERVER_NAME"),
            identity=self.get("HELIX_CLIENT_IDENTITY"),
        )

    def client_credentials(self) -> Credentials:
        """What a client command presents (``HELIX_TOKEN``, ``HELIX_TOKEN_FILE``, and the
        TLS files of ``HELIX_CLIENT_TLS_*``)."""
        service = self.service_credentials()
        return Credentials(
            token=self.get("HELIX_TOKEN"),
            token_file=self.get("HELIX_TOKEN_FILE"),
            tls_ca_file=service.tls_ca_file,
            tls_cert_file=service.tls_cert_file,
            tls_key_file=service.tls_key_file,
            tls_server_name=service.tls_server_name,
        )

    # models and children (read at each use)

    def model(self, agent_type: str) -> ModelSettings:
        """What the variables set for ``agent_type``'s model: its own, else the
        process-wide one.

        Raises:
            UsageError: a variable that is not a number (retries, timeout), naming it.
        """
        suffix = type_suffix(agent_type)

        def lookup(name: str) -> tuple[str, str] | None:
            for variable in (f"{name}_{suffix}", name):
                if value := self.get(variable).strip():
                    return variable, value
            return None

        settings: dict[str, Any] = {}
        if found := lookup("HELIX_MODEL"):
            settings["model"] = found[1]
        if found := lookup("HELIX_LLM_NUM_RETRIES"):
            settings["num_retries"] = _number(*found, int)
        if found := lookup("HELIX_LLM_TIMEOUT_S"):
            settings["timeout_s"] = _number(*found, float)
        if found := lookup("HELIX_LLM_FALLBACKS"):
            settings["fallbacks"] = tuple(m.strip() for m in found[1].split(",") if m.strip())
        return ModelSettings(**settings)

    def agent_address(self, agent_type: str) -> str:
        """``HELIX_AGENT_ADDRESS_<TYPE>`` ("" when unset)."""
        return self.get(address_variable(agent_type)).strip()

    def registry_file(self) -> str:
        """``HELIX_REGISTRY_FILE`` ("" when unset)."""
        return self.get("HELIX_REGISTRY_FILE").strip()

    def scripted_delay_s(self) -> float:
        """``HELIX_SCRIPTED_DELAY_MS``, in seconds (0 when unset)."""
        return float(self.get("HELIX_SCRIPTED_DELAY_MS") or 0) / 1000

    def scripted_call_log(self) -> str:
        """``HELIX_SCRIPTED_CALL_LOG`` ("": no log)."""
        return self.get("HELIX_SCRIPTED_CALL_LOG")

    def bench_stores(self) -> tuple[str, str]:
        """The Redis URL and PostgreSQL DSN the benchmarks use."""
        return (
            self.get("HELIX_BENCH_REDIS_URL") or _BY_NAME["HELIX_BENCH_REDIS_URL"].default,
            self.get("HELIX_BENCH_POSTGRES_DSN") or _BY_NAME["HELIX_BENCH_POSTGRES_DSN"].default,
        )

    def bench_concurrency_store(self, default: str) -> str:
        """``HELIX_BENCH_CONCURRENCY_STORE``, else ``default``."""
        return self.get("HELIX_BENCH_CONCURRENCY_STORE") or default

    # unknown variables

    def unknown(self) -> list[tuple[str, str | None]]:
        """Each ``HELIX_*`` variable set that nothing reads, with the closest known name
        (None when none is close), sorted."""
        known = [*_BY_NAME, *_declared]
        found = []
        for name in sorted(self.environ):
            if not name.startswith("HELIX_") or name in _BY_NAME or name in _declared:
                continue
            if name.startswith("HELIX_TEST_") or any(name.startswith(f) for f in _FAMILIES):
                continue  # the test suite's own; one agent type's variable
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
            found.append((name, close[0] if close else None))
        return found


def markdown_table() -> str:
    """``VARIABLES`` as the Markdown table of ``docs/operating.md`` (a test compares)."""
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for v in VARIABLES:
        default = "—" if v.default == "-" else f"`{v.default}`"
        rows.append(f"| `{v.name}` | {v.type} | {default} | {v.meaning} |")
    return "\n".join(rows) + "\n"


def warn_unknown(environment: Environment | None = None) -> list[str]:
    """Log a warning for each unknown ``HELIX_*`` variable (``Environment.unknown``);
    returns the warnings. ``serve`` calls it once, at start."""
    warnings = []
    for name, close in (environment or Environment()).unknown():
        hint = f"; did you mean {close}?" if close else ""
        warnings.append(f"unknown environment variable {name}, ignored{hint}")
        logger.warning("%s", warnings[-1])
    return warnings


def _number(variable: str, value: str, kind: type[int] | type[float]) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise UsageError(f"{variable}={value!r} is not a number") from None
