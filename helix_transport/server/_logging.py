"""A service's log lines: text, or one JSON object per line (``--log-format``,
``HELIX_LOG_FORMAT``), with the session, agent type and trace they belong to.

The context is a contextvar, not an argument: the runner binds a run's
``session_id`` for the run's task (and the tasks it starts), the service its
``agent_type`` once; ``trace_id`` is the current OpenTelemetry span's, where tracing
made one current. A JSON line has ``time``, ``level``, ``logger``, ``message``, those
fields where known, those a call site gave with ``extra=`` (a failed session's
``status``, ``reason`` and ``error``), and ``exc_info`` (the whole traceback, in the one
line). What the process prints on stdout (``listening on``, ``health on``, ``metrics
on``) goes through ``announce``: a JSON line of the same shape under the JSON format.

Secrets stay out whatever a message holds: every value of an environment variable
named like a credential (``*KEY*``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``...) is
replaced by ``[redacted]`` in every line, text or JSON, tracebacks included
(``helix_transport._secrets``, which also redacts a failed session's stored error).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

from helix_transport._exceptions import UsageError
from helix_transport._secrets import redact, secrets_from_env

LOG_FORMAT_ENV: Final = "HELIX_LOG_FORMAT"
FORMATS: Final = ("text", "json")
_CONTEXT_FIELDS: Final = ("session_id", "agent_type", "trace_id")

_context: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "helix_log_context", default=None
)
_service: dict[str, str] = {}  # the process's own fields (one agent type per service)
_stdout_formatter: list[logging.Formatter] = []  # the JSON format's, once configured


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


# Attributes every LogRecord has: anything else on a record came from ``extra=`` and is a
# field of the JSON line (a failed session's ``status``, ``reason``, ``error``).
_RECORD_ATTRIBUTES: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime"}
)


def extra_fields(record: logging.LogRecord) -> dict[str, object]:
    """The fields a call site gave with ``extra=``."""
    return {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES}


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
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(context_fields())
        line.update(extra_fields(record))
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
    _stdout_formatter[:] = [formatter] if chosen == "json" else []
    root.setLevel(level)
    # litellm logs requests (message content included) at INFO and DEBUG.
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)


def announce(message: str, **fields: object) -> None:
    """Say ``message`` on stdout, where a script or a person waits for it (``listening
    on ...``): ``helix-mesh: message`` as text, one JSON line (``message`` and ``fields``)
    under the JSON format."""
    if not _stdout_formatter:
        print(f"helix-mesh: {message}", flush=True)
        return
    record = logging.LogRecord("helix.server", logging.INFO, __file__, 0, message, (), None)
    record.__dict__.update(fields)
    print(_stdout_formatter[0].format(record), flush=True)
