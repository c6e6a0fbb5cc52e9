# gin_ep: the PyTorch extension of gin::ep (docs/ep.md). Build on a machine
# with PyTorch and the CUDA toolkit:  pip install --no-build-isolation ./python
# (TORCH_CUDA_ARCH_LIST picks the GPU architectures, else the visible GPU's).
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

here = os.path.dirname(os.path.abspath(__file__))
gin_include = os.path.join(os.path.dirname(here), "include")  # gin is header-only

setup(
    name="gin_ep",
    packages=["gin_ep"],
    ext_modules=[
        CUDAExtension(
            "gin_ep._C",
            sources=["csrc/bindings.cpp", "csrc/runtime.cu"],
            include_dirs=[gin_include, os.path.join(here, "csrc")],
            extra_compile_args={
                "cxx": ["-std=c++20", "-O2"],
                "nvcc": ["-std=c++20", "-O2", "--expt-relaxed-constexpr",
                         "-Xcudafe", "--diag_suppress=unrecognized_gcc_pragma"],
            },
            libraries=["dl", "rt"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
