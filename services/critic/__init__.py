"""The critic agent: reviews an artifact and remembers earlier rounds."""

from services.critic.agent import agent

__all__ = ["agent"]
