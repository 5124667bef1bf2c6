"""Builds cudnn_cache with CMake and installs the Python package with its ops library and tool, and the
`cudnn_cache` command.

    pip install --no-build-isolation .

--no-build-isolation builds against the PyTorch already installed (torch==2.11.0): the ops library must
match the PyTorch and cuDNN it is loaded into. Needs the CUDA toolkit, cereal and CMake (scripts/install_deps.sh).

    pip install --no-build-isolation --no-deps -e .     (what scripts/build.sh runs)

builds nothing: the package runs from torch_ops/ and loads the ops library scripts/build.sh built in build/.
"""

import glob
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


def tool_runpath(cudnn_root: str) -> str:
    """$ORIGIN-relative RUNPATH entries for the tool installed in <site-packages>/cudnn_cache/bin: the folders of
    PyTorch's cuDNN and CUDA runtime wheels in that site-packages, as PyTorch's own libraries name them
    ($ORIGIN/../../nvidia/cudnn/lib, ...). CMake adds the absolute folders it linked against after them."""
    site = pathlib.Path(cudnn_root).parents[1]  # <site-packages>/nvidia/cudnn
    folders = [pathlib.Path(cudnn_root) / "lib"]
    folders += sorted({pathlib.Path(path).parent for path in glob.glob(str(site / "nvidia" / "*" / "lib" /
                                                                               "libcudart.so.*"))})
    return ";".join(f"$ORIGIN/../../{folder.relative_to(site)}" for folder in folders)


class CMakeBuild(build_ext):
    """Configures and builds the CMake project, then copies its products into the package."""

    def run(self) -> None:
        if getattr(self, "editable_mode", False) or self.inplace:
            return  # pip install -e: the package finds the build scripts/build.sh made (_library.py)
        super().run()

    def build_extension(self, ext: Extension) -> None:
        import nvidia.cudnn
        import torch

        subprocess.run([str(ROOT / "scripts" / "fetch_cudnn_frontend.sh")], check=True)  # headers, from PyPI
        build_dir = pathlib.Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        cudnn_root = nvidia.cudnn.__path__[0]
        subprocess.run(
            ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
             f"-DCUDNN_ROOT={cudnn_root}", f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
             f"-DPython3_EXECUTABLE={sys.executable}", "-DCUDNN_CACHE_BUILD_TESTS=OFF",
             f"-DCUDNN_CACHE_TOOL_RPATH={tool_runpath(cudnn_root)}"], check=True)
        # cudnn_cache._eager where CMake could build it (Note [Eager calls]): it says so in its cache.
        eager = "CUDNN_CACHE_EAGER_CALLS:INTERNAL=ON" in (build_dir / "CMakeCache.txt").read_text()
        subprocess.run(["cmake", "--build", str(build_dir), "--parallel", str(os.cpu_count() or 1), "--target",
                        "cudnn_cache_ops", "cudnn_cache_tool", *(["cudnn_cache_eager"] if eager else [])], check=True)

        package = pathlib.Path(self.build_lib) / "cudnn_cache"
        (package / "lib").mkdir(parents=True, exist_ok=True)
        (package / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(build_dir / "torch_ops" / "libcudnn_cache_ops.so", package / "lib" / "libcudnn_cache_ops.so")
        for module in (build_dir / "torch_ops").glob("_eager.*.so"):
            shutil.copy2(module, package / "lib" / module.name)
        # Installed by CMake's rules, which give the tool its install RUNPATH.
        with tempfile.TemporaryDirectory() as staging:
            subprocess.run(["cmake", "--install", str(build_dir), "--prefix", staging], check=True,
                           stdout=subprocess.DEVNULL)
            shutil.copy2(pathlib.Path(staging) / "bin" / "cudnn_cache_tool", package / "bin" / "cudnn_cache_tool")

    def get_outputs(self):
        package = pathlib.Path(self.build_lib) / "cudnn_cache"
        return [str(package / "lib" / "libcudnn_cache_ops.so"), str(package / "bin" / "cudnn_cache_tool"),
                *map(str, (package / "lib").glob("_eager.*.so"))]


setup(
    name="cudnn_cache",
    version="0.1.0",
    description="A persisted cuDNN algorithm cache for PyTorch",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    install_requires=["torch==2.11.0"],
    extras_require={"remote": ["hiredis>=2.2.1"]},  # the remote store (cudnn_cache.set_remote, `remote` commands)
    package_dir={"": "torch_ops"},
    packages=["cudnn_cache"],
    ext_modules=[CMakeExtension("cudnn_cache.lib.libcudnn_cache_ops")],
    cmdclass={"build_ext": CMakeBuild},
    entry_points={"console_scripts": ["cudnn_cache = cudnn_cache.__main__:main"]},
    zip_safe=False,
)
