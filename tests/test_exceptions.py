"""The error tree: every error raised on purpose is in it, with its status code."""

from __future__ import annotations

import pickle
import re

import grpc

from helix_transport import _exceptions
from helix_transport._exceptions import HelixError, ServerUnavailable
from helix_transport.server.interceptors import status_for


def test_server_unavailable_is_in_the_tree_and_maps_to_unavailable() -> None:
    error = ServerUnavailable("server is shutting down; not starting new sessions")
    assert isinstance(error, HelixError) and error.retryable
    assert status_for(error) is grpc.StatusCode.UNAVAILABLE
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is ServerUnavailable and again.message == error.message


def test_the_tree_drawn_in_the_docstring_names_every_error() -> None:
    doc = _exceptions.__doc__ or ""
    errors = [
        name
        for name, value in vars(_exceptions).items()
        if isinstance(value, type) and issubclass(value, HelixError)
    ]
    drawn = set(re.findall(r"^[\s│├└─]*(\w+)", doc, re.MULTILINE))
    assert [name for name in errors if name not in drawn] == []
