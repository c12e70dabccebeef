"""The mesh's agent services: one package per agent type, each exposing ``agent``.

Serve one with ``python -m services.<name> [--port P] [--store URL]``.
"""
