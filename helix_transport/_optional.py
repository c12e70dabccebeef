"""Optional dependencies: the extras of the ``helix-mesh`` distribution, and the one error a
missing one raises where it is first needed.

The core (``pip install helix-mesh``) serves, calls and stores in SQLite. A backend, an
exporter or the inspector page imports its package inside ``requires(...)``; without it
the import fails as ``MissingExtra``, an ``ImportError`` whose message names the extra
to install, e.g. ``pip install 'helix-mesh[redis]'``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from helix_transport._exceptions import UsageError

EXTRAS: dict[str, tuple[str, ...]] = {
    "redis": ("redis",),
    "postgres": ("asyncpg",),
    "otlp": ("opentelemetry.exporter.otlp",),
    "langfuse": ("langfuse",),
    "inspect": ("starlette", "uvicorn"),
    "metrics": ("opentelemetry.exporter.prometheus", "prometheus_client"),
    "a2a": ("a2a", "uvicorn"),
}
"""Each extra, and the top-level modules (or packages) it installs that helix-mesh imports.
pyproject.toml's ``[project.optional-dependencies]`` installs them (a test keeps the two
in step)."""


class MissingExtra(UsageError, ImportError):
    """A feature's package is not installed: ``extra`` names what to install.

    An ``ImportError`` (what an import fails with) and a ``UsageError`` (the install,
    not the request, must change), so the CLI reports it as a usage error with the
    command to run.
    """

    def __init__(self, extra: str, feature: str, module: str) -> None:
        self.extra = extra
        self.feature = feature
        self.module = module
        UsageError.__init__(
            self,
            f"{feature} needs the helix-mesh[{extra}] extra ({module!r} is not "
            f"installed): pip install 'helix-mesh[{extra}]'",
        )
        self.name = module

    def _fields(self) -> dict[str, Any]:
        return {"extra": self.extra, "feature": self.feature, "module": self.module}


@contextmanager
def requires(extra: str, feature: str) -> Iterator[None]:
    """Imports inside this block belong to ``extra``: one of its modules missing raises
    ``MissingExtra`` naming it. Any other ``ImportError`` (a broken install of something
    else) propagates unchanged.

    Raises:
        MissingExtra: a module of ``extra`` is not installed.
    """
    modules = EXTRAS[extra]
    try:
        yield
    except ImportError as exc:
        missing = exc.name or ""
        found = [
            m
            for m in modules
            if missing == m or missing.startswith(m + ".") or m.startswith(missing + ".")
        ]
        if isinstance(exc, MissingExtra) or not found:
            raise
        raise MissingExtra(extra, feature, found[0]) from exc
