"""Which BLAS MLX's CPU backend uses: the system OpenBLAS, else MKL from pip, else the bundled one.

The Linux ``mlx[cpu]`` wheel links a reference BLAS (``mlx_cpu.libs/libblas-*.so``): an fp32
matmul runs at a few GFLOP/s. ``libmlx.so`` takes ``cblas_sgemm`` from whichever library is
first in the process's global symbol scope, so loading a system OpenBLAS with
``RTLD_GLOBAL`` *before* ``import mlx.core`` makes every fp32 matmul run on it (tens to
hundreds of GFLOP/s, same results). Only fp32 gains: MLX computes bf16/fp16/quantized
matmuls itself, not through BLAS.

The sources, in order: a system OpenBLAS (apt's ``libopenblas0-pthread``), then Intel MKL
from the ``mkl`` wheel (``pip install 'mlxrt[mkl]'``, Linux x86_64 only: its
``lib/libmkl_rt.so.*`` exports the unprefixed ``cblas_sgemm`` MLX calls; the
``scipy-openblas`` wheels do not, their symbols are ``scipy_cblas_*``), then the bundled one.
``MLXRT_BLAS=openblas|mkl|bundled`` forces one source (a forced source that is missing is
reported, not replaced by another).

:func:`activate` runs first thing in :func:`mlxrt.cli.main`. It loads the library, checks one
small matmul against MLX's own multiply-and-sum and, if the results differ, restarts the process without it (a
library bound to ``libmlx`` cannot be unloaded). ``--no-system-blas`` or
``MLXRT_NO_SYSTEM_BLAS=1`` turn it off; ``MLXRT_BLAS_PATH`` names the library to use (MKL
when its file name says ``mkl``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import site
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = ["BlasStatus", "activate", "candidate_paths", "current", "expected", "find_system_blas", "find_mkl",
           "matmul_matches", "disabled_from_argv", "SOURCES"]

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
#: What ``MLXRT_BLAS`` may force.
SOURCES = ("openblas", "mkl", "bundled")
#: MKL's threading layer unless ``MKL_THREADING_LAYER`` (or a thread count) says otherwise.
#: Measured on 2 shared cores (load 4-6), `mlxrt serve` SmolLM2 fp32, lone-stream decode:
#: SEQUENTIAL 14.6 tok/s, INTEL 13.0, GNU 1.8 (libgomp's spinning workers starve the engine
#: thread; 13.8 with OMP_WAIT_POLICY=PASSIVE); tiny model: SEQUENTIAL 570 tok/s, GNU 243.
#: Threads only pay on big prefill matmuls of an idle machine: ask for them with
#: MKL_NUM_THREADS / OMP_NUM_THREADS (or MKL_THREADING_LAYER).
MKL_THREADING_DEFAULT = "SEQUENTIAL"
#: OpenBLAS's worker threads spin after each product for 2^N cycles (``OPENBLAS_THREAD_TIMEOUT``,
#: 4..30, its build's default 28: ~0.1 s) before they sleep, taking a core from the kernel's
#: threads and the engine between the products of a prefill. mlxrt sets 4 (sleep at once) unless
#: the variable is set. Measured here (2 cores, quiet, `benchmarks/long_context.py`, SmolLM2 Q4_1,
#: two interleaved runs): a 1,000-token prefill 2.88-2.99 -> 2.16-2.30 s, 4,000 tokens
#: 16.7-19.7 -> 13.0-14.0 s; decode steps and the tiny fp32 checkpoint unchanged within noise.
OPENBLAS_THREAD_TIMEOUT_DEFAULT = "4"


@attrs.frozen
class BlasStatus:
    """The BLAS of this process: ``kind`` ``"openblas"`` (a system library at ``path``),
    ``"mkl"`` (Intel MKL at ``path``, with its ``threading`` layer) or ``"bundled"`` (the
    wheel's own), with ``reason`` saying why when bundled."""

    kind: str
    path: str | None = None
    reason: str | None = None
    threading: str | None = None

    def __str__(self) -> str:
        if self.kind == "openblas":
            return f"system OpenBLAS ({self.path})"
        if self.kind == "mkl":
            return f"MKL ({self.path}, {self.threading} threading)"
        return f"bundled ({self.reason})" if self.reason else "bundled"

    @property
    def fast(self) -> bool:
        """Whether fp32 matmuls run on an optimized BLAS (what ``--dtype auto`` asks)."""
        return self.kind != "bundled"

    def as_dict(self) -> dict[str, Any]:
        return {"active": self.kind, "path": self.path, "reason": self.reason, "threading": self.threading,
                "text": str(self)}


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


def mkl_dirs() -> list[Path]:
    """Where pip puts the ``mkl`` wheel's libraries: ``lib/`` of this environment (the wheel's
    data files land in ``sys.prefix``), of the user base (``pip install --user``), of the base
    interpreter."""
    dirs = [Path(sys.prefix) / "lib", Path(site.getuserbase()) / "lib", Path(sys.base_prefix) / "lib"]
    return list(dict.fromkeys(dirs))


def find_mkl(dirs: Sequence[Path] | None = None) -> Path | None:
    """``libmkl_rt.so.N`` (newest ``N``) from the ``mkl`` wheel, or ``None``."""
    for folder in mkl_dirs() if dirs is None else dirs:
        found = sorted(folder.glob("libmkl_rt.so.*"), key=lambda p: p.name)
        if found:
            return found[-1]
    return None


def _is_mkl(path: Path) -> bool:
    return "mkl" in path.name


def matmul_matches() -> bool:
    """One small fp32 matmul through MLX (the BLAS's ``sgemm``) against the same product as
    MLX's own elementwise multiply and sum, which no BLAS computes (rtol 1e-4)."""
    import mlx.core as mx

    with mx.stream(mx.cpu):
        a, b = mx.random.normal((64, 48), key=mx.random.key(0)), mx.random.normal((48, 32), key=mx.random.key(1))
        reference = (a[:, :, None] * b[None, :, :]).sum(axis=1)
        got = _mlx_matmul(a, b)
        return got.shape == (64, 32) and bool(mx.allclose(got, reference, rtol=1e-4, atol=1e-4).item())


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


def _mkl_threading(env: Mapping[str, str]) -> str:
    """The layer MKL will use: ``MKL_THREADING_LAYER`` when set; a threaded one when
    ``MKL_NUM_THREADS`` or ``OMP_NUM_THREADS`` asks for more than one thread (MKL then reads
    the count itself): GNU when libgomp loads (MKL aborts at its first call when the layer's
    runtime is missing), else INTEL (libiomp5, which the ``mkl`` wheel brings through
    ``intel-openmp``); else :data:`MKL_THREADING_DEFAULT`."""
    if env.get("MKL_THREADING_LAYER"):
        return env["MKL_THREADING_LAYER"].upper()
    counts = [env.get(name, "").strip() for name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS")]
    if not any(c.isdigit() and int(c) > 1 for c in counts):
        return MKL_THREADING_DEFAULT
    try:
        ctypes.CDLL("libgomp.so.1")
    except OSError:
        return "INTEL"
    return "GNU"


def _restart_without_system_blas(reason: str) -> None:
    """Re-run this process, same arguments, with the system BLAS off and ``reason`` recorded."""
    os.environ["MLXRT_NO_SYSTEM_BLAS"] = "1"
    os.environ[_FALLBACK_ENV] = reason
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, list(sys.orig_argv))


def activate(argv: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> BlasStatus:
    """Load the system OpenBLAS, else MKL, if there is one and it computes right; return what
    is active.

    Call it before anything imports ``mlx.core``. A wrong matmul restarts the process (see the
    module docstring) and the restarted one reports ``bundled (check failed)``.
    """
    global _status
    env = os.environ if environ is None else environ
    _status = _decide(argv, env)
    return _status


def expected(environ: Mapping[str, str] | None = None) -> BlasStatus:
    """The BLAS an ``mlxrt`` command would run on, without loading anything: what
    :func:`activate` decided when it ran, else an OpenBLAS or MKL already mapped into the process
    (:func:`current`), else the library :func:`activate` would pick with this environment (its
    numerical check not run). ``mlxrt fit`` and ``GET /fit`` size ``--dtype auto`` with it."""
    found = current()
    if _status is not None or found.fast:
        return found
    return _decide((), os.environ if environ is None else environ, load=False)


def _decide(argv: Sequence[str], env: Mapping[str, str], *, load: bool = True) -> BlasStatus:
    """What :func:`activate` does; with ``load=False`` only what it would pick (a fresh process
    activates before importing mlx, so an imported mlx does not count)."""
    if env.get(_FALLBACK_ENV):
        return BlasStatus("bundled", reason=env[_FALLBACK_ENV])
    if disabled_from_argv(argv, env):
        return BlasStatus("bundled", reason="--no-system-blas" if "--no-system-blas" in argv
                          else "MLXRT_NO_SYSTEM_BLAS=1")
    forced = env.get("MLXRT_BLAS", "").strip().lower()
    if forced and forced not in SOURCES:
        return BlasStatus("bundled", reason=f"MLXRT_BLAS={forced} is not one of {', '.join(SOURCES)}")
    if forced == "bundled":
        return BlasStatus("bundled", reason="MLXRT_BLAS=bundled")
    if sys.platform != "linux":
        return BlasStatus("bundled", reason=f"system BLAS is only used on Linux, not {sys.platform}")
    if load and _mlx_imported():
        return BlasStatus("bundled", reason="mlx imported first")
    path = _pick(forced, env)
    if isinstance(path, str):
        return BlasStatus("bundled", reason=path)
    kind, threading = ("mkl", _mkl_threading(env)) if _is_mkl(path) else ("openblas", None)
    if not load:
        return BlasStatus(kind, path=str(path), threading=threading)
    if threading is not None and not env.get("MKL_THREADING_LAYER"):
        # Read by MKL when it first runs, from the C environment, which os.environ writes through.
        os.environ["MKL_THREADING_LAYER"] = threading
    if kind == "openblas" and not env.get("OPENBLAS_THREAD_TIMEOUT"):
        # Read by OpenBLAS when it is loaded (its thread server starts then).
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = OPENBLAS_THREAD_TIMEOUT_DEFAULT
    try:
        _load(path)
    except OSError as exc:
        return BlasStatus("bundled", reason=f"cannot load {path}: {exc}")
    if not matmul_matches():
        _restart_without_system_blas("check failed")
        return BlasStatus("bundled", reason="check failed")  # only when restarting is stubbed out
    return BlasStatus(kind, path=str(path), threading=threading)


def _pick(forced: str, env: Mapping[str, str]) -> Path | str:
    """The library to load, or why there is none."""
    if env.get("MLXRT_BLAS_PATH"):
        return Path(env["MLXRT_BLAS_PATH"])
    openblas = None if forced == "mkl" else find_system_blas(env)
    if openblas is not None:
        return openblas
    mkl = None if forced == "openblas" else find_mkl()
    if mkl is not None:
        return mkl
    if forced == "openblas":
        return "MLXRT_BLAS=openblas but no system OpenBLAS found; apt-get install libopenblas0-pthread"
    if forced == "mkl":
        return "MLXRT_BLAS=mkl but no MKL found; pip install 'mlxrt[mkl]'"
    return "no system OpenBLAS or MKL found; apt-get install libopenblas0-pthread or pip install 'mlxrt[mkl]'"


def current() -> BlasStatus:
    """What :func:`activate` decided; when it never ran (mlxrt used as a library), whether an
    OpenBLAS or MKL is mapped into the process anyway (``LD_PRELOAD``, another loader)."""
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
        if "libmkl_rt" in line and "/" in line:
            return BlasStatus("mkl", path=line[line.index("/"):],
                              threading=os.environ.get("MKL_THREADING_LAYER", "INTEL").upper())
    return BlasStatus("bundled", reason="not activated")
