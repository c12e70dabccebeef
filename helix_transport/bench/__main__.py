"""``python -m helix_transport.bench``: see ``helix_transport.bench``."""

from __future__ import annotations

from helix_transport.bench._main import main

raise SystemExit(main())
