"""What the server can do for a request, stated by the plugins and the served model.

One home for the answer, so a dialect, the templating step, ``/v1/models``, the embeddings route
and the status pages agree: output constraints are enforced only when a plugin declares
``structured_outputs`` (``mlxrt_capabilities``), not when some plugin happens to implement a
hook the grammar plugin also implements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlxrt.records import Capabilities, FamilyProfile

if TYPE_CHECKING:
    from mlxrt.registry import PluginHost

__all__ = ["STRUCTURED_OUTPUTS", "declared", "capabilities", "capabilities_of"]

#: The capability a grammar plugin declares (``mlxrt_capabilities``).
STRUCTURED_OUTPUTS = "structured_outputs"


def declared(host: PluginHost) -> frozenset[str]:
    """The capability names the loaded plugins declare."""
    return frozenset(name for _plugin, name in host.collect("mlxrt_capabilities"))


def capabilities(host: PluginHost, profile: FamilyProfile) -> Capabilities:
    """The capabilities of the model ``profile`` describes (a served model's are
    :attr:`mlxrt.serving.ServedModel.capabilities`; ``/v1/models`` asks for a model that is not
    resident by its last profile), with the plugins loaded now."""
    return capabilities_of(profile, declared(host))


def capabilities_of(profile: FamilyProfile, names: frozenset[str]) -> Capabilities:
    """The capabilities of the model ``profile`` describes when the plugins declared ``names``
    (:func:`declared`; a served model keeps the set it was served with)."""
    from mlxrt.engine.embedding import is_embedding_model

    return Capabilities(structured_outputs=STRUCTURED_OUTPUTS in names,
                        vision=profile.vision is not None, embeddings=is_embedding_model(profile.info))
