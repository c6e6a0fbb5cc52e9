// gin-nvl-probe: the ceiling of an all-to-all of rows over NVLink, the bytes
// of gin_ep's normal dispatch (docs/performance.md). Every visible GPU (one
// process, peer access) sends `rows` rows of 14336 bytes (a bf16 row of
// hidden 7168) to each other GPU, by plain SM stores (a warp per row, 16-byte
// loads and stores, 8 in flight per thread, the grid and CTA size swept) and
// by the copy engine (cudaMemcpyPeerAsync, a stream per peer). No protocol:
// no rings, no signals, no flow control: what any kernel that moves these
// bytes with SM stores can reach at most. Time per GPU from CUDA events over
// 10 back-to-back launches after a warm-up; the slowest GPU's is reported.
// Usage: gin-nvl-probe [rows per peer, default 3700: 159 MB per GPU on 4 GPUs]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define PROBE_CHECK(x)                                                                \
  do {                                                                                \
    const cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

constexpr int kMaxGpus = 8, kRowBytes = 14336, kIters = 10, kUnroll = 8;

struct Rows {
  char* dst[kMaxGpus];  // per peer: this GPU's region in the peer's receive buffer
  const char* src;
  int peers, rows;
};

// A warp per (row, peer), round-robin over the grid's warps (up to 1024 threads per CTA).
__global__ void __launch_bounds__(1024) storeRows(Rows a) {
  const int lane = int(threadIdx.x % 32), n16 = kRowBytes / 16;
  const long warps = long(gridDim.x) * (blockDim.x / 32), jobs = long(a.rows) * a.peers;
  for (long job = (long(blockIdx.x) * blockDim.x + threadIdx.x) / 32; job < jobs; job += warps) {
    const long r = job / a.peers;
    const uint4* s = reinterpret_cast<const uint4*>(a.src + r * kRowBytes);
    uint4* d = reinterpret_cast<uint4*>(a.dst[job % a.peers] + r * kRowBytes);
    for (int i = lane; i < n16; i += 32 * kUnroll) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (i + u * 32 < n16) v[u] = __ldg(s + i + u * 32);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (i + u * 32 < n16) d[i + u * 32] = v[u];
    }
  }
}

int main(int argc, char** argv) {
  int G = 0;
  PROBE_CHECK(cudaGetDeviceCount(&G));
  const int rows = argc > 1 ? std::atoi(argv[1]) : 3700;
  if (G < 2 || G > kMaxGpus || rows < 1) {
    std::fprintf(stderr, "gin-nvl-probe: needs 2 to %d GPUs (found %d) and rows >= 1\n", kMaxGpus, G);
    return 1;
  }
  const size_t region = size_t(rows) * kRowBytes;
  const double bytesOut = double(region) * (G - 1);
  std::printf("%d GPUs, %d rows of %d bytes to each peer: %.1f MB out of each GPU\n", G, rows, kRowBytes,
              bytesOut / 1e6);
  std::vector<char*> src(G), recv(G);  // recv[g]: [source][rows][kRowBytes]
  std::vector<cudaStream_t> st(size_t(G) * G);  // [g][0]: kernels and events; [g][1 + p]: peer p's copies
  std::vector<cudaEvent_t> e0(G), e1(G), done(size_t(G) * G);
  for (int g = 0; g < G; ++g) {
    PROBE_CHECK(cudaSetDevice(g));
    for (int h = 0; h < G; ++h)
      if (h != g) PROBE_CHECK(cudaDeviceEnablePeerAccess(h, 0));
    PROBE_CHECK(cudaMalloc(&src[g], region));
    PROBE_CHECK(cudaMemset(src[g], g + 1, region));
    PROBE_CHECK(cudaMalloc(&recv[g], region * G));
    for (int k = 0; k < G; ++k) {
      PROBE_CHECK(cudaStreamCreateWithFlags(&st[size_t(g) * G + k], cudaStreamNonBlocking));
      PROBE_CHECK(cudaEventCreate(&done[size_t(g) * G + k]));
    }
    PROBE_CHECK(cudaEventCreate(&e0[g]));
    PROBE_CHECK(cudaEventCreate(&e1[g]));
  }
  auto rowsOf = [&](int g) {
    Rows a{};
    a.src = src[g];
    a.rows = rows;
    for (int h = 0; h < G; ++h)
      if (h != g) a.dst[a.peers++] = recv[h] + size_t(g) * region;
    return a;
  };
  auto report = [&](const char* what) {
    float worst = 0;
    for (int g = 0; g < G; ++g) {
      PROBE_CHECK(cudaSetDevice(g));
      PROBE_CHECK(cudaEventSynchronize(e1[g]));
      float ms = 0;
      PROBE_CHECK(cudaEventElapsedTime(&ms, e0[g], e1[g]));
      worst = std::max(worst, ms / kIters);
    }
    std::printf("%-36s %8.1f us  %7.1f GB/s out of each GPU\n", what, worst * 1e3, bytesOut / (worst * 1e-3) / 1e9);
  };
  auto sync = [&] {
    for (int g = 0; g < G; ++g) {
      PROBE_CHECK(cudaSetDevice(g));
      PROBE_CHECK(cudaDeviceSynchronize());
    }
  };
  std::printf("%-36s %8s  %7s\n", "how", "time", "rate");
  for (int threads : {256, 1024})
    for (int blocks : {16, 26, 52, 104, 132}) {
      for (int timed = 0; timed < 2; ++timed) {  // a warm-up round, then the timed one
        for (int g = 0; g < G; ++g) {
          PROBE_CHECK(cudaSetDevice(g));
          cudaStream_t s = st[size_t(g) * G];
          PROBE_CHECK(cudaEventRecord(e0[g], s));
          for (int i = 0; i < kIters; ++i) storeRows<<<blocks, threads, 0, s>>>(rowsOf(g));
          PROBE_CHECK(cudaGetLastError());
          PROBE_CHECK(cudaEventRecord(e1[g], s));
        }
        sync();
      }
      char what[64];
      std::snprintf(what, sizeof what, "SM stores, %d CTAs x %d threads", blocks, threads);
      report(what);
    }
  for (int timed = 0; timed < 2; ++timed) {
    for (int g = 0; g < G; ++g) {
      PROBE_CHECK(cudaSetDevice(g));
      cudaStream_t s = st[size_t(g) * G];
      PROBE_CHECK(cudaEventRecord(e0[g], s));
      const Rows a = rowsOf(g);
      for (int p = 0; p < a.peers; ++p) {
        cudaStream_t c = st[size_t(g) * G + 1 + p];
        PROBE_CHECK(cudaStreamWaitEvent(c, e0[g]));
        const int peer = p < g ? p : p + 1;
        for (int i = 0; i < kIters; ++i) PROBE_CHECK(cudaMemcpyPeerAsync(a.dst[p], peer, src[g], g, region, c));
        PROBE_CHECK(cudaEventRecord(done[size_t(g) * G + 1 + p], c));
        PROBE_CHECK(cudaStreamWaitEvent(s, done[size_t(g) * G + 1 + p]));
      }
      PROBE_CHECK(cudaEventRecord(e1[g], s));
    }
    sync();
  }
  report("copy engine, a stream per peer");
  std::vector<char> row(kRowBytes);
  for (int g = 0; g < G; ++g)
    for (int s = 0; s < G; ++s) {
      if (s == g) continue;
      PROBE_CHECK(cudaSetDevice(g));
      PROBE_CHECK(cudaMemcpy(row.data(), recv[g] + size_t(s) * region + region - kRowBytes, kRowBytes,
                             cudaMemcpyDeviceToHost));
      if (row.front() != char(s + 1) || row.back() != char(s + 1)) {
        std::fprintf(stderr, "gin-nvl-probe: GPU %d holds the wrong bytes from GPU %d\n", g, s);
        return 1;
      }
    }
  std::printf("every GPU received every peer's last row intact\n");
  return 0;
}
