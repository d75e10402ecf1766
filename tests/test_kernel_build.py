"""The mlxrt-qmv kernel is built on Linux only: its CMake refuses any other system before it
looks for a compiler, Python or MLX, and ``scripts/setup`` does not try it there."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
@pytest.mark.parametrize("system", ["Darwin", "Windows"])
def test_the_kernel_s_cmake_refuses_other_systems_first(system, tmp_path):
    out = subprocess.run(["cmake", "-S", str(ROOT / "kernels" / "mlxrt-qmv"), "-B", str(tmp_path),
                          f"-DCMAKE_SYSTEM_NAME={system}"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert f"mlxrt-qmv builds on Linux only (not {system})" in " ".join(out.stderr.split())
    assert "Found Python" not in out.stdout and "CXX compiler" not in out.stdout  # refused first


def _fake(path: Path, text: str) -> Path:
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(("system", "env", "note"), [
    ("Darwin", {}, "builds on Linux only: not built on Darwin"),
    ("Linux", {"MLXRT_SETUP_NO_KERNEL": "1"}, "MLXRT_SETUP_NO_KERNEL is set"),
])
def test_setup_skips_the_kernel_off_linux(system, env, note, tmp_path):
    """scripts/setup with a Python that records what it is asked (and makes a venv of itself)
    and a ``uname`` that names another system: no step installs the kernel."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    _fake(bin_dir / "uname", f"echo {system}\n")
    python = _fake(bin_dir / "python3", f'echo "$*" >> {log}\n'
                                        'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi\n')
    out = subprocess.run([str(ROOT / "scripts" / "setup")], capture_output=True, text=True, timeout=60,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": str(python), "VENV": str(tmp_path / "venv"),
                              **env})
    assert out.returncode == 0, out.stderr
    assert note in out.stderr
    calls = log.read_text()
    assert "pip install" in calls and "mlxrt-qmv" not in calls and "nanobind" not in calls
