"""Test support for mlxrt and for plugin authors: tiny random-weight checkpoints in the real Hugging
Face layout, the family conformance runner and the pytest fixtures.

* :mod:`mlxrt.testing.writers` -- ``write_tiny_checkpoint``, ``write_random_adapter`` and the model
  types they write (the per-family private writers ``_tiny_*``, ``_checkpoint_files`` and
  ``_tokenizer_factory`` sit beside it);
* :mod:`mlxrt.testing.conformance` -- ``check_family``, ``FamilyCheck``;
* :mod:`mlxrt.testing.pytest_plugin` -- the ``mlxrt_*`` fixtures, registered through ``pytest11``.

The public names are re-exported here and resolved on first use, so importing this package (as
the pytest plugin does in every pytest run) imports nothing heavy::

    from mlxrt.testing import write_tiny_checkpoint, check_family
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlxrt.testing.conformance import FamilyCheck, check_family
    from mlxrt.testing.writers import (
        TINY_FAMILY_TYPES,
        TINY_MODEL_TYPES,
        TINY_VARIANTS,
        write_random_adapter,
        write_tiny_checkpoint,
    )

__all__ = ["TINY_MODEL_TYPES", "TINY_VARIANTS", "TINY_FAMILY_TYPES", "write_tiny_checkpoint",
           "write_random_adapter", "check_family", "FamilyCheck"]

_HOME = {"TINY_MODEL_TYPES": "writers", "TINY_VARIANTS": "writers", "TINY_FAMILY_TYPES": "writers",
         "write_tiny_checkpoint": "writers", "write_random_adapter": "writers",
         "check_family": "conformance", "FamilyCheck": "conformance"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'mlxrt.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mlxrt.testing.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
