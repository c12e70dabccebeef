"""Secrets kept out of what a service writes: its log lines and what it stores.

A secret is the value of an environment variable named like a credential (``*KEY*``,
``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``...): a provider's error that echoes an API key
is redacted in the log line and in the session's stored ``error`` (which ``GetStatus``
returns to callers) alike.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

REDACTED = "[redacted]"

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_MIN_SECRET = 8  # shorter values ("1", "on") would redact ordinary words


def secrets_from_env(env: Mapping[str, str] | None = None) -> list[str]:
    """The values of the environment's credential-like variables, longest first."""
    env = os.environ if env is None else env
    found = {v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET}
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: list[str] | None = None) -> str:
    """``text`` with every secret replaced by ``[redacted]`` (``secrets`` default: the
    environment's, read now)."""
    for secret in secrets_from_env() if secrets is None else secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text
