"""Build of mlxrt-qmv with mlx's own CMake helper (mlx.extension.CMakeBuild).

The distribution requires exactly the MLX version whose headers it was compiled with: a custom
primitive subclasses MLX's C++ ``Primitive`` and links ``libmlx``, so another MLX is another ABI.
"""

import mlx.core as mx
from mlx import extension
from setuptools import setup

setup(
    name="mlxrt-qmv",
    version="0.8.0",
    description="A quantized matrix-vector kernel for MLX's CPU backend (custom MLX primitive) used by mlxrt",
    license="MIT",
    python_requires=">=3.10",
    packages=["mlxrt_qmv"],
    ext_modules=[extension.CMakeExtension("mlxrt_qmv._ext")],
    cmdclass={"build_ext": extension.CMakeBuild},
    install_requires=[f"mlx=={mx.__version__}"],
    zip_safe=False,
)
