"""Inputs the kit derives from the caller's: the same value respelled, a different one,
one the schema rejects."""

from __future__ import annotations

import json
from typing import Any


def respelled(input_json: str) -> str:
    """The same JSON value spelled differently: keys reversed, other whitespace."""

    def reverse(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: reverse(v) for k, v in reversed(list(value.items()))}
        if isinstance(value, list):
            return [reverse(v) for v in value]
        return value

    return json.dumps(reverse(json.loads(input_json)), indent=1, ensure_ascii=True)


def different(input_json: str) -> str | None:
    """A different input of the same shape (its first string changed), or None."""
    value = json.loads(input_json)

    def change(node: Any) -> tuple[Any, bool]:
        if isinstance(node, str):
            return node + " (conformance)", True
        if isinstance(node, dict):
            out = dict(node)
            for key, item in node.items():
                out[key], done = change(item)
                if done:
                    return out, True
            return node, False
        if isinstance(node, list):
            items = list(node)
            for index, item in enumerate(node):
                items[index], done = change(item)
                if done:
                    return items, True
            return node, False
        return node, False

    changed, done = change(value)
    return json.dumps(changed) if done else None


def rejected_input(schema: Any) -> tuple[str, str] | None:
    """An input any validator of ``schema`` rejects, and why; None when none is certain."""
    if not isinstance(schema, dict):
        return None
    required = schema.get("required")
    if isinstance(required, list) and required:
        return "{}", f"misses the required {required[0]!r}"
    if schema.get("type") == "object":
        return "[]", "is an array where the schema wants an object"
    return None
