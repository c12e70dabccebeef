"""The Redis store's one boundary for the driver's errors, and URLs fit for them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import redis.exceptions as redis_errors

from helix_transport._exceptions import StoreError, StoreUnavailable


@contextmanager
def map_redis_errors() -> Iterator[None]:
    """Translate ``redis`` exceptions into the helix error tree."""
    try:
        yield
    except (redis_errors.AuthenticationError, redis_errors.AuthorizationError) as exc:
        # Subclasses of ConnectionError, but retrying cannot fix a wrong password.
        raise StoreError(f"redis: {exc}") from exc
    except (
        redis_errors.ConnectionError,
        redis_errors.TimeoutError,
        # A primary demoted during failover refuses writes until clients move on.
        redis_errors.ReadOnlyError,
    ) as exc:
        raise StoreUnavailable(f"redis: {exc}") from exc
    except redis_errors.RedisError as exc:
        raise StoreError(f"redis: {exc}") from exc


def describe_url(url: str) -> str:
    """``url`` for error messages, its password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.partition(':')[0]}:***@{host}"))
