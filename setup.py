"""Builds cudnn_cache with CMake and installs the Python package with its ops library and tool.

    pip install --no-build-isolation .

--no-build-isolation builds against the PyTorch already installed (torch==2.11.0): the ops library must
match the PyTorch and cuDNN it is loaded into. Needs the CUDA toolkit, cereal and CMake (scripts/install_deps.sh).
"""

import os
import pathlib
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures and builds the CMake project, then copies its products into the package."""

    def build_extension(self, ext: Extension) -> None:
        import nvidia.cudnn
        import torch

        subprocess.run([str(ROOT / "scripts" / "fetch_cudnn_frontend.sh")], check=True)  # headers, from PyPI
        build_dir = pathlib.Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
             f"-DCUDNN_ROOT={nvidia.cudnn.__path__[0]}", f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
             "-DCUDNN_CACHE_BUILD_TESTS=OFF"], check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--parallel", str(os.cpu_count() or 1), "--target",
                        "cudnn_cache_ops", "cudnn_cache_tool"], check=True)

        package = pathlib.Path(self.build_lib) / "cudnn_cache"
        (package / "lib").mkdir(parents=True, exist_ok=True)
        (package / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(build_dir / "torch_ops" / "libcudnn_cache_ops.so", package / "lib" / "libcudnn_cache_ops.so")
        shutil.copy2(build_dir / "cudnn_cache_tool", package / "bin" / "cudnn_cache_tool")

    def get_outputs(self):
        package = pathlib.Path(self.build_lib) / "cudnn_cache"
        return [str(package / "lib" / "libcudnn_cache_ops.so"), str(package / "bin" / "cudnn_cache_tool")]


setup(
    name="cudnn_cache",
    version="0.1.0",
    description="A persisted cuDNN algorithm cache for PyTorch",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    install_requires=["torch==2.11.0"],
    package_dir={"": "torch_ops"},
    packages=["cudnn_cache"],
    ext_modules=[CMakeExtension("cudnn_cache.lib.libcudnn_cache_ops")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
