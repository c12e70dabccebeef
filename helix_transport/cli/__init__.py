"""The ``helix-mesh`` command (``main``), its event printer, and ``serve_main`` for
``python -m services.NAME``.

``main`` parses and dispatches; ``serve`` serves an agent; ``client`` holds ``call``,
``status``, ``interrupt`` and ``describe``; ``conformance`` runs the conformance kit;
``printer`` renders events for people; ``flags`` holds the flags commands share.
"""

from __future__ import annotations

from helix_transport.cli.main import _parser as _parser  # the deploy tests parse with it
from helix_transport.cli.main import main
from helix_transport.cli.printer import EventPrinter, status_name
from helix_transport.cli.serve import serve_main

__all__ = ["EventPrinter", "main", "serve_main", "status_name"]
