"""The mailer agent: sends one email, once a person approves it."""

from services.mailer.agent import agent

__all__ = ["agent"]
