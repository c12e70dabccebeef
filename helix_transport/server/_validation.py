"""Checks on incoming requests; each failure names the field it is about."""

from __future__ import annotations

import re
import uuid

from pydantic import BaseModel, ValidationError

from helix_transport._exceptions import InvalidArgument

SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,511}$")
MAX_INPUT_BYTES = 1 << 20
MAX_METADATA_ENTRIES = 64
MAX_METADATA_KEY = 128
MAX_METADATA_VALUE = 4096
MAX_REASON = 4096


def session_id(value: str, *, field: str = "session_id", generate: bool = False) -> str:
    """A valid session id (a new one when empty and ``generate``)."""
    if not value:
        if generate:
            return uuid.uuid4().hex
        raise InvalidArgument(field, "must not be empty")
    if not SESSION_ID.match(value):
        raise InvalidArgument(
            field, "must be 1-512 characters from [A-Za-z0-9_.:-], starting with a letter or digit"
        )
    return value


def agent_input(model: type[BaseModel], input_json: str) -> BaseModel:
    """``input_json`` parsed and validated against the agent's input model."""
    if len(input_json.encode()) > MAX_INPUT_BYTES:
        raise InvalidArgument("input_json", f"larger than {MAX_INPUT_BYTES} bytes")
    try:
        return model.model_validate_json(input_json or "{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            raise InvalidArgument("input_json", f"not valid JSON ({first['msg']})") from None
        where = ".".join(str(p) for p in first["loc"])
        field = f"input_json.{where}" if where else "input_json"
        others = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise InvalidArgument(field, f"{first['msg']}{others}") from None
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument("input_json", f"cannot be parsed: {type(exc).__name__}") from None


def metadata(values: dict[str, str]) -> dict[str, str]:
    """The request metadata, within its limits."""
    if len(values) > MAX_METADATA_ENTRIES:
        raise InvalidArgument("metadata", f"more than {MAX_METADATA_ENTRIES} entries")
    for key, value in values.items():
        if not key or len(key) > MAX_METADATA_KEY:
            raise InvalidArgument("metadata", f"keys must be 1-{MAX_METADATA_KEY} characters")
        if len(value) > MAX_METADATA_VALUE:
            raise InvalidArgument(
                f"metadata[{key}]", f"longer than {MAX_METADATA_VALUE} characters"
            )
    return dict(values)


def from_sequence(value: int) -> int:
    """A replay position: 0 or a positive sequence."""
    if value < 0:
        raise InvalidArgument("from_sequence", "must not be negative")
    return value


def reason(value: str) -> str:
    """An interrupt reason of bounded length."""
    if len(value) > MAX_REASON:
        raise InvalidArgument("reason", f"longer than {MAX_REASON} characters")
    return value


def message(value: str) -> str:
    """A ``Continue`` message: not empty, at most ``MAX_INPUT_BYTES``."""
    if not value.strip():
        raise InvalidArgument("message", "must not be empty")
    if len(value.encode()) > MAX_INPUT_BYTES:
        raise InvalidArgument("message", f"larger than {MAX_INPUT_BYTES} bytes")
    return value
