"""Serve the mailer agent: python -m services.mailer [--port P] [--store URL]."""

from helix_transport.cli import serve_main

serve_main("services.mailer:agent")
