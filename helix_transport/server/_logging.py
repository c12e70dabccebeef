"""A service's log lines: text, or one JSON object per line (``--log-format``,
``HELIX_LOG_FORMAT``), with the session, agent type and trace they belong to.

The context is a contextvar, not an argument: the runner binds a run's
``session_id`` for the run's task (and the tasks it starts), the service its
``agent_type`` once; ``trace_id`` is the current OpenTelemetry span's, where tracing
made one current. A JSON line has ``time``, ``level``, ``logger``, ``message``, those
fields where known, and ``exc_info`` (the whole traceback, in the one line).

Secrets stay out whatever a message holds: every value of an environment variable
named like a credential (``*KEY*``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``...) is
replaced by ``[redacted]`` in every line, text or JSON, tracebacks included.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

from helix_transport._exceptions import UsageError

LOG_FORMAT_ENV: Final = "HELIX_LOG_FORMAT"
FORMATS: Final = ("text", "json")
_CONTEXT_FIELDS: Final = ("session_id", "agent_type", "trace_id")

_context: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "helix_log_context", default=None
)
_service: dict[str, str] = {}  # the process's own fields (one agent type per service)


def bind(**fields: str) -> None:
    """Add ``fields`` to the log context of the current task (and tasks it starts)."""
    _context.set({**(_context.get() or {}), **fields})


def bind_service(*, agent_type: str) -> None:
    """The agent type this process serves, on every line."""
    _service["agent_type"] = agent_type


def context_fields() -> dict[str, str]:
    """The fields known here: the service's, the task's, the current trace's."""
    fields = {**_service, **(_context.get() or {})}
    if "opentelemetry.trace" in sys.modules:  # never import it only to find no span
        from opentelemetry import trace

        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            fields["trace_id"] = f"{span.trace_id:032x}"
    return fields


_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_MIN_SECRET = 8  # shorter values ("1", "on") would redact ordinary words


def secrets_from_env(env: Mapping[str, str] | None = None) -> list[str]:
    """The values of the environment's credential-like variables, longest first."""
    env = os.environ if env is None else env
    found = {v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET}
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "[redacted]")
    return text


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message [session_id=... trace_id=...]``."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = context_fields()
        fields.pop("agent_type", None)  # one per process: noise on every text line
        if fields:
            text += " [" + " ".join(f"{k}={fields[k]}" for k in sorted(fields)) + "]"
        return redact(text, self.secrets)


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module docstring)."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(context_fields())
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return redact(json.dumps(line, ensure_ascii=False, default=str), self.secrets)


def configure_logging(log_format: str, *, level: str = "INFO") -> None:
    """Log to stderr in ``log_format`` (``text`` or ``json``; "" is text) at ``level``.

    Raises:
        UsageError: an unknown format.
    """
    chosen = (log_format or "text").lower()
    if chosen not in FORMATS:
        raise UsageError(
            f"{LOG_FORMAT_ENV} (or --log-format) must be one of {', '.join(FORMATS)}, not {chosen!r}"
        )
    secrets = secrets_from_env()
    handler = logging.StreamHandler()
    formatter = JsonFormatter(secrets) if chosen == "json" else TextFormatter(secrets)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # litellm logs requests (message content included) at INFO and DEBUG.
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)
