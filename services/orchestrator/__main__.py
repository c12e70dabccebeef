"""Serve the orchestrator agent: python -m services.orchestrator [--port P] [--store URL]."""

from helix_transport.cli import serve_main

serve_main("services.orchestrator:agent")
