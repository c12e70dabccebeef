"""Serve the critic agent: python -m services.critic [--port P] [--store URL]."""

from helix_transport.cli import serve_main

serve_main("services.critic:agent")
