// python/csrc/runtime.hpp — what the gin_ep extension's bindings (bindings.cpp,
// compiled with PyTorch's headers) call in runtime.cu (compiled with nvcc and
// gin's headers). Plain C++17: no torch, CUDA or gin types cross it, so each
// side compiles without the other's headers. Device memory crosses as Array
// (a pointer, its size and an owner that frees it stream-ordered when the
// last reference goes); streams as integers (cudaStream_t).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gin_ep_rt {

struct Array {
  void* ptr = nullptr;
  size_t count = 0;          // elements
  std::shared_ptr<void> keep;  // frees the memory when the last reference goes
};

// What a normal-mode dispatch returns.
struct Dispatched {
  Array x;                           // [N][H] bf16, or e4m3 bytes for an FP8 dispatch
  Array xScales;                     // FP8: [N][H / 128] float (else empty)
  Array topkIdx;                     // [N][K] int32, or int64 (idx64) as the caller's (empty: cached dispatch)
  bool idx64 = false;
  Array topkWeights;                 // [N][K] float (empty for a cached dispatch)
  std::vector<int> tokensPerExpert;  // [L]
  Array rankPrefix;                  // [R][R] int32 on the GPU: [i][j] rows rank j received from ranks 0..i
                                     // (DeepEP's rank_prefix_matrix)
  Array srcRank, srcToken;           // [N] int32 each
  std::shared_ptr<void> handle;      // gin's handle (combine and cached dispatch take it back)
};

// What a low-latency dispatch returns.
struct LlDispatched {
  Array x;         // [L][R * Tmax][H] bf16, or e4m3 bytes with useFp8
  Array xScales;   // useFp8: [L][H / 128][R * Tmax] float (DeepEP's layout; else empty)
  Array count;     // [L] int32
  Array range;     // [L][R] int64: begin << 32 | count
  Array srcToken;  // [L][R * Tmax] int32
  std::shared_ptr<void> handle;
};

class Runtime {
 public:
  // 128 bytes for the rendezvous, made on one rank and shipped to the others.
  static std::string uniqueId();

  // Collective over the nRanks processes: the communicator (gin's transport
  // choice per peer; GIN_TRANSPORT forces one), on CUDA device `device`.
  Runtime(const std::string& uniqueId, int rank, int nRanks, int device, bool lowLatency, int channels);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const;
  int nRanks() const;
  std::string transports() const;  // per peer: lsa, proxy or ibgda
  // Waits for the buffer's work and throws what an earlier call left
  // behind (calls return before their work is done).
  void synchronize();

  // Where returned device memory comes from (the bindings pass PyTorch's
  // allocator: Array::keep then owns a tensor). Unset: the buffer's pool.
  void setAllocator(std::function<Array(size_t bytes)> alloc);

  // Normal mode (device pointers on `stream`): x [T][H] bf16 (or e4m3
  // bytes when xScales [T][H / 128] float is given), idx [T][K] (-1: none;
  // int64 where idx64, else int32), weights [T][K] float.
  // worstTokens > 0: sync-free (DeepEP's num_worst_tokens): worstTokens rows
  // come back, padding after the received ones; the call returns once queued.
  Dispatched dispatch(uintptr_t stream, const void* x, const float* xScales, const void* idx, bool idx64,
                      const float* weights, int tokens, int hidden, int experts, int topk, int expertAlignment,
                      int worstTokens = 0);
  // x bf16, or e4m3 bytes when xScales is given.
  Dispatched cachedDispatch(uintptr_t stream, const void* x, const float* xScales, const std::shared_ptr<void>& handle);
  Array combine(uintptr_t stream, const void* y, const std::shared_ptr<void>& handle, const void* bias0,
                const void* bias1);

  // Low-latency mode: tokens at most maxTokens (the same on every rank).
  // useFp8: the tokens are quantized (gin/ep/fp8.hpp) and arrive as FP8.
  // idx: the top-k indices, int64 where idx64, else int32.
  // defer (DeepEP's return_recv_hook): the call queues its sends only;
  // receive() queues the rest (GpuBuffer's deferReceive).
  LlDispatched lowLatencyDispatch(uintptr_t stream, const void* x, const void* idx, bool idx64, int tokens,
                                  int maxTokens, int hidden, int experts, int topk, bool useFp8, bool defer = false);
  Array lowLatencyCombine(uintptr_t stream, const void* y, const void* idx, bool idx64, const float* weights,
                          const std::shared_ptr<void>& handle, bool defer = false);
  // The zero-copy combine buffer ([L][R * Tmax][H] bf16, GpuBuffer's
  // lowLatencyCombineBuffer) of the buffer that made `handle`; the buffer
  // owns it (Array::keep empty).
  Array lowLatencyCombineBuffer(const std::shared_ptr<void>& handle);
  // The hook of the last low-latency call given defer, on the caller's stream.
  void receive(uintptr_t stream);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace gin_ep_rt
