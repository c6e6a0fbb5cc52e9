// The copy kernel of gin's side context (include/gin/host/side_context.hpp),
// which loads it as PTX text. Regenerate include/gin/host/side_copy_ptx.hpp
// after editing: bash scripts/side_copy_ptx.sh
#include <cstdint>
struct Entry { char* dst; const char* src; unsigned long long bytes; };
struct Batch { Entry e[64]; unsigned n; };
// Block y copies entry y; its blocks x stride over it. 16-byte units where
// both ends and the length allow, else 8-byte, else bytes.
extern "C" __global__ void gin_side_copy(Batch b) {
  const unsigned y = blockIdx.y;
  if (y >= b.n) return;
  char* dst = b.e[y].dst;
  const char* src = b.e[y].src;
  const unsigned long long n = b.e[y].bytes;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long a = (unsigned long long)dst | (unsigned long long)src | n;
  if ((a & 15) == 0) {
    for (unsigned long long i = first; i < n / 16; i += stride)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  } else if ((a & 7) == 0) {
    for (unsigned long long i = first; i < n / 8; i += stride)
      reinterpret_cast<unsigned long long*>(dst)[i] = reinterpret_cast<const unsigned long long*>(src)[i];
  } else {
    for (unsigned long long i = first; i < n; i += stride) dst[i] = src[i];
  }
}
