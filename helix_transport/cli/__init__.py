"""The ``helix-mesh`` command (``main``), its event printer, and ``serve_main`` for
``python -m services.NAME``.

``main`` parses and dispatches; ``serve`` serves an agent; ``client`` holds ``call``,
``status``, ``interrupt`` and ``describe``; ``respond`` answers a request for input
(``answer`` shows, asks and locates them, for it and for ``call``); ``tree`` draws a delegation tree (``treeview``
its lines); ``inspect_command`` serves the ``inspector`` page; ``conformance`` runs the
conformance kit. Shared: ``printer`` renders events for people, ``views`` statuses and
descriptions, ``jsonout`` messages as ``--json`` prints them, ``follow`` reads a session
across its turns, ``exits`` holds the exit codes and ``flags`` the flags commands share.
"""

from __future__ import annotations

from helix_transport.cli.main import _parser as _parser  # the deploy tests parse with it
from helix_transport.cli.main import main
from helix_transport.cli.printer import EventPrinter, status_name
from helix_transport.cli.serve import serve_main

__all__ = ["EventPrinter", "main", "serve_main", "status_name"]
