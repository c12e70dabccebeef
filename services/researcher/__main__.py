"""Serve the researcher agent: python -m services.researcher [--port P] [--store URL]."""

from helix_transport.cli import serve_main

serve_main("services.researcher:agent")
