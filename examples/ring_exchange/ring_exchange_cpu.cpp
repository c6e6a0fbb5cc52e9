// The demo built by a plain C++ compiler (no nvcc): CPU ranks only.
#include "ring_exchange.cu"
