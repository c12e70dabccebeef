"""The researcher agent: finds and reads notes on a topic."""

from services.researcher.agent import agent

__all__ = ["agent"]
