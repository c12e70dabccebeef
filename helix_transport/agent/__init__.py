"""Agents: definitions, the model layer and the run loop.

- ``definition``: ``Agent``, and the hook types it is built with;
- ``tools``: ``Tool``, ``ToolContext`` and the finish tool;
- ``hooks``: ``RunHooks``, what tracing (or anything else) observes of a run;
- ``model``: the ``Model`` seam (one method) and what it returns;
- ``litellm``: ``Model`` over litellm (with ``scripted``, the only modules that import it);
- ``loop``: ``RunLoop``, a step-driven ``match`` over ``_steps.NextStep``;
  ``_start`` rebuilds where a run begins, ``_tool_runner`` runs one tool call.
"""

import os

# Importing litellm fetches a model cost map from the network unless told not to;
# set it before any submodule imports litellm.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
