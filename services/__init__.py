"""The mesh's agent services: one package per agent type, each exposing ``agent``.

Serve one with ``python -m services.<name> [--port P] [--store URL]`` and an authentication
option (``--auth-tokens PATH``, ``--jwt-key``, ``--tls-client-ca``, or ``--allow-unauthenticated``
on loopback; README, Security).
"""
