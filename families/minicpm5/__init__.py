"""The MiniCPM5 family plugin (registered; behaviour arrives with the families issue).

It answers no family hook yet — its tool-call format and thinking handling are not built —
so MiniCPM models are served by mlx-lm's generic tier until then.
"""

from __future__ import annotations

MLXRT_PLUGIN_KIND = "family"
MODEL_TYPES = frozenset({"minicpm", "minicpm5"})
