"""Serve the summarizer agent: python -m services.summarizer [--port P] [--store URL]."""

from helix_transport.cli import serve_main

serve_main("services.summarizer:agent")
