"""``python -m helix_transport.cli``: the ``helix-mesh`` command."""

from helix_transport.cli.main import main

raise SystemExit(main())
