"""Which litellm model an agent type calls, and litellm's retries, timeout and fallbacks.

Each setting comes from the first of: the agent type's own variable
(``HELIX_MODEL_<TYPE>``, ``HELIX_LLM_NUM_RETRIES_<TYPE>``...), the process-wide one
(``HELIX_MODEL``, ``HELIX_LLM_NUM_RETRIES``...), the ``Agent`` definition, litellm's
default. ``<TYPE>`` is the agent type upper-cased, every character but letters and
digits as ``_`` (``my-agent``: ``MY_AGENT``), as for
``HELIX_AGENT_ADDRESS_<TYPE>``. An empty variable is unset. The environment is read at
every model call, by ``helix_transport.config``.

The family of the knobs is ``HELIX_LLM_`` rather than ``HELIX_MODEL_``, so no agent type
(``retries``, say) can make one setting's name another's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from helix_transport._exceptions import UsageError
from helix_transport.config import ModelSettings, type_suffix

type_env_suffix = type_suffix
"""``translator-node`` -> ``TRANSLATOR_NODE``: the ``<TYPE>`` of a per-type variable."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """One agent type's model and how litellm calls it (``Agent.model_config()``)."""

    model: str = ""
    """The litellm model name (``openai/gpt-4o-mini``, ``scripted/researcher``...)."""
    num_retries: int | None = None
    """Further attempts after a failed call (litellm's ``num_retries``); None: litellm's
    default, which is none."""
    timeout_s: float | None = None
    """Seconds a call may take before litellm gives up on it (``timeout``); None:
    litellm's default (600 s)."""
    fallbacks: tuple[str, ...] = ()
    """Models tried in order when a call to ``model`` fails after its retries."""

    def __post_init__(self) -> None:
        if self.num_retries is not None and self.num_retries < 0:
            raise UsageError(f"num_retries must be 0 or more, not {self.num_retries}")
        if self.timeout_s is not None and not (
            math.isfinite(self.timeout_s) and self.timeout_s > 0
        ):
            raise UsageError(
                f"timeout_s must be a positive number of seconds, not {self.timeout_s}"
            )
        if any(not name.strip() for name in self.fallbacks):
            raise UsageError(f"fallbacks must be model names, not {list(self.fallbacks)!r}")

    def litellm_settings(self) -> dict[str, Any]:
        """The ``litellm.acompletion`` arguments for what is set (nothing for litellm's defaults)."""
        settings: dict[str, Any] = {}
        if self.num_retries is not None:
            settings["num_retries"] = self.num_retries
        if self.timeout_s is not None:
            settings["timeout"] = self.timeout_s
        if self.fallbacks:
            settings["fallbacks"] = list(self.fallbacks)
        return settings

    def with_settings(self, settings: ModelSettings, *, agent_type: str) -> ModelConfig:
        """This config with what the environment sets for ``agent_type``
        (``config.Environment().model(agent_type)``) laid over it.

        Raises:
            UsageError: the result does not hold (a timeout of 0...), naming the agent.
        """
        try:
            return replace(self, **settings.changes())
        except UsageError as exc:
            raise UsageError(f"agent {agent_type!r}: {exc} (from the environment)") from None
