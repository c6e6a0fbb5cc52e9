// The example built by a plain C++ compiler (no nvcc): CPU ranks only.
#include "moe.cu"
