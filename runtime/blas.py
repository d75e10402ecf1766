"""Which BLAS MLX's CPU backend uses: the system OpenBLAS when there is one, else the bundled one.

The Linux ``mlx[cpu]`` wheel links a reference BLAS (``mlx_cpu.libs/libblas-*.so``): an fp32
matmul runs at a few GFLOP/s. ``libmlx.so`` takes ``cblas_sgemm`` from whichever library is
first in the process's global symbol scope, so loading a system OpenBLAS with
``RTLD_GLOBAL`` *before* ``import mlx.core`` makes every fp32 matmul run on it (tens to
hundreds of GFLOP/s, same results). Only fp32 gains: MLX computes bf16/fp16/quantized
matmuls itself, not through BLAS.

:func:`activate` runs first thing in :func:`mlxrt.cli.main`. It loads the library, checks one
small matmul against numpy and, if the results differ, restarts the process without it (a
library bound to ``libmlx`` cannot be unloaded). ``--no-system-blas`` or
``MLXRT_NO_SYSTEM_BLAS=1`` turn it off; ``MLXRT_BLAS_PATH`` names the library to use.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = ["BlasStatus", "activate", "candidate_paths", "current", "find_system_blas",
           "matmul_matches", "disabled_from_argv"]

#: Debian/Ubuntu library paths of ``libopenblas0-pthread`` (then other OpenBLAS builds),
#: ``{arch}`` being the multiarch triplet's first part. ``libopenblas.so.0`` first: the
#: ``libblas.so.3`` next to it is a thin front that may resolve to another alternative.
_DEBIAN_PATHS = (
    "/usr/lib/{arch}-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/{arch}-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/{arch}-linux-gnu/libopenblas.so.0",
    "/usr/lib/{arch}-linux-gnu/openblas-openmp/libopenblas.so.0",
    "/usr/lib/{arch}-linux-gnu/openblas-serial/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",  # Fedora/RHEL
    "/usr/lib/libopenblas.so.0",  # Arch, Alpine
)

#: Set (by :func:`activate`, for the restarted process) to why the system BLAS was dropped.
_FALLBACK_ENV = "MLXRT_BLAS_FALLBACK"


@attrs.frozen
class BlasStatus:
    """The BLAS of this process: ``kind`` ``"openblas"`` (a system library at ``path``) or
    ``"bundled"`` (the wheel's own), with ``reason`` saying why when bundled."""

    kind: str
    path: str | None = None
    reason: str | None = None

    def __str__(self) -> str:
        if self.kind == "openblas":
            return f"system OpenBLAS ({self.path})"
        return f"bundled ({self.reason})" if self.reason else "bundled"

    def as_dict(self) -> dict[str, Any]:
        return {"active": self.kind, "path": self.path, "reason": self.reason, "text": str(self)}


# The process's BLAS is process-global by nature; this records what activate() did.
_status: BlasStatus | None = None


def disabled_from_argv(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``--no-system-blas`` is in ``argv`` (read before click parses) or the env says so."""
    env = os.environ if environ is None else environ
    return "--no-system-blas" in argv or env.get("MLXRT_NO_SYSTEM_BLAS", "") not in ("", "0")


def candidate_paths(environ: Mapping[str, str] | None = None, machine: str | None = None) -> list[Path]:
    """Where to look, in order: ``MLXRT_BLAS_PATH``, then the distribution paths for this CPU."""
    env = os.environ if environ is None else environ
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get((machine or platform.machine()).lower(),
                                                      (machine or platform.machine()).lower())
    paths = [Path(env["MLXRT_BLAS_PATH"])] if env.get("MLXRT_BLAS_PATH") else []
    return paths + [Path(p.format(arch=arch)) for p in _DEBIAN_PATHS]


def find_system_blas(environ: Mapping[str, str] | None = None, machine: str | None = None) -> Path | None:
    """The first candidate that exists (``MLXRT_BLAS_PATH`` is taken as given, even if missing,
    so a wrong override is reported rather than silently replaced)."""
    env = os.environ if environ is None else environ
    if env.get("MLXRT_BLAS_PATH"):
        return Path(env["MLXRT_BLAS_PATH"])
    return next((p for p in candidate_paths(env, machine) if p.exists()), None)


def matmul_matches() -> bool:
    """One small fp32 matmul through MLX, compared with numpy's (rtol 1e-4)."""
    import mlx.core as mx
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 48), dtype=np.float32)
    b = rng.standard_normal((48, 32), dtype=np.float32)
    got = np.array(_mlx_matmul(mx.array(a), mx.array(b)))
    return got.shape == (64, 32) and bool(np.allclose(got, a @ b, rtol=1e-4, atol=1e-4))


def _mlx_matmul(a: Any, b: Any) -> Any:
    import mlx.core as mx

    with mx.stream(mx.cpu):
        out = a @ b
        mx.eval(out)
    return out


def _mlx_imported() -> bool:
    return "mlx.core" in sys.modules


def _load(path: Path) -> None:
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


def _restart_without_system_blas(reason: str) -> None:
    """Re-run this process, same arguments, with the system BLAS off and ``reason`` recorded."""
    os.environ["MLXRT_NO_SYSTEM_BLAS"] = "1"
    os.environ[_FALLBACK_ENV] = reason
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, list(sys.orig_argv))


def activate(argv: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> BlasStatus:
    """Load the system OpenBLAS if there is one and it computes right; return what is active.

    Call it before anything imports ``mlx.core``. A wrong matmul restarts the process (see the
    module docstring) and the restarted one reports ``bundled (check failed)``.
    """
    global _status
    env = os.environ if environ is None else environ
    _status = _decide(argv, env)
    return _status


def _decide(argv: Sequence[str], env: Mapping[str, str]) -> BlasStatus:
    if env.get(_FALLBACK_ENV):
        return BlasStatus("bundled", reason=env[_FALLBACK_ENV])
    if disabled_from_argv(argv, env):
        return BlasStatus("bundled", reason="--no-system-blas" if "--no-system-blas" in argv
                          else "MLXRT_NO_SYSTEM_BLAS=1")
    if sys.platform != "linux":
        return BlasStatus("bundled", reason=f"system BLAS is only used on Linux, not {sys.platform}")
    if _mlx_imported():
        return BlasStatus("bundled", reason="mlx imported first")
    path = find_system_blas(env)
    if path is None:
        return BlasStatus("bundled", reason="no system OpenBLAS found; apt-get install libopenblas0-pthread")
    try:
        _load(path)
    except OSError as exc:
        return BlasStatus("bundled", reason=f"cannot load {path}: {exc}")
    if not matmul_matches():
        _restart_without_system_blas("check failed")
        return BlasStatus("bundled", reason="check failed")  # only when restarting is stubbed out
    return BlasStatus("openblas", path=str(path))


def current() -> BlasStatus:
    """What :func:`activate` decided; when it never ran (mlxrt used as a library), whether an
    OpenBLAS is mapped into the process anyway (``LD_PRELOAD``, another loader)."""
    if _status is not None:
        return _status
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return BlasStatus("bundled", reason="not activated")
    for line in maps.splitlines():
        # Wheels' private copies (numpy.libs/…) have their own symbol names: not MLX's BLAS.
        if "libopenblas" in line and "/" in line and ".libs/" not in line:
            return BlasStatus("openblas", path=line[line.index("/"):])
    return BlasStatus("bundled", reason="not activated")
