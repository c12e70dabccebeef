"""Agents: definitions, the model layer and the run loop."""

import os

# Importing litellm fetches a model cost map from the network unless told not to;
# set it before any submodule imports litellm.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
