"""The Gemma 4 family plugin (registered; behaviour arrives with the families issue).

mlx-lm loads Gemma 4 text checkpoints itself. This plugin does not yet answer any family
hook: the sentinel tool router, the thinking channel and the vision tower are not built, so
it claims none of them rather than pretend. Gemma 4 models are served by the generic tier.
"""

from __future__ import annotations

MLXRT_PLUGIN_KIND = "family"
MODEL_TYPES = frozenset({"gemma4", "gemma4_text"})
