// gin-bench built by a plain C++ compiler (no nvcc): the CPU-emulation path
// only. The CUDA parts of gin_bench.cu sit under __CUDACC__.
#include "gin_bench.cu"
