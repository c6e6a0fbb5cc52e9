// gin/ep/gpu_buffer.hpp — DeepEP's Buffer on a GPU rank: the calls of
// CpuBuffer (gin/ep/buffer.hpp) with device arrays in and out, run as
// kernels on the buffer's stream over the same device bodies (normal and
// low-latency modes; docs/ep.md).
//
//   gin::ep::GpuBuffer buf(comm, shape, /*lowLatency=*/false, stream);
//   gin::ep::GpuDispatched d = buf.dispatch(x, topkIdx, topkWeights, T);   // device pointers
//   // y[i] = experts(d.x[i]): one bf16 row per received row, on the GPU
//   gin::ep::DeviceArray<uint16_t> out = buf.combine(y, d.handle, bias0, bias1);
//
// A normal dispatch synchronizes once, as DeepEP's does to learn its
// receive count: after its plan, it opens with an all-gather of every
// rank's token count, first bad expert index, what each of its lanes sends
// and its (token, choice) pairs per expert, so a bad input or too many
// tokens fails every rank alike, each rank lays out its receive list on the
// host and knows its tokens per expert; then its kernels are queued and it
// returns. A combine returns once queued; it first waits (on the GPU) until
// every rank summed the combines before (Signals::summed). What goes wrong
// after the all-gather (a wait that gave up) is thrown by a later call or
// synchronize(). Nothing is reset between calls and no rank meets another
// at a barrier: the rings run on (Layer::ringPos), the combine signal is
// reset after each sum.
//
// A normal dispatch given worstTokens (DeepEP's num_worst_tokens), its
// combine and its cached dispatches return once queued: the count exchange
// and the receive list's layout run on the GPU, worstTokens rows come back
// (padding after the received ones), errors are thrown by a later call
// (syncFreeDispatch; docs/ep.md "Normal mode without a host").
//
// Low-latency calls return once their kernels are queued, as DeepEP's do:
// no host synchronization, no barrier, no reset. Signals count calls
// instead (Layer::llRounds: device words the last kernel of each call
// advances), the ring has two halves by dispatch parity, a combine's
// returns first wait until every rank summed the previous combine (one
// SignalAdd from each), and what goes wrong (a bad expert index, a wait
// that gave up) is thrown by the next call or synchronize(); docs/ep.md.
//
// Both modes plan the routing on the GPU (planKernel, llPlanKernel).
// Kernels of the buffer never spin while the caller's stream work between
// calls (its experts) runs. Where every peer is lsa, tokens are read from
// the caller's x (Layer::xDirect, no pack), and a rank's rows to itself go
// straight into its receive list (selfStep) and are summed from the
// combine's input where they are.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "gin/ep/buffer.hpp"
#include "gin/ep/gpu.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include <functional>
#include <memory>

namespace gin::ep {

// Where a GpuBuffer takes device memory for what it returns: `bytes` at
// *ptr, owned by the returned pointer (the memory lives until its last
// copy goes). Empty: the buffer's own pool (below). The PyTorch extension
// passes one that makes tensors with PyTorch's allocator.
using DeviceAllocator = std::function<std::shared_ptr<void>(size_t bytes, void** ptr)>;

namespace detail {
// A pinned host buffer per thread (made at its first use, freed when the
// thread ends) that DeviceArray::toHost copies through. A copy to pageable
// memory goes through the driver's staging, which the process's threads
// share: measured on H200 (CUDA 13), one thread's pageable device-to-host
// copy waiting on its stream behind a kernel holds another thread's back.
// Ranks that are threads of one process sharing a GPU then deadlock (until
// a wait times out) when a rank reads a result while its next call spins
// for a peer that is reading its own: every sync-free call does that.
class PinnedStage {
 public:
  static constexpr size_t kBytes = size_t(4) << 20;
  PinnedStage() = default;
  PinnedStage(const PinnedStage&) = delete;
  PinnedStage& operator=(const PinnedStage&) = delete;
  ~PinnedStage() {
    if (p_) (void)cudaFreeHost(p_);
  }
  char* get() {
    if (!p_) GIN_CUDA_CHECK(cudaHostAlloc(&p_, kBytes, cudaHostAllocDefault));
    return static_cast<char*>(p_);
  }

 private:
  void* p_ = nullptr;
};
inline PinnedStage& pinnedStage() {
  thread_local PinnedStage stage;
  return stage;
}

// A memory pool on the current device that keeps what is freed (release
// threshold at its maximum: no trim at a synchronization). A pool that
// trims (threshold 0, as the device's default pool) hung ranks sharing a
// GPU in a sync-free call (docs/ep.md, the returned arrays).
inline cudaMemPool_t makeKeepingPool() {
  int dev = 0;
  GIN_CUDA_CHECK(cudaGetDevice(&dev));
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  cudaMemPool_t pool = nullptr;
  GIN_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  uint64_t keep = ~0ull;
  const cudaError_t e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  if (e != cudaSuccess) (void)cudaMemPoolDestroy(pool);
  GIN_CUDA_CHECK(e);
  return pool;
}
}  // namespace detail

// n values of T in device memory (a DeviceAllocator's, or from the buffer's
// pool, freed stream-ordered by cudaFreeAsync on the buffer's stream, which
// must then outlive the array: no free waits for a running kernel, as
// cudaFree would). Copies share it.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(size_t n, const DeviceAllocator& alloc, cudaMemPool_t pool, cudaStream_t st) : n_(n), st_(st) {
    const size_t bytes = std::max<size_t>(n * sizeof(T), 16);
    void* p = nullptr;
    if (alloc) {
      keep_ = alloc(bytes, &p);
    } else {
      GIN_CUDA_CHECK(cudaMallocFromPoolAsync(&p, bytes, pool, st));
      keep_ = std::shared_ptr<void>(p, [st](void* q) { (void)cudaFreeAsync(q, st); });
    }
    p_ = static_cast<T*>(p);
  }
  // n T's at byte `offset` of `whole`'s memory, which they keep alive (one
  // allocation for several small arrays).
  template <class U>
  DeviceArray(const DeviceArray<U>& whole, size_t offset, size_t n)
      : keep_(whole.owner()), p_(reinterpret_cast<T*>(reinterpret_cast<char*>(whole.data()) + offset)), n_(n),
        st_(whole.stream()) {}
  T* data() const { return p_; }
  cudaStream_t stream() const { return st_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const std::shared_ptr<void>& owner() const { return keep_; }
  // The values on the host (waits for the stream), copied through this
  // thread's pinned buffer (detail::PinnedStage says why).
  std::vector<T> toHost() const {
    std::vector<T> v(n_);
    const size_t bytes = n_ * sizeof(T), chunk = detail::PinnedStage::kBytes;
    char* stage = bytes ? detail::pinnedStage().get() : nullptr;
    for (size_t at = 0; at < bytes; at += chunk) {
      const size_t k = std::min(chunk, bytes - at);
      const char* from = reinterpret_cast<const char*>(data()) + at;
      GIN_CUDA_CHECK(cudaMemcpyAsync(stage, from, k, cudaMemcpyDeviceToHost, st_));
      GIN_CUDA_CHECK(cudaStreamSynchronize(st_));
      std::memcpy(reinterpret_cast<char*>(v.data()) + at, stage, k);
    }
    GIN_CUDA_CHECK(cudaStreamSynchronize(st_));
    return v;
  }

 private:
  std::shared_ptr<void> keep_;
  T* p_ = nullptr;
  size_t n_ = 0;
  cudaStream_t st_ = nullptr;
};

// A normal dispatch that some rank brought more tokens to than the buffer
// holds (Shape::tokens): thrown on every rank at once, with the most tokens
// any rank brought, so that every rank can make a bigger buffer and call
// again (the PyTorch extension does).
struct CapacityError : std::length_error {
  int tokens;
  CapacityError(const std::string& what, int t) : std::length_error(what), tokens(t) {}
};

// A normal-mode dispatch's handle (DeepEP's handle): where each received row
// came from and goes back to, and what a cached dispatch repeats. A
// sync-free dispatch's (worstTokens > 0) has N = worstTokens rows, those
// past the received ones padding (source and token -1), and keeps on the
// GPU what the host does not know: the received rows and the receive
// list's layout (its host vectors stay empty). Both keep DeepEP's rank
// prefix matrix on the GPU.
struct GpuHandle {
  int tokens = 0;                   // T of the dispatch, on this rank
  std::vector<int> tokensFromRank;  // [R] rows received from each source (host)
  std::vector<int> receivedBy;      // [R][R] on the host: [j][i] rows rank j received from rank i
  DeviceArray<int> srcRank;         // [N] (-1: padding)
  DeviceArray<int> srcToken;        // [N] (-1: padding)
  DeviceArray<uint32_t> slot;       // [N] the row's combine slot at its source
  DeviceArray<int> rows;            // [T] rows each of this rank's tokens gets back
  uint64_t arrivals = 0;            // rows this rank's combine waits for
  DeviceArray<int32_t> topkIdx;     // [T][K] the dispatch's routing (a cached dispatch plans it again)
  DeviceArray<float> topkWeights;   // [T][K]
  std::vector<uint64_t> fromLane;   // [R][C] what each (source, channel) sent here
  DeviceArray<int> selfRow;         // [T] where this rank's token t sent to itself was received; -1: not sent
  bool syncFree = false;            // made by a sync-free dispatch: its combine and cached dispatch are too
  DeviceArray<unsigned long long> counts;  // sync-free: [2] rows received, rows this rank's combine waits for
  DeviceArray<int> rankPrefix;      // [R][R] DeepEP's rank prefix matrix ([i][j]: rows j got from 0..i)
  DeviceArray<char> layout;         // sync-free: the receive list's layout (RecvState per lane, then srcBase)
  size_t received() const { return srcRank.size(); }
};
// FP8 tokens on the GPU (gin/ep/fp8.hpp): data [T][H] e4m3, scales [T][H / 128].
struct Fp8Tokens {
  const uint8_t* data = nullptr;
  const float* scales = nullptr;
};
struct GpuDispatched {
  DeviceArray<uint16_t> x;           // [N][H] bf16: by source rank, then source token (empty with FP8)
  DeviceArray<uint8_t> xFp8;         // FP8 dispatch: [N][H] e4m3, same order
  DeviceArray<float> xScales;        // FP8 dispatch: [N][H / 128]
  DeviceArray<int32_t> topkIdx;      // [N][K] local expert, -1 elsewhere (empty: cached dispatch, int64 indices)
  DeviceArray<int64_t> topkIdx64;    // the same where the dispatch was given int64 indices (topkIdx then empty)
  DeviceArray<float> topkWeights;    // [N][K] 0 where topkIdx is -1 (empty: cached dispatch)
  std::vector<int> tokensPerExpert;  // [L] on the host, rounded up to the alignment (empty: cached, sync-free)
  GpuHandle handle;
};
// Low-latency mode: CpuBuffer's LlHandle with device arrays.
struct GpuLlHandle {
  int tokens = 0;
  DeviceArray<int> count;      // [L]
  DeviceArray<int64_t> range;  // [L][R] begin << 32 | count
  DeviceArray<int> srcToken;   // [L][R * Tmax]
  DeviceArray<int> srcK;       // [L][R * Tmax]
  DeviceArray<unsigned long long> arrivals;  // [1] rows this rank's combine waits for (the dispatch's end kernel)
};
struct GpuLlDispatched {
  DeviceArray<uint16_t> x;  // [L][R * Tmax][H] bf16; rows past count[e] are not written (empty with FP8)
  // useFp8: [L][R * Tmax][H] e4m3 and the scales at DeepEP's [L][H / 128][R * Tmax].
  DeviceArray<uint8_t> xFp8;
  DeviceArray<float> xScales;
  GpuLlHandle handle;
};

namespace gpu {

// x [T][H] bf16 into the x window's slots, tokenBytes apart; with
// l.shape.fp8 each token quantized to its FP8 row (a thread per group of 128).
__global__ void packKernel(Layer l, const uint16_t* x, int tokens) {
  const size_t H = size_t(l.shape.hidden);
  for (size_t t = blockIdx.x; t < size_t(tokens); t += gridDim.x) {
    char* row = static_cast<char*>(gin::localPointer(l.x, t * l.shape.tokenBytes()));
    if (l.shape.fp8)
      quantizeRow(x + t * H, H, row, threadIdx.x, blockDim.x);
    else
      gin::lsa::coopCopy(gin::CoopBlock{}, row, x + t * H, H * 2);
  }
}

// FP8 tokens into the x window's slots as their rows (e4m3, then scales).
__global__ void packFp8Kernel(Layer l, Fp8Tokens x, int tokens) {
  const size_t H = size_t(l.shape.hidden), G = H / kFp8Group;
  for (size_t t = blockIdx.x; t < size_t(tokens); t += gridDim.x) {
    joinFp8Row(gin::CoopBlock{}, static_cast<char*>(gin::localPointer(l.x, t * l.shape.tokenBytes())), x.data + t * H,
               x.scales + t * G, H);
  }
}

// Normal mode's plan on the GPU: planRouting's result for idx and weight
// [T][K] (T = l.shape.tokens), without the host. A block per channel c over
// its tokens [c x cap, (c + 1) x cap), a thread per token: its destination
// ranks m (bit d: a choice on rank d), rows[t] = |m|, the metadata of its
// j-th destination at meta[t][j], and t | j << 24 appended to lane (c, d)'s
// list in token order (a block-wide count per destination); sendCount per
// lane; *arrivals += rows. An index outside -1..E-1 sets *bad to 1 + its
// position (token x K + choice), the first one any thread saw (that choice
// goes nowhere); with `record` (a sync-free dispatch, which no host
// all-gather checks) it is also recorded as the communicator's error.
// `keep` (a dispatch that makes a handle): idx and weight copied into it,
// its selfRow set to -1 (launches the host need not queue), and with
// perExpert (a dispatch that synchronizes) block c counts its (token,
// choice) pairs per expert (in shared memory where E <= kPlanExperts, else
// in row c of perExpert [C][E]; nothing to zero before), for toHost: the
// opening all-gather hands every rank its tokens per local expert before
// the rows move.
// toHost (a dispatch that synchronizes: mapped pinned memory, read after
// the synchronization instead of copies queued behind the plan): block c
// writes its lane counts at [c][R], its pairs per expert (with perExpert)
// at C x R + [c][E], and the smallest bad index it saw (1 + token x K +
// choice; 0: none) at C x R + C x E + c.
struct PlanKeep {
  int32_t* idx = nullptr;  // [T][K]
  float* weight = nullptr;  // [T][K]
  int* selfRow = nullptr;  // [T]
  uint64_t* perExpert = nullptr;  // [C][E]
};
// The routing a plan reads (GpuBuffer::plan): the caller's, int32 or
// int64 (as torch.topk makes them), with what to keep of it, or (no idx)
// the handle's own.
struct Routing {
  const int32_t* idx = nullptr;
  const int64_t* idx64 = nullptr;
  const float* weight = nullptr;
  PlanKeep keep;
};
// A top-k index as an expert: -1 (no expert), 0..E-1, or kBadExpert for
// anything else (an int64 past int's range included).
constexpr int kBadExpert = -2;
constexpr int kPlanExperts = 1024;  // experts a plan block counts in shared memory
__device__ inline int expertOf(int64_t v, int E) { return v < -1 || v >= E ? kBadExpert : int(v); }
template <class Idx>
__global__ void planKernel(Layer l, const Idx* idx, const float* weight, char* meta, uint32_t* sendList,
                           uint64_t* sendCount, int* rows, unsigned long long* arrivals, unsigned long long* bad,
                           bool record, PlanKeep keep, uint64_t* toHost) {
  const Shape& sh = l.shape;
  const int R = sh.ranks, K = sh.topk, L = sh.localExperts(), E = sh.experts, c = int(blockIdx.x);
  const size_t cap = sh.laneCap(), D = size_t(sh.maxDests());
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
  __shared__ int warpCount[32];
  __shared__ uint32_t base[64];
  __shared__ unsigned long long counted[kPlanExperts];  // the block's pairs per expert, where E fits
  __shared__ unsigned long long firstBad;  // the smallest bad index the block saw, ~0: none
  unsigned long long* count = nullptr;
  if (threadIdx.x == 0) firstBad = ~0ull;
  if (keep.perExpert)
    count = E <= kPlanExperts ? counted : reinterpret_cast<unsigned long long*>(keep.perExpert + size_t(c) * E);
  for (int d = int(threadIdx.x); d < R; d += int(blockDim.x)) base[d] = 0;
  if (count)
    for (int e = int(threadIdx.x); e < E; e += int(blockDim.x)) count[e] = 0;
  __syncthreads();
  const size_t stop = size_t(c + 1) * cap < size_t(sh.tokens) ? size_t(c + 1) * cap : size_t(sh.tokens);
  const int first = int(size_t(c) * cap), end = int(stop);
  for (int t0 = first; t0 < end; t0 += int(blockDim.x)) {
    const int t = t0 + int(threadIdx.x);
    uint64_t m = 0;
    if (t < end) {
      // The token's choices and weights in registers, every load issued
      // before the first store (the stores may alias them).
      int ex[kMaxTopk];
      float w[kMaxTopk];
#pragma unroll
      for (int k = 0; k < kMaxTopk; ++k)
        if (k < K) {
          ex[k] = expertOf(int64_t(idx[size_t(t) * K + k]), E);
          w[k] = weight[size_t(t) * K + k];
        }
      if (keep.selfRow) keep.selfRow[t] = -1;
#pragma unroll
      for (int k = 0; k < kMaxTopk; ++k) {
        if (k >= K) continue;
        const int e = ex[k];
        if (keep.weight) keep.weight[size_t(t) * K + k] = w[k];
        if (keep.idx) keep.idx[size_t(t) * K + k] = e;
        if (e == kBadExpert) {
          ::atomicMin(&firstBad, 1ull + size_t(t) * K + k);
          if (::atomicCAS(bad, 0ull, 1ull + size_t(t) * K + k) == 0ull && record)
            gin::recordError(l.dc, gin::Op::BadArgument, -1, -1, uint64_t(t) * K + k, uint64_t(E),
                             uint64_t(int64_t(idx[size_t(t) * K + k])));
        } else if (e >= 0) {
          m |= 1ull << (e / L);
          if (count) ::atomicAdd(count + e, 1ull);
        }
      }
      rows[t] = __popcll(m);
      uint32_t j = 0;
      for (uint64_t left = m; left != 0; left &= left - 1, ++j) {
        const int d = __ffsll(static_cast<long long>(left)) - 1;
        TokenMeta* out = reinterpret_cast<TokenMeta*>(meta + (size_t(t) * D + j) * sh.metaBytes());
        uint32_t n = 0, choices = 0;
#pragma unroll
        for (int k = 0; k < kMaxTopk; ++k) {
          if (k >= K || ex[k] < 0 || ex[k] / L != d) continue;
          out->pick[n].localExpert = ex[k] % L;
          out->pick[n].weight = w[k];
          ++n;
          choices |= 1u << k;
        }
        out->srcToken = uint32_t(t);
        out->combineSlot = j;
        out->nLocal = n;
        out->choices = choices;
      }
    }
    // The block's rows to send, one atomic per warp (shuffles: sm_70 has
    // no __reduce_add_sync).
    unsigned sent = unsigned(__popcll(m));
    for (int o = 16; o > 0; o /= 2) sent += __shfl_xor_sync(~0u, sent, o);
    if (lane == 0 && sent != 0) ::atomicAdd(arrivals, static_cast<unsigned long long>(sent));
    for (int d = 0; d < R; ++d) {
      const bool hit = t < end && ((m >> d) & 1);
      const unsigned ballot = __ballot_sync(~0u, hit);
      if (lane == 0) warpCount[warp] = __popc(ballot);
      __syncthreads();
      int before = 0, total = 0;
      for (int i = 0; i < warps; ++i) {
        before += i < warp ? warpCount[i] : 0;
        total += warpCount[i];
      }
      if (hit) {
        const uint32_t j = uint32_t(__popcll(m & ((1ull << d) - 1)));
        const size_t at =
            (size_t(c) * R + size_t(d)) * cap + base[d] + size_t(before) + __popc(ballot & ((1u << lane) - 1));
        sendList[at] = uint32_t(t) | j << 24;
      }
      __syncthreads();
      if (threadIdx.x == 0) base[d] += uint32_t(total);
    }
  }
  __syncthreads();
  for (int d = int(threadIdx.x); d < R; d += int(blockDim.x)) sendCount[size_t(c) * R + size_t(d)] = base[d];
  if (!toHost) return;
  const size_t C = gridDim.x;
  for (int d = int(threadIdx.x); d < R; d += int(blockDim.x)) toHost[size_t(c) * R + size_t(d)] = base[d];
  if (count)
    for (int e = int(threadIdx.x); e < E; e += int(blockDim.x)) toHost[C * R + size_t(c) * E + size_t(e)] = count[e];
  if (threadIdx.x == 0) toHost[C * R + C * E + size_t(c)] = firstBad == ~0ull ? 0 : firstBad;
}

// Low-latency mode's plan on the GPU: planRouting's result for idx [T][K]
// (tokens T..Tmax-1 choose no expert), without the host. A block per expert
// e over the tokens in order, a thread per token: the (t, k) pairs with
// idx[t][k] == e, in (t, k) order, at sendList[e][p] = t | k << 24 (a
// block-wide scan of each chunk's counts), sendCount[e] of them; block 0
// sets *bad to 1 + the position (token x K + choice) of
// an index outside -1..E-1, the first one any thread saw (that choice goes
// nowhere), and records it as the communicator's error: every rank's waits
// end and every later call throws (GpuBuffer::raiseEarlier). (The meta
// window's {t, k} records are the same every call: the constructor writes
// them.)
template <class Idx>
__global__ void llPlanKernel(Layer l, const Idx* idx, int tokens, uint32_t* sendList, uint64_t* sendCount,
                             unsigned long long* bad) {
  const Shape& sh = l.shape;
  const int K = sh.topk, E = sh.experts, e = int(blockIdx.x), Tmax = sh.tokens;
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
  __shared__ uint32_t warpSum[32];
  uint32_t base = 0;  // pairs of e before this chunk
  for (int t0 = 0; t0 < Tmax; t0 += int(blockDim.x)) {
    const int t = t0 + int(threadIdx.x);
    uint32_t mine = 0;  // bit k: idx[t][k] == e
    if (t < tokens)
      for (int k = 0; k < K; ++k) {
        const int64_t x = int64_t(idx[size_t(t) * K + k]);
        if (x == e) mine |= 1u << k;
        if (e == 0 && (x < -1 || x >= E) && ::atomicCAS(bad, 0ull, 1ull + size_t(t) * K + k) == 0ull)
          gin::recordError(l.dc, gin::Op::BadArgument, -1, -1, uint64_t(t) * K + k, uint64_t(E), uint64_t(x));
      }
    // Exclusive scan of the pair counts over the chunk's threads.
    const uint32_t n = uint32_t(__popc(mine));
    uint32_t incl = n;
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t v = __shfl_up_sync(~0u, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) warpSum[warp] = incl;
    __syncthreads();
    uint32_t before = base + incl - n, chunk = 0;
    for (int i = 0; i < warps; ++i) {
      before += i < warp ? warpSum[i] : 0;
      chunk += warpSum[i];
    }
    for (uint32_t m = mine; m != 0; m &= m - 1)
      sendList[size_t(e) * size_t(Tmax) + before++] = uint32_t(t) | uint32_t(__ffs(int(m)) - 1) << 24;
    base += chunk;
    __syncthreads();  // warpSum is read before the next chunk writes it
  }
  if (threadIdx.x == 0) sendCount[e] = base;
}

// A thread per received position: its source (srcBase[r]: the first
// position from rank r), token, combine slot and top-k (local ids where the
// choice is here, -1 and weight 0 elsewhere; int64 where `wide`, else
// int32). With `received` (a sync-free dispatch: n is its worst case), rows
// from *received on are padding: source and token -1, every choice -1 with
// weight 0. With prefixFrom, block 0 also copies the [R][R] rank prefix
// matrix to prefixTo. Restrict: no output aliases the received metadata,
// so its loads need not wait for the stores before.
// Blocks of 64 threads, up to 4096 of them: 4096 rows on 64 SMs, not 16.
constexpr int kUnpackThreads = 64;
__global__ void unpackKernel(Layer l, int n, const uint64_t* __restrict__ srcBase, const char* __restrict__ recvMeta,
                             int* __restrict__ srcRank, int* __restrict__ srcToken, uint32_t* __restrict__ slot,
                             void* __restrict__ topkIdx, bool wide, float* __restrict__ topkW,
                             int* __restrict__ selfRow, const unsigned long long* __restrict__ received = nullptr,
                             const int* __restrict__ prefixFrom = nullptr, int* __restrict__ prefixTo = nullptr) {
  const int K = l.shape.topk, R = l.shape.ranks;
  if (prefixFrom && blockIdx.x == 0)
    for (int i = int(threadIdx.x); i < R * R; i += int(blockDim.x)) prefixTo[i] = prefixFrom[i];
  const auto choose = [&](size_t at, int e, float w) {
    if (wide)
      static_cast<int64_t*>(topkIdx)[at] = e;
    else
      static_cast<int32_t*>(topkIdx)[at] = e;
    topkW[at] = w;
  };
  const uint64_t real = received ? uint64_t(*received) : uint64_t(n);
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += int(gridDim.x * blockDim.x)) {
    if (uint64_t(i) >= real) {
      srcRank[i] = srcToken[i] = -1;
      slot[i] = 0;
      for (int k = 0; k < K; ++k) choose(size_t(i) * K + k, -1, 0.f);
      continue;
    }
    const TokenMeta* m = reinterpret_cast<const TokenMeta*>(recvMeta + size_t(i) * l.shape.metaBytes());
    int src = 0;
    while (src + 1 < R && srcBase[src + 1] <= uint64_t(i)) ++src;
    srcRank[i] = src;
    if (src == l.dc.rank) selfRow[m->srcToken] = i;
    srcToken[i] = int(m->srcToken);
    slot[i] = m->combineSlot;
    for (int k = 0; k < K; ++k) choose(size_t(i) * K + k, -1, 0.f);
    uint32_t choices = m->choices;
    for (uint32_t j = 0; j < m->nLocal; ++j, choices &= choices - 1) {
      const int k = __ffs(int(choices)) - 1;  // the j-th choice on this rank
      choose(size_t(i) * K + k, m->pick[j].localExpert, m->pick[j].weight);
    }
  }
}

// A block's count of the rows it returned to each source, then one
// SignalAdd per source (rowsReturned) once the block is done, instead of
// an atomic per row on the source's one combine word, which the rows of
// every rank hit at once (on 4 H200s: low-latency combine 25% faster,
// normal combine no faster; docs/ep.md).
struct ReturnCounts {
  uint32_t* n;  // [ranks] in shared memory
  __device__ void zero(int ranks) {
    for (int d = int(threadIdx.x); d < ranks; d += int(blockDim.x)) n[d] = 0;
    __syncthreads();
  }
  __device__ void add(int src) {
    if (threadIdx.x % 32 == 0) ::atomicAdd(n + src, 1u);
  }
  __device__ void signal(const Layer& l, int ctx) {
    __syncthreads();
    for (int d = 0; d < l.shape.ranks; ++d)
      if (n[d] != 0) rowsReturned(l, d, n[d], ctx, gin::CoopBlock{});
  }
};

// A warp per row: row i of y back to its source (returnRow), the block's
// rows counted per source and signalled at its end, all on one context;
// the rows in staggered order (staggeredRow: the list is grouped by source).
// Rows from this rank itself stay where they are (the sum reads them in y);
// padding rows (source -1, a sync-free dispatch's) go nowhere.
__global__ void returnKernel(Layer l, int n, const int* srcRank, const int* srcToken, const uint32_t* slot,
                             const uint16_t* y) {
  __shared__ uint32_t counts[64];
  ReturnCounts rc{counts};
  rc.zero(l.shape.ranks);
  const int ctx = int(blockIdx.x) % l.dc.nContexts;
  const size_t H = size_t(l.shape.hidden), warps = size_t(gridDim.x) * (blockDim.x / 32);
  for (size_t k = size_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; k < size_t(n); k += warps) {
    const size_t i = staggeredRow(k, size_t(n), l.dc.rank, l.shape.ranks);
    if (srcRank[i] == l.dc.rank || srcRank[i] < 0) continue;
    returnRow(l, srcRank[i], combineRowOffset(l.shape, size_t(srcToken[i]), slot[i]), i, y + i * H, ctx, gin::None{},
              gin::CoopWarp{});
    rc.add(srcRank[i]);
  }
  rc.signal(l, ctx);
}

// A block per token t < tokens: out[t] = sumRows of its rows in this rank's
// combine window (`stride` rows per token; rows[t] of them, or all where
// rows is null), with the optional top-k skip and weights and biases.
// self.row non-null (normal combine): the row of a token sent to this rank
// itself is read in y at self.row[t], its slot self.slot[that row].
struct SelfRows {
  const int* row = nullptr;
  const uint32_t* slot = nullptr;
  const uint16_t* y = nullptr;
};
__global__ void sumKernel(Layer l, int tokens, int stride, const int* rows, const int32_t* idx, const float* weight,
                          const uint16_t* bias0, const uint16_t* bias1, uint16_t* out, SelfRows self) {
  const size_t H = size_t(l.shape.hidden), S = size_t(stride);
  const auto* comb = static_cast<const uint16_t*>(gin::localPointer(l.combine, 0));
  for (size_t t = blockIdx.x; t < size_t(tokens); t += gridDim.x) {
    const int at = self.row ? self.row[t] : -1, n = rows ? rows[t] : stride;
    // A token with one row that it sent to this rank itself: that row's
    // slot is 0 (no load of it before the row's loads).
    const int swap = at < 0 ? -1 : n == 1 ? 0 : int(self.slot[at]);
    sumRows(comb + t * S * H, H, n, idx ? idx + t * S : nullptr, weight ? weight + t * S : nullptr,
            bias0 ? bias0 + t * H : nullptr, bias1 ? bias1 + t * H : nullptr, out + t * H, gin::CoopBlock{}, swap,
            at < 0 ? nullptr : self.y + size_t(at) * H);
  }
}

// Low-latency mode: for each (local expert el, source src), a block (the
// grid strides over the pairs: GpuBuffer::spinningGrid) waits for the
// counts of sources 0..src for el (llWaitDispatch's signals, a thread
// each), then packs src's rows into x [el][R * Tmax]
// after the rows of the sources before it (FP8: into xFp8, and the scales
// into xScales [el][H / 128][R * Tmax]), with their token and choice, and
// the layout range; the block of the last source writes the expert's
// count. A wait that gives up leaves an empty range and count (the
// combine then returns nothing, and the next call throws). No outputs
// (range null): the waits only, which end the round.
__device__ void llUnpackPair(const Layer& l, int pair, uint16_t* x, uint8_t* xFp8, float* xScales, int* count,
                             int64_t* range, int* srcToken, int* srcK, int* failed) {
  const Shape& sh = l.shape;
  const int R = sh.ranks, el = pair / R, src = pair % R;
  const size_t H = size_t(sh.hidden), Tmax = size_t(sh.tokens);
  const uint64_t round = llRound(l);
  __shared__ int arrived;
  __syncthreads();  // the previous pair's threads have read `arrived`
  if (threadIdx.x == 0) arrived = 1;
  __syncthreads();
  if (int(threadIdx.x) <= src &&
      !gin::Net<>(l.dc, 0).waitSignal(gin::CoopThread{}, l.sig.llCount(el, int(threadIdx.x)), llCountsDone(l, round))) {
    arrived = 0;
    ::atomicAdd(failed, 1);
  }
  __syncthreads();
  if (range == nullptr) return;  // no outputs: the round's waits only
  if (!arrived) {
    if (threadIdx.x == 0) {
      range[pair] = 0;
      if (src == R - 1) count[el] = 0;
    }
    return;
  }
  const auto* counts = static_cast<const uint64_t*>(gin::localPointer(l.counts, llCountAt(sh, round, el, 0)));
  uint64_t begin = 0;
  for (int s = 0; s < src; ++s) begin += gin::volatileLoad(counts + s);
  const uint64_t n = gin::volatileLoad(counts + src);
  if (threadIdx.x == 0) {
    range[size_t(el) * R + size_t(src)] = int64_t(begin << 32 | n);
    if (src == R - 1) count[el] = int(begin + n);
  }
  const size_t warps = blockDim.x / 32;
  for (size_t q = threadIdx.x / 32; q < n; q += warps) {
    const char* s = static_cast<const char*>(gin::localPointer(l.ring, llSlot(sh, round, el, src, q)));
    const size_t row = size_t(el) * size_t(R) * Tmax + size_t(begin) + q;
    if (threadIdx.x % 32 == 0) {
      srcToken[row] = int(gin::volatileLoad(reinterpret_cast<const uint32_t*>(s)));
      srcK[row] = int(gin::volatileLoad(reinterpret_cast<const uint32_t*>(s) + 1));
    }
    if (sh.fp8) {  // e4m3 to its row, scale g to llScaleAt
      gin::lsa::coopCopy(gin::CoopWarp{}, xFp8 + row * H, s + 16, H);
      for (size_t g = threadIdx.x % 32; g < H / kFp8Group; g += 32)
        memcpy(xScales + llScaleAt(sh, el, g, size_t(begin) + q), s + 16 + H + g * 4, 4);
    } else {
      gin::lsa::coopCopy(gin::CoopWarp{}, x + row * H, s + 16, H * 2);
    }
  }
}

__global__ void llUnpackKernel(Layer l, uint16_t* x, uint8_t* xFp8, float* xScales, int* count, int64_t* range,
                               int* srcToken, int* srcK, int* failed) {
  for (int pair = int(blockIdx.x); pair < l.shape.localExperts() * l.shape.ranks; pair += int(gridDim.x))
    llUnpackPair(l, pair, x, xFp8, xScales, count, range, srcToken, srcK, failed);
}

// `split` blocks per (local expert, source), a warp per packed row: row q of
// that pair's range back to its source at (token, choice); each block
// signals its rows once (ReturnCounts). First, the source has summed its
// previous combines (its llSummed at the combines this rank finished,
// rounds[1]): no row lands in a combine window still being read.
__global__ void llReturnKernel(Layer l, int split, const int64_t* range, const int* srcToken, const int* srcK,
                               const uint16_t* y, int* failed) {
  const Shape& sh = l.shape;
  const int R = sh.ranks, pair = int(blockIdx.x) / split, el = pair / R, src = pair % R;
  const size_t H = size_t(sh.hidden), Tmax = size_t(sh.tokens);
  const uint64_t r = uint64_t(range[pair]), begin = r >> 32, n = r & 0xffffffffu;
  const size_t parts = size_t(split) * (blockDim.x / 32);
  const int ctx = int(blockIdx.x) % l.dc.nContexts;
  __shared__ uint32_t counts[64];
  __shared__ int summed;
  if (threadIdx.x == 0) {  // nothing after a failed wait: the next call throws
    summed = *failed == 0 &&
             gin::Net<>(l.dc, ctx).waitSignal(gin::CoopThread{}, l.sig.llSummed(src), uint64_t(l.llRounds[1]));
    if (!summed) ::atomicAdd(failed, 1);
  }
  ReturnCounts rc{counts};
  rc.zero(R);  // syncs the block: summed is read after it
  if (!summed) return;
  for (size_t q = size_t(blockIdx.x % split) * (blockDim.x / 32) + threadIdx.x / 32; q < n; q += parts) {
    const size_t row = size_t(el) * size_t(R) * Tmax + size_t(begin) + q;
    returnRow(l, src, llRowOffset(sh, size_t(srcToken[row]), size_t(srcK[row])), row, y + row * H, ctx, gin::None{},
              gin::CoopWarp{});
    rc.add(src);
  }
  rc.signal(l, ctx);
}

// Low-latency combine: each block waits until this call's rows are here
// (the combine signal at the rows earlier combines summed, rounds[2], plus
// *arrivals), then sumKernel's sums with the top-k indices and weights;
// nothing after a failed wait (the next call throws).
template <class Idx>
__global__ void llSumKernel(Layer l, int tokens, const unsigned long long* arrivals, const Idx* idx,
                            const float* weight, uint16_t* out, int* failed) {
  __shared__ int here;
  if (threadIdx.x == 0) {
    here = *failed == 0 && gin::Net<>(l.dc, 0).waitSignal(gin::CoopThread{}, l.sig.combine(),
                                                          uint64_t(l.llRounds[2]) + uint64_t(*arrivals));
    if (!here) ::atomicAdd(failed, 1);
  }
  __syncthreads();
  if (!here) return;
  const size_t H = size_t(l.shape.hidden), K = size_t(l.shape.topk);
  const auto* comb = static_cast<const uint16_t*>(gin::localPointer(l.combine, 0));
  for (size_t t = blockIdx.x; t < size_t(tokens); t += gridDim.x)
    sumRows(comb + t * K * H, H, int(K), idx + t * K, weight + t * K, nullptr, nullptr, out + t * H,
            gin::CoopBlock{});
}

// ---- normal mode without the host (a dispatch given worstTokens) ----------

// Normal mode's device words (GpuBuffer): {sync-free dispatches, combines}
// this rank has queued before, advanced by the kernels that end them (so a
// call replayed from a CUDA graph counts as a call).
struct NormalRounds {
  unsigned long long dispatches, combines;
};

// This round's counts (round: the sync-free dispatches before, the same
// on every rank) to every rank d: the C lane counts to d, then the rows this
// rank sends each rank (countsAt, half round % 2), then a SignalAdd of 1 on
// d's Signals::sfCount of this rank (after a block barrier, same context as
// the putValues: it follows them, as in countKernel). A half is written
// again two rounds later, only after every rank's counts of the round
// between arrived, which each rank sends after it read this round's; a
// rank is at most one round ahead of a reader, so a signal per source
// marks its round's counts here.
__global__ void sfCountKernel(Layer l, const NormalRounds* rounds) {
  __shared__ uint64_t rowsTo[64];
  const uint64_t round = rounds->dispatches;
  const int R = l.shape.ranks, C = l.shape.channels;
  const gin::Team world = gin::teamWorld(l.dc);
  gin::Net<> net(l.dc, 0);
  for (int d = int(threadIdx.x); d < R; d += int(blockDim.x)) {
    uint64_t n = 0;
    for (int c = 0; c < C; ++c) n += l.sendCount[size_t(c) * R + size_t(d)];
    rowsTo[d] = n;
  }
  __syncthreads();
  const size_t at = countsAt(l.shape, int(round % 2), l.dc.rank);
  for (int i = int(threadIdx.x); i < R * (C + R); i += int(blockDim.x)) {
    const int d = i / (C + R), j = i % (C + R);
    const uint64_t v = j < C ? l.sendCount[size_t(j) * R + size_t(d)] : rowsTo[j - C];
    net.putValue(world, d, l.counts, at + size_t(j) * 8, v, gin::None{});
  }
  __syncthreads();
  for (int d = int(threadIdx.x); d < R; d += int(blockDim.x))
    net.signal(world, d, gin::SignalAdd{l.sig.sfCount(l.dc.rank), 1});
}

// This round's receive list without the host (a block: thread 0 advances
// rounds->dispatches, threads < R wait for source r's counts, then every
// thread lays out its share of the R x C lanes, a block-wide scan at a
// time), as GpuBuffer::layOut does on the host (rs[src][c] = {count,
// base}, srcBase[R + 1]), rows past `worst` taken out of the rings but not
// kept (RecvState::keep). Then *received = the rows kept, prefix [R][R] =
// DeepEP's rank prefix matrix ([i][j]: rows rank j receives from ranks
// 0..i), *arrivals = the rows this rank's combine gets back (*sent, every
// row it sends, less those to itself). More rows than `worst`: status[2] =
// their number and the communicator's error (every rank's waits end; every
// later call throws). Last, the whole layout (rs, then srcBase right
// after it) is copied into `copy` (the handle's), `bytes` of it.
__global__ void sfLayoutKernel(Layer l, NormalRounds* rounds, uint64_t worst, RecvState* rs, uint64_t* srcBase,
                               unsigned long long* received, int* prefix, const unsigned long long* sent,
                               unsigned long long* arrivals, int* failed, volatile unsigned long long* status,
                               void* copy, size_t bytes) {
  __shared__ uint64_t round;
  __shared__ int ok;
  const int R = l.shape.ranks, C = l.shape.channels, me = l.dc.rank, tid = int(threadIdx.x);
  if (tid == 0) {
    round = rounds->dispatches++;
    ok = 1;
  }
  __syncthreads();
  if (tid < R && !gin::Net<>(l.dc, 0).waitSignal(gin::CoopThread{}, l.sig.sfCount(tid), round + 1)) ok = 0;
  __syncthreads();
  // Not ok: nothing is received (every count 0): the rings' waits end too.
  if (tid == 0 && !ok) ::atomicAdd(failed, 1);
  const auto word = [&](int src, int j) -> uint64_t {
    if (!ok) return 0;
    const size_t at = countsAt(l.shape, int(round % 2), src) + size_t(j) * 8;
    return gin::volatileLoad(static_cast<const uint64_t*>(gin::localPointer(l.counts, at)));
  };
  const uint64_t total = layOutLanes(R * C, C, [&](int i) { return word(i / C, i % C); }, rs, srcBase, worst);
  for (int j = tid; j < R; j += int(blockDim.x))
    for (int i = 0, sum = 0; i < R; ++i) prefix[i * R + j] = sum += int(word(i, C + j));
  if (tid == 0) {
    const uint64_t own = (me + 1 < R ? srcBase[me + 1] : total) - srcBase[me];
    srcBase[R] = total;
    *received = total < worst ? total : worst;
    *arrivals = ok ? *sent - own : 0;
    if (total > worst) {
      status[2] = total;
      gin::recordError(l.dc, gin::Op::BadArgument, -1, -1, round, total, worst);
    }
  }
  __syncthreads();
  gin::lsa::coopCopy(gin::CoopBlock{}, copy, rs, bytes);
}

// A combine's first kernel: waits until every rank summed this buffer's
// earlier combines (each rank's Signals::summed at their number), so no returned row
// lands in a combine window a rank still sums from (two dispatches then
// their combines, or a handle combined twice, need it).
__global__ void summedWaitKernel(Layer l, const NormalRounds* rounds, int* failed) {
  gin::Net<> net(l.dc, 0);
  for (int src = 0; src < l.shape.ranks; ++src)
    if (!net.waitSignal(gin::CoopThread{}, l.sig.summed(src), rounds->combines)) {
      ::atomicAdd(failed, 1);
      return;
    }
}

// The start of a call's last kernel, a block (of 64 threads) per context:
// with `tell`, block 0's first threads add 1 to `signal` at every rank (a
// thread per rank, at most 64); then every context is flushed. True on the
// one thread (block 0's first) that goes on to the call's words.
__device__ bool endOfCall(const Layer& l, bool tell, uint32_t signal) {
  gin::Net<> net(l.dc, int(blockIdx.x));
  if (blockIdx.x == 0 && tell && int(threadIdx.x) < l.shape.ranks)
    net.signal(gin::teamWorld(l.dc), int(threadIdx.x), gin::SignalAdd{signal, 1}, gin::CoopThread{});
  __syncthreads();
  if (threadIdx.x != 0) return false;
  net.flush(gin::CoopThread{});
  return blockIdx.x == 0;
}

// A normal call's last kernel, a block (of 64 threads) per context: after
// a combine (`summed`), its combine signal reset, then a SignalAdd of 1 on
// every rank's Signals::summed of this rank (whose release covers the
// reset: a peer returns rows for the next combine only after it saw that)
// and rounds->combines advanced; every context flushed (the sources of its
// puts may be written again); the outcome words to host memory, `status`,
// kept once set (a later call that goes well hides nothing) for
// GpuBuffer::raiseEarlier.
__global__ void endKernel(Layer l, bool summed, NormalRounds* rounds, const int* failed,
                          const unsigned long long* bad, volatile unsigned long long* status) {
  if (summed && blockIdx.x == 0 && threadIdx.x == 0) gin::Net<>(l.dc, 0).resetSignal(l.sig.combine());
  __syncthreads();
  if (!endOfCall(l, summed, l.sig.summed(l.dc.rank))) return;
  if (summed) rounds->combines += 1;
  if (*failed) status[0] = static_cast<unsigned long long>(*failed);
  if (bad && *bad && !status[1]) status[1] = *bad;
}

// A sync-free call that cannot go on (bad input found on the host, an
// allocation that threw): recorded as the communicator's error (every
// rank's waits end; every later call throws).
__global__ void failKernel(Layer l, gin::Op op, uint64_t value, uint64_t limit) {
  gin::recordError(l.dc, op, -1, -1, 0, value, limit);
}

// A low-latency call's last kernel, a block (of 64 threads) per context:
// every context flushed (the sources of its puts, the x window and partial,
// may be written again), and on block 0 the round words advanced: `which` 0 after a
// dispatch, which also sets *arrivals to the pairs it sent (the rows its
// combine gets back); 1 after a combine, which adds them to rounds[2] and
// tells every rank (SignalAdd of 1 on its llSummed of this rank) that its sum is done. Then
// the outcome words (failed waits, bad index) to host memory, `status`,
// for a later GpuBuffer::raiseEarlier. Every earlier kernel of the call has
// ended, so none reads a word moving.
__global__ void llEndKernel(Layer l, unsigned long long* rounds, int which, unsigned long long* arrivals,
                            const int* failed, const unsigned long long* bad, volatile unsigned long long* status) {
  if (!endOfCall(l, which == 1, l.sig.llSummed(l.dc.rank))) return;
  rounds[which] += 1;
  if (which == 0) {
    unsigned long long pairs = 0;
    for (int e = 0; e < l.shape.experts; ++e) pairs += l.sendCount[e];
    *arrivals = pairs;
  } else {
    rounds[2] += *arrivals;
  }
  status[0] = static_cast<unsigned long long>(*failed);
  status[1] = *bad;
}

}  // namespace gpu

// GIN_EP_TIMING=N: rank 0 prints the phases of every Nth call of a buffer,
// host wall time between marks in microseconds (a mark after a stream
// synchronization times the GPU work before it).
class PhaseClock {
 public:
  explicit PhaseClock(int rank) : every_(rank == 0 ? gin::env::integer("GIN_EP_TIMING").value_or(0) : 0) {}
  void start(const char* call) {
    on_ = every_ > 0 && ++calls_ % every_ == 0;
    if (!on_) return;
    call_ = call;
    text_.clear();
    first_ = last_ = Clock::now();
  }
  void mark(const char* phase) {
    if (!on_) return;
    const auto t = Clock::now();
    text_ += std::string(" ") + phase + " " + std::to_string(us(last_, t));
    last_ = t;
  }
  void end() {
    if (!on_) return;
    std::fprintf(stderr, "gin_ep rank 0 %s (call %lld): %lld us:%s\n", call_, calls_, us(first_, last_), text_.c_str());
    on_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  long long every_, calls_ = 0;
  bool on_ = false;
  const char* call_ = "";
  std::string text_;
  Clock::time_point first_, last_;
  static long long us(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration_cast<std::chrono::microseconds>(b - a).count();
  }
};

// Byte offsets of several arrays in one allocation, each 256-byte aligned.
struct Parts {
  size_t bytes = 0;
  template <class T>
  size_t add(size_t n) {
    const size_t at = bytes;
    bytes += (n * sizeof(T) + 255) / 256 * 256;
    return at;
  }
};

class GpuBuffer {
 public:
  static constexpr int kThreads = 256;
  static_assert(kThreads >= 64, "llUnpackKernel has a thread per source rank (at most 64)");

  // As CpuBuffer's: shape.tokens is the most tokens a call may bring (the
  // same on every rank); lowLatency picks the mode. shape.channels or
  // shape.slots 0: chosen for this GPU (gpu::autoShape). The buffer's kernels,
  // copies and allocations run on `stream`, which must outlive the buffer
  // and every array it returned. Collective.
  GpuBuffer(gin::Comm& comm, const Shape& shape, bool lowLatency, cudaStream_t stream, uint32_t sigBase = 0)
      : comm_(comm),
        maxTokens_(shape.tokens),
        ll_(lowLatency),
        st_(stream),
        l_(openLayer(comm, gpu::autoShape(comm, shape), lowLatency, sigBase)) {
    const Shape& sh = l_.shape;
    const size_t T = size_t(sh.tokens), R = size_t(sh.ranks), C = size_t(sh.channels), E = size_t(sh.experts);
    pool_ = detail::makeKeepingPool();
    // Pinned and mapped: the host's words, the low-latency status, what the
    // plan writes for the host (hostCounts()), the receive list's layout
    // and rank prefix matrix (uploaded, as layout_).
    GIN_CUDA_CHECK(cudaHostAlloc(&host_, hostBytes(), cudaHostAllocMapped));
    std::memset(host_, 0, hostBytes());
    void* status = nullptr;
    GIN_CUDA_CHECK(cudaHostGetDevicePointer(&status, hostWord(4), 0));
    llStatus_ = static_cast<unsigned long long*>(status);
    void* counts = nullptr;
    GIN_CUDA_CHECK(cudaHostGetDevicePointer(&counts, hostCounts(), 0));
    hostCountsOnGpu_ = static_cast<uint64_t*>(counts);
    layout_ = alloc(layoutBytes() + prefixBytes());
    rs_ = static_cast<RecvState*>(layout_);
    for (int r = 0; r < comm.nRanks(); ++r) allLsa_ = allLsa_ && comm.transportTo(r) == gin::Transport::Lsa;
    sendList_ = static_cast<uint32_t*>(alloc(std::max<size_t>(std::max(C * R * sh.laneCap(), E * T) * 4, 4)));
    // Normal mode: lane counts [C][R], then the plan's pairs per expert [C][E] (sentPerExpert()).
    sendCount_ = static_cast<uint64_t*>(alloc((std::max(C * R, E) + C * E) * 8));
    if (!ll_) {
      recvMeta_ = static_cast<char*>(alloc(std::max<size_t>(R * T * sh.metaBytes(), 4)));
      ringPos_ = static_cast<uint64_t*>(alloc(2 * R * C * 8));
      l_.ringPos = ringPos_;
      normalRounds_ = static_cast<gpu::NormalRounds*>(alloc(sizeof(gpu::NormalRounds)));
    } else {
      rounds_ = static_cast<unsigned long long*>(alloc(32));
      l_.llRounds = rounds_;
      // The {t, k} record (16 bytes) of every (token, choice) that
      // llDispatchExpert puts before its token: the same every call.
      const size_t K = size_t(sh.topk);
      std::vector<uint32_t> tk(T * K * 4, 0);
      for (size_t i = 0; i < T * K; ++i) {
        tk[4 * i] = uint32_t(i / K);
        tk[4 * i + 1] = uint32_t(i % K);
      }
      GIN_CUDA_CHECK(
          cudaMemcpyAsync(comm_.localPointer(l_.meta), tk.data(), tk.size() * 4, cudaMemcpyHostToDevice, st_));
      GIN_CUDA_CHECK(cudaStreamSynchronize(st_));
    }
    l_.sendList = sendList_;
    l_.sendCount = sendCount_;
    gpu::loadKernels();
    cudaFuncAttributes a{};
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::packKernel));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::packFp8Kernel));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::planKernel<int32_t>));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::planKernel<int64_t>));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::unpackKernel));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::returnKernel));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::sumKernel));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::llPlanKernel<int32_t>));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::llPlanKernel<int64_t>));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::llUnpackKernel));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::llReturnKernel));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::llSumKernel<int32_t>));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::llSumKernel<int64_t>));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::llEndKernel));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::sfCountKernel));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::sfLayoutKernel));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::summedWaitKernel));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::endKernel));
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, gpu::failKernel));
    z_ = gpu::sizing(comm, sh, lowLatency, kThreads);
    // Signals only grow in both modes (normal mode: the rings' heads and
    // tails, the count exchange's and Signals::summed; the combine signal is
    // reset after each sum), so a buffer made again on this communicator (a
    // new shape; the last one's destructor waited for its kernels on every
    // rank) starts them from zero on every rank, with the round, ring and
    // outcome words (set on this stream: the allocations' cudaMemset ran on
    // the legacy one), before any rank signals.
    if (ll_) {
      GIN_CUDA_CHECK(cudaMemsetAsync(rounds_, 0, 32, st_));
    } else {
      GIN_CUDA_CHECK(cudaMemsetAsync(ringPos_, 0, 2 * R * C * 8, st_));
      GIN_CUDA_CHECK(cudaMemsetAsync(normalRounds_, 0, sizeof(gpu::NormalRounds), st_));
    }
    GIN_CUDA_CHECK(cudaMemsetAsync(mem_.word(0), 0, 32, st_));
    gpu::resetKernel<<<1, 256, 0, st_>>>(l_, l_.sig.base, l_.sig.base + signalsNeeded(l_.shape));
    GIN_CUDA_CHECK(cudaGetLastError());
    GIN_CUDA_CHECK(cudaStreamSynchronize(st_));
    comm_.bootstrap().barrier();
  }
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;
  ~GpuBuffer() {
    (void)cudaStreamSynchronize(st_);
    (void)cudaFreeHost(host_);
    (void)cudaMemPoolDestroy(pool_);  // deferred until the arrays it gave out are freed
    closeLayer(comm_, l_);            // prints, never throws
  }

  Shape shape() const {
    Shape s = l_.shape;
    s.tokens = maxTokens_;
    return s;
  }

  // An array of n T's (the allocator's, else from the buffer's pool) on its stream.
  template <class T>
  DeviceArray<T> deviceArray(size_t n) const {
    return DeviceArray<T>(n, alloc_, pool_, st_);
  }

  // Where arrays the buffer returns come from from now on (empty: its pool).
  void setAllocator(DeviceAllocator a) { alloc_ = std::move(a); }

  // CpuBuffer::dispatch with device arrays: x [T][H] bf16, topkIdx and
  // topkWeights [T][K] (T at most shape().tokens; ranks may differ; the
  // indices int32 or int64, as PyTorch's topk makes them). Every call of
  // the buffer returns once its work is queued on the buffer's stream
  // (this one after one synchronization, for its receive count): what it
  // reads (x, indices, weights; a combine's y and biases; a handle's
  // arrays) must stay as they are until the stream has run it.
  //
  // worstTokens > 0 (DeepEP's num_worst_tokens; every rank passes one):
  // the dispatch runs without the host and returns once queued (see
  // syncFreeDispatch): worstTokens rows come back, the received ones first,
  // then padding (top-k -1, weight 0, source -1); tokensPerExpert and the
  // handle's host vectors stay empty, its combine and cached dispatch run
  // without the host too, and what goes wrong is thrown by a later call or
  // synchronize().
  template <class Idx>
  GpuDispatched dispatch(const uint16_t* x, const Idx* topkIdx, const float* topkWeights, int tokens,
                         int expertAlignment = 1, int worstTokens = 0) {
    return dispatchTokens(x, Fp8Tokens{}, routing(topkIdx, topkWeights), tokens, expertAlignment, worstTokens);
  }
  // The same with FP8 tokens (every rank passes FP8): the rows come back as
  // xFp8 and xScales, byte for byte (x stays empty).
  template <class Idx>
  GpuDispatched dispatch(Fp8Tokens x, const Idx* topkIdx, const float* topkWeights, int tokens,
                         int expertAlignment = 1, int worstTokens = 0) {
    return dispatchTokens(nullptr, x, routing(topkIdx, topkWeights), tokens, expertAlignment, worstTokens);
  }

 private:
  template <class Idx>
  static gpu::Routing routing(const Idx* topkIdx, const float* topkWeights) {
    static_assert(std::is_same_v<Idx, int32_t> || std::is_same_v<Idx, int64_t>, "top-k indices are int32 or int64");
    gpu::Routing r;
    if constexpr (std::is_same_v<Idx, int64_t>)
      r.idx64 = topkIdx;
    else
      r.idx = topkIdx;
    r.weight = topkWeights;
    return r;
  }

  GpuDispatched dispatchTokens(const uint16_t* x, Fp8Tokens f, gpu::Routing from, int tokens, int expertAlignment,
                               int worstTokens) {
    const Shape& sh = l_.shape;
    const size_t L = size_t(sh.localExperts());
    const bool fp8 = f.data != nullptr;
    raiseEarlier();  // what earlier sync-free calls left
    if (expertAlignment < 1) throw std::invalid_argument("ep: expertAlignment must be >= 1");
    if (worstTokens > 0) return syncFreeDispatch(x, f, from, tokens, worstTokens);
    if (worstTokens < 0) throw std::invalid_argument("ep: worstTokens must be >= 0 (0: the dispatch synchronizes)");
    // Too many tokens: the all-gather every other rank makes in begin()
    // (the same sizes) throws CapacityError on every rank.
    if (tokens > maxTokens_ && !ll_) agreeStart(tokens, 0, startWords());
    checkCall(false, tokens, "dispatch");
    checkFp8Hidden(fp8, l_.shape.hidden, "dispatch");
    clock_.start("dispatch");
    setCall(tokens, x, f);
    GpuDispatched d;
    GpuHandle& h = d.handle;
    keepRouting(h, tokens);
    // Every rank's lane counts came with the opening all-gather: what each
    // (source, channel) sends here lays out the receive list.
    const std::vector<uint64_t> all = startPlanned(x, f, h, kept(from, h, true));
    const size_t R = size_t(sh.ranks), C = size_t(sh.channels), me = size_t(comm_.rank()), W = startWords();
    const auto sent = [&](size_t src, size_t c, size_t dst) { return all[src * W + c * R + dst]; };
    h.fromLane.assign(R * C, 0);
    // What every rank receives from every rank (DeepEP's rank prefix matrix
    // is made from it; row `me` is this rank's tokensFromRank).
    h.receivedBy.assign(R * R, 0);
    for (size_t src = 0; src < R; ++src)
      for (size_t c = 0; c < C; ++c) {
        h.fromLane[src * C + c] = sent(src, c, me);
        for (size_t j = 0; j < R; ++j) h.receivedBy[j * R + src] += int(sent(src, c, j));
      }
    h.tokensFromRank.assign(h.receivedBy.begin() + std::ptrdiff_t(me * R),
                            h.receivedBy.begin() + std::ptrdiff_t((me + 1) * R));
    // This rank's tokens per local expert: every rank's pairs for them.
    d.tokensPerExpert.assign(L, 0);
    for (size_t src = 0; src < R; ++src)
      for (size_t e = 0; e < L; ++e) d.tokensPerExpert[e] += int(all[src * W + lanes() + me * L + e]);
    for (int& c : d.tokensPerExpert) c = (c + expertAlignment - 1) / expertAlignment * expertAlignment;
    const size_t n = layOut(h.fromLane, &h.receivedBy);
    h.arrivals = *hostWord(2);  // summed by begin()
    // Peers' kernels wait for this rank's: an allocation that throws stops
    // them. Every array before the dispatch kernel: an allocation that
    // throws after it would free rows that kernel may still write (the
    // extension's come from PyTorch's allocator on the caller's stream).
    void* rows = nullptr;
    const bool wide = from.idx64 != nullptr;
    allocateOrStop([&] {
      rows = rowsFor(d, n, fp8);
      receiveArrays(d, n, wide, true);
    });
    runDispatchKernel(rows);
    // Always (n may be 0): the unpack also copies the rank prefix matrix.
    gpu::unpackKernel<<<std::max(unpackGrid(n), 1), gpu::kUnpackThreads, 0, st_>>>(
        l_, int(n), srcBase(), recvMeta_, h.srcRank.data(), h.srcToken.data(), h.slot.data(), topkOut(d, wide),
        wide, d.topkWeights.data(), h.selfRow.data(), nullptr, uploadedPrefix(), h.rankPrefix.data());
    endNormal(false);
    clock_.end();
    return d;
  }

  // A normal dispatch without the host (DeepEP's num_worst_tokens):
  // everything is queued on the stream and the call returns. The plan, then
  // the count exchange on the GPU (sfCountKernel: each rank's lane counts
  // and rows per destination, put to every rank), the receive list laid out
  // there (sfLayoutKernel, at most `worst` rows kept), the dispatch kernel,
  // the unpack (padding past the received rows) and the end kernel
  // (flush, outcome words). Nothing is reset and no rank meets another at a
  // barrier: the rings continue where the last call left them
  // (Layer::ringPos), the count exchange alternates between two halves, and
  // a combine first waits until every rank summed the previous one.
  // Collective: every rank passes a worstTokens (the numbers may differ).
  GpuDispatched syncFreeDispatch(const uint16_t* x, Fp8Tokens f, gpu::Routing from, int tokens, int worst) {
    const Shape& sh = l_.shape;
    const size_t R = size_t(sh.ranks), W = size_t(worst);
    const bool fp8 = f.data != nullptr;
    if (ll_) checkCall(false, tokens, "dispatch");  // the mode's error, from every rank alike
    if (tokens < 0 || tokens > maxTokens_)
      failEveryRank("ep: a sync-free dispatch of " + std::to_string(tokens) + " tokens; the buffer takes at most " +
                        std::to_string(maxTokens_) +
                        " (Shape::tokens), and without the host every rank cannot make a bigger one at once: make "
                        "the buffer for the most tokens a call brings (the communicator is stopped)",
                    uint64_t(tokens), uint64_t(maxTokens_));
    checkFp8Hidden(fp8, sh.hidden, "dispatch");
    clock_.start("sync-free dispatch");
    setCall(tokens, x, f);
    GpuDispatched d;
    GpuHandle& h = d.handle;
    h.syncFree = true;
    // Every array first, then the kernels: no host call that could wait
    // (none was seen to: docs/ep.md) between kernels that peers wait for.
    void* rows = nullptr;
    allocateOrStop([&] {
      keepRouting(h, tokens);
      // What the handle keeps on the GPU, and what the unpack writes.
      Parts p;
      const size_t countsAt = p.add<unsigned long long>(2), prefixAt = p.add<int>(R * R),
                   layoutAt = p.add<char>(layoutBytes());
      const DeviceArray<char> slab = deviceArray<char>(p.bytes);
      h.counts = DeviceArray<unsigned long long>(slab, countsAt, 2);
      h.rankPrefix = DeviceArray<int>(slab, prefixAt, R * R);
      h.layout = DeviceArray<char>(slab, layoutAt, layoutBytes());
      receiveArrays(d, W, from.idx64 != nullptr);
      rows = rowsFor(d, W, fp8);
    });
    GIN_CUDA_CHECK(cudaMemsetAsync(mem_.word(0), 0, 32, st_));  // failed, arrivals, bad
    plan(h, true, kept(from, h));
    pack(x, tokens, f);
    gpu::sfCountKernel<<<1, kThreads, 0, st_>>>(l_, normalRounds_);
    gpu::sfLayoutKernel<<<1, kThreads, 0, st_>>>(l_, normalRounds_, uint64_t(W), rs_, srcBaseOf(layout_),
                                                h.counts.data(), h.rankPrefix.data(), mem_.word(2),
                                                h.counts.data() + 1, failed(), llStatus_, h.layout.data(),
                                                layoutBytes());
    runDispatchKernel(rows);
    if (W)
      gpu::unpackKernel<<<unpackGrid(W), gpu::kUnpackThreads, 0, st_>>>(
          l_, int(W), srcBaseOf(layout_), recvMeta_, h.srcRank.data(), h.srcToken.data(), h.slot.data(),
          topkOut(d, from.idx64 != nullptr), from.idx64 != nullptr, d.topkWeights.data(), h.selfRow.data(),
          h.counts.data());
    endNormal(false);
    clock_.end();
    return d;
  }

  // A normal dispatch's per-call layer: its tokens, bf16 or FP8, and where
  // the senders read the tokens (the caller's x, or FP8 data and scales,
  // where every peer is lsa: no pack into the x window).
  void setCall(int tokens, const uint16_t* x, Fp8Tokens f) {
    const bool fp8 = f.data != nullptr;
    l_.shape.tokens = tokens;
    l_.shape.fp8 = fp8;
    l_.xDirect = !allLsa_ ? nullptr : fp8 ? reinterpret_cast<const char*>(f.data) : reinterpret_cast<const char*>(x);
    l_.xScalesDirect = allLsa_ && fp8 ? f.scales : nullptr;
    l_.recvScales = nullptr;  // rowsFor sets it for FP8
  }

  // Room in the handle for the dispatch's routing, kept for a cached
  // dispatch (the plan copies it there and is made from it again), the rows
  // per token and where its row to this rank went: one allocation.
  void keepRouting(GpuHandle& h, int tokens) {
    const size_t T = size_t(tokens), K = size_t(l_.shape.topk);
    h.tokens = tokens;
    Parts p;
    const size_t idxAt = p.add<int32_t>(T * K), wAt = p.add<float>(T * K), rowsAt = p.add<int>(T),
                 selfAt = p.add<int>(T);
    const DeviceArray<char> slab = deviceArray<char>(p.bytes);
    h.topkIdx = DeviceArray<int32_t>(slab, idxAt, T * K);
    h.topkWeights = DeviceArray<float>(slab, wAt, T * K);
    h.rows = DeviceArray<int>(slab, rowsAt, T);
    h.selfRow = DeviceArray<int>(slab, selfAt, T);
  }

  // What the unpack writes for n rows, in one allocation (the rows in their
  // own, rowsFor: a caller may keep them longer than the handle): the top-k
  // indices as the caller's were (int64 into topkIdx64, `wide`), and with
  // `prefix` the handle's rank prefix matrix.
  void receiveArrays(GpuDispatched& d, size_t n, bool wide, bool prefix = false) {
    const size_t K = size_t(l_.shape.topk), R = size_t(l_.shape.ranks);
    GpuHandle& h = d.handle;
    Parts p;
    const size_t srcAt = p.add<int>(n), tokAt = p.add<int>(n), slotAt = p.add<uint32_t>(n),
                 idxAt = wide ? p.add<int64_t>(n * K) : p.add<int32_t>(n * K), wAt = p.add<float>(n * K),
                 prefixAt = prefix ? p.add<int>(R * R) : 0;
    const DeviceArray<char> slab = deviceArray<char>(p.bytes);
    h.srcRank = DeviceArray<int>(slab, srcAt, n);
    h.srcToken = DeviceArray<int>(slab, tokAt, n);
    h.slot = DeviceArray<uint32_t>(slab, slotAt, n);
    if (wide)
      d.topkIdx64 = DeviceArray<int64_t>(slab, idxAt, n * K);
    else
      d.topkIdx = DeviceArray<int32_t>(slab, idxAt, n * K);
    d.topkWeights = DeviceArray<float>(slab, wAt, n * K);
    if (prefix) h.rankPrefix = DeviceArray<int>(slab, prefixAt, R * R);
  }
  // Where the unpack writes the top-k indices (receiveArrays).
  static void* topkOut(GpuDispatched& d, bool wide) {
    return wide ? static_cast<void*>(d.topkIdx64.data()) : static_cast<void*>(d.topkIdx.data());
  }

  // Where n rows are received, straight into what the call returns: bf16
  // rows into d.x; FP8 rows' e4m3 bytes into d.xFp8 [n][H] and their scales
  // into d.xScales [n][H / 128] (Layer::recvScales).
  void* rowsFor(GpuDispatched& d, size_t n, bool fp8) {
    if (fp8) {
      const size_t H = size_t(l_.shape.hidden);
      d.xFp8 = deviceArray<uint8_t>(n * H);
      d.xScales = deviceArray<float>(n * (H / kFp8Group));
      l_.recvScales = d.xScales.data();
      return d.xFp8.data();
    }
    l_.recvScales = nullptr;
    d.x = deviceArray<uint16_t>(n * size_t(l_.shape.hidden));
    return d.x.data();
  }

 public:
  // CpuBuffer's cached dispatch: new tokens x [T][H] along the layout of the
  // dispatch that made `h` (every rank passes a handle of the same
  // dispatch). Returns the rows in that dispatch's order and its handle;
  // topkIdx, topkWeights and tokensPerExpert stay empty.
  GpuDispatched dispatch(const uint16_t* x, const GpuHandle& h) { return cachedDispatch(x, Fp8Tokens{}, h); }
  // The same with FP8 tokens (every rank passes FP8): the rows come back as
  // xFp8 and xScales, byte for byte. The handle may come from a bf16 or an
  // FP8 dispatch (the layout is the same).
  GpuDispatched dispatch(Fp8Tokens x, const GpuHandle& h) { return cachedDispatch(nullptr, x, h); }

  // CpuBuffer::combine with device arrays: y [N][H] bf16 in the dispatch's
  // row order, bias0/bias1 [T][H] bf16 or null. Returns [T][H] bf16.
  DeviceArray<uint16_t> combine(const uint16_t* y, const GpuHandle& h, const uint16_t* bias0 = nullptr,
                                const uint16_t* bias1 = nullptr) {
    const Shape& sh = l_.shape;
    checkCall(false, h.tokens, "combine");
    if (h.rows.size() != size_t(h.tokens) || h.srcToken.size() != h.received() || h.slot.size() != h.received() ||
        h.selfRow.size() != size_t(h.tokens) ||
        (h.syncFree ? h.counts.size() != 2 : h.tokensFromRank.size() != size_t(sh.ranks)))
      throw std::invalid_argument("ep: combine was given a handle that no dispatch of this buffer made");
    raiseEarlier();
    // The output before the first kernel: startCombine's waits for peers.
    DeviceArray<uint16_t> out;
    allocateOrStop([&] { out = deviceArray<uint16_t>(size_t(h.tokens) * size_t(sh.hidden)); });
    startCombine("combine");
    if (h.received() && sh.ranks > 1)  // one rank: every row is its own (or padding), read in y by the sum
      gpu::returnKernel<<<z_.combineGrid, kThreads, 0, st_>>>(l_, int(h.received()), h.srcRank.data(),
                                                              h.srcToken.data(), h.slot.data(), y);
    // The rows to wait for: a sync-free handle's are on the GPU; else the
    // handle's, less those this rank sent itself (read where they are, in y).
    const uint64_t arrivals =
        h.syncFree ? 0 : h.arrivals - uint64_t(h.tokensFromRank[size_t(comm_.rank())]);
    finishCombine(arrivals, h.tokens, sh.maxDests(), h.rows.data(), nullptr, nullptr, bias0, bias1, out.data(),
                  gpu::SelfRows{h.selfRow.data(), h.slot.data(), y}, h.syncFree ? h.counts.data() + 1 : nullptr);
    return out;
  }

  // CpuBuffer::lowLatencyDispatch with device arrays (x [T][H], topkIdx and
  // topkWeights [T][K]; the indices int32 or int64, as PyTorch's topk makes
  // them). It returns once its work is queued on the stream, as DeepEP's
  // does: no host synchronization, no barrier, nothing reset (see "Low
  // latency without a host" in docs/ep.md).
  // An expert index outside -1..E-1 is found on the GPU: that choice goes
  // nowhere, the communicator records the error (every rank's waits end) and
  // the next call of every rank, or synchronize(), throws.
  // deferReceive (DeepEP's return_recv_hook): the call queues the plan and
  // the sends only, and returns; receive() queues the rest (the wait for
  // the rows and their unpack into the returned arrays, which are filled
  // once it ran). The SMs are free for other work in between.
  template <class Idx>
  GpuLlDispatched lowLatencyDispatch(const uint16_t* x, const Idx* topkIdx, const float* topkWeights, int tokens,
                                     bool useFp8 = false, bool deferReceive = false) {
    static_assert(std::is_same_v<Idx, int32_t> || std::is_same_v<Idx, int64_t>, "top-k indices are int32 or int64");
    const Shape& sh = l_.shape;
    const size_t L = size_t(sh.localExperts()), R = size_t(sh.ranks);
    const size_t H = size_t(sh.hidden), Tmax = size_t(maxTokens_);
    checkCall(true, tokens, "lowLatencyDispatch");
    checkFp8Hidden(useFp8, l_.shape.hidden, "lowLatencyDispatch");
    raiseEarlier();
    (void)topkWeights;  // the low-latency combine takes them
    l_.shape.fp8 = useFp8;  // packKernel quantizes
    l_.xDirect = allLsa_ && !useFp8 ? reinterpret_cast<const char*>(x) : nullptr;  // no pack
    l_.xScalesDirect = nullptr;  // FP8 is quantized by the pack
    l_.recvScales = nullptr;
    clock_.start("low-latency dispatch");
    GpuLlDispatched d;
    GpuLlHandle& h = d.handle;
    h.tokens = tokens;
    // The plan on the GPU (tokens past T choose no expert: the layout is the
    // same on every rank), the tokens packed where a peer is not lsa, the puts.
    gpu::llPlanKernel<<<sh.experts, kThreads, 0, st_>>>(l_, topkIdx, tokens, sendList_, sendCount_, mem_.word(3));
    if (tokens > 0 && l_.xDirect == nullptr)
      gpu::packKernel<<<std::min(tokens, 1024), kThreads, 0, st_>>>(l_, x, tokens);
    gpu::llDispatchKernel<<<sh.experts * sh.llSenders, kThreads, 0, st_>>>(l_);
    // What it returns, in one allocation (each is a call of the allocator),
    // made while those run. The peers count this round now: if the
    // allocator throws, the round still ends on the GPU (its waits, no
    // outputs), then the error goes on.
    const size_t rows = L * R * Tmax;
    Parts parts;
    const size_t xAt = parts.add<char>(rows * (useFp8 ? H : H * 2));
    const size_t scalesAt = parts.add<float>(useFp8 ? rows * (H / kFp8Group) : 0);
    const size_t countAt = parts.add<int>(L), rangeAt = parts.add<int64_t>(L * R);
    const size_t tokenAt = parts.add<int>(rows), kAt = parts.add<int>(rows);
    const size_t arrivalsAt = parts.add<unsigned long long>(1);
    DeviceArray<char> all;
    try {
      all = deviceArray<char>(parts.bytes);
    } catch (...) {
      gpu::llUnpackKernel<<<std::min(int(L * R), spinningGrid()), kThreads, 0, st_>>>(
          l_, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, failed());
      endLowLatency(0, mem_.word(2));
      throw;
    }
    if (useFp8) {
      d.xFp8 = DeviceArray<uint8_t>(all, xAt, rows * H);
      d.xScales = DeviceArray<float>(all, scalesAt, rows * (H / kFp8Group));
    } else {
      d.x = DeviceArray<uint16_t>(all, xAt, rows * H);
    }
    h.count = DeviceArray<int>(all, countAt, L);
    h.range = DeviceArray<int64_t>(all, rangeAt, L * R);
    h.srcToken = DeviceArray<int>(all, tokenAt, rows);
    h.srcK = DeviceArray<int>(all, kAt, rows);
    h.arrivals = DeviceArray<unsigned long long>(all, arrivalsAt, 1);
    const auto unpack = [this, d, grid = std::min(int(L * R), spinningGrid())] {
      const GpuLlHandle& dh = d.handle;
      gpu::llUnpackKernel<<<grid, kThreads, 0, st_>>>(  // kThreads >= R
          l_, d.x.data(), d.xFp8.data(), d.xScales.data(), dh.count.data(), dh.range.data(), dh.srcToken.data(),
          dh.srcK.data(), failed());
      endLowLatency(0, dh.arrivals.data());
    };
    if (deferReceive)
      pendingReceive_ = unpack;
    else
      unpack();
    return d;
  }

  // DeepEP's zero-copy combine buffer (get_next_low_latency_combine_buffer):
  // [L][R * Tmax][H] bf16 of device memory in the buffer, where rows to
  // peers that are not lsa-reachable are staged. Expert outputs written
  // there and passed to lowLatencyCombine as y go out with no copy. Write it
  // after the dispatch whose rows it answers has received (in stream order
  // after that call, or after its receive()): until then the previous
  // combine's puts may still read it. Low-latency mode only.
  uint16_t* lowLatencyCombineBuffer() const {
    if (!ll_) throw std::invalid_argument("ep: lowLatencyCombineBuffer on a normal-mode buffer");
    return static_cast<uint16_t*>(comm_.localPointer(l_.partial));
  }

  // CpuBuffer::lowLatencyCombine with device arrays: y [L][R * Tmax][H] (or
  // lowLatencyCombineBuffer()), topkIdx and topkWeights [T][K] of the
  // dispatch that made `h`.
  // deferReceive: the returns only, as lowLatencyDispatch's; receive()
  // queues the sum into the returned array (topkIdx and topkWeights are
  // read then: keep them).
  template <class Idx>
  DeviceArray<uint16_t> lowLatencyCombine(const uint16_t* y, const Idx* topkIdx, const float* topkWeights,
                                          const GpuLlHandle& h, bool deferReceive = false) {
    static_assert(std::is_same_v<Idx, int32_t> || std::is_same_v<Idx, int64_t>, "top-k indices are int32 or int64");
    const Shape& sh = l_.shape;
    checkCall(true, h.tokens, "lowLatencyCombine");
    const size_t L = size_t(sh.localExperts()), R = size_t(sh.ranks);
    if (h.count.size() != L || h.range.size() != L * R || h.srcToken.size() != L * R * size_t(maxTokens_) ||
        h.arrivals.size() != 1)
      throw std::invalid_argument("ep: lowLatencyCombine was given a handle that no dispatch of this buffer made");
    raiseEarlier();
    clock_.start("low-latency combine");
    gpu::llReturnKernel<<<int(L * R) * z_.llSplit, kThreads, 0, st_>>>(l_, z_.llSplit, h.range.data(),
                                                                       h.srcToken.data(), h.srcK.data(), y, failed());
    // The output, allocated while the returns run; if the allocator throws,
    // the round still ends on the GPU (its wait, no sums: peers count it).
    const int sumGrid = std::max(1, std::min({h.tokens, 1024, spinningGrid()}));
    DeviceArray<uint16_t> out;
    try {
      out = deviceArray<uint16_t>(size_t(h.tokens) * size_t(sh.hidden));
    } catch (...) {
      gpu::llSumKernel<<<sumGrid, kThreads, 0, st_>>>(l_, 0, h.arrivals.data(), topkIdx, topkWeights,
                                                      static_cast<uint16_t*>(nullptr), failed());
      endLowLatency(1, h.arrivals.data());
      throw;
    }
    const auto sum = [this, sumGrid, tokens = h.tokens, arrivals = h.arrivals, topkIdx, topkWeights, out] {
      gpu::llSumKernel<<<sumGrid, kThreads, 0, st_>>>(l_, tokens, arrivals.data(), topkIdx, topkWeights, out.data(),
                                                      failed());
      endLowLatency(1, arrivals.data());
    };
    if (deferReceive)
      pendingReceive_ = sum;
    else
      sum();
    return out;
  }

  // The receive of the last low-latency call given deferReceive (DeepEP's
  // hook): queued on the buffer's stream. Every rank calls it, before its
  // next call of the buffer (which is refused while a receive is pending:
  // the calls' rounds are counted by the kernels it queues).
  void receive() {
    if (!pendingReceive_)
      throw std::invalid_argument("ep: receive() with no low-latency call given deferReceive before it");
    const std::function<void()> f = std::move(pendingReceive_);
    pendingReceive_ = nullptr;
    f();
  }
  bool receivePending() const { return bool(pendingReceive_); }

  // Waits for the buffer's stream, then throws what an earlier call of this
  // rank left behind (calls return before their work is done): a bad
  // expert index, more rows than a worstTokens, a wait that gave up, the
  // communicator's error.
  void synchronize() {
    GIN_CUDA_CHECK(cudaStreamSynchronize(st_));
    raiseEarlier(true);
  }

 private:
  gin::Comm& comm_;
  int maxTokens_;
  bool ll_;
  cudaStream_t st_;
  Layer l_;
  gpu::Sizing z_;
  PhaseClock clock_{comm_.rank()};
  cudaMemPool_t pool_ = nullptr;
  DeviceAllocator alloc_;
  std::function<void()> pendingReceive_;  // a deferred low-latency receive (receive())
  // Pinned: the host's words (hostWord(2): the rows a synchronizing
  // dispatch sends), the low-latency status (llStatus_, hostWord(4)),
  // hostCounts(), hostLayout().
  void* host_ = nullptr;
  unsigned long long* llStatus_ = nullptr;  // hostWord(4), as a device address
  uint64_t* hostCountsOnGpu_ = nullptr;     // hostCounts(), as a device address
  gpu::DeviceAllocs mem_;
  uint32_t* sendList_ = nullptr;
  uint64_t* sendCount_ = nullptr;
  void* layout_ = nullptr;  // the receive list's layout: rs_ [R][C], then srcBase() [R + 1]
  RecvState* rs_ = nullptr;
  char* recvMeta_ = nullptr;
  bool allLsa_ = true;  // every peer over lsa: tokens are read from the caller's x (Layer::xDirect)
  unsigned long long* rounds_ = nullptr;  // low-latency mode: Layer::llRounds
  uint64_t* ringPos_ = nullptr;           // normal mode: Layer::ringPos
  gpu::NormalRounds* normalRounds_ = nullptr;  // normal mode: device words (gpu::NormalRounds)

  void* alloc(size_t bytes) { return mem_.alloc(bytes); }
  int* failed() const { return mem_.failed(); }
  unsigned long long* hostWord(int i) const { return static_cast<unsigned long long*>(host_) + i; }
  uint64_t maxRecv() const { return uint64_t(l_.shape.ranks) * uint64_t(maxTokens_); }
  size_t lanes() const { return size_t(l_.shape.ranks) * size_t(l_.shape.channels); }
  size_t layoutBytes() const { return lanes() * sizeof(RecvState) + (size_t(l_.shape.ranks) + 1) * 8; }
  // A synchronizing dispatch's rank prefix matrix [R][R] (int), uploaded
  // with the layout, right after it (layout_, hostLayout()).
  size_t prefixBytes() const { return size_t(l_.shape.ranks) * size_t(l_.shape.ranks) * 4; }
  const int* uploadedPrefix() const { return reinterpret_cast<const int*>(static_cast<char*>(layout_) + layoutBytes()); }
  // What a normal dispatch's opening all-gather carries per rank after its
  // token count and bad index: lane counts [C][R], pairs per expert [E].
  size_t startWords() const { return lanes() + size_t(l_.shape.experts); }
  // Where plan block c counts its pairs per expert where E > kPlanExperts
  // (row c of [C][E], on the GPU; gpu::PlanKeep::perExpert).
  uint64_t* sentPerExpert() const { return sendCount_ + lanes(); }
  // What the plan writes to the host (gpu::planKernel's toHost): lane
  // counts [C][R], pairs per expert [C][E], a bad index per block [C].
  size_t planWords() const {
    const size_t C = size_t(l_.shape.channels);
    return lanes() + C * size_t(l_.shape.experts) + C;
  }
  // Pinned host memory after the words: this rank's planWords() (then
  // startWords(), after begin() summed them), the layout's staging.
  uint64_t* hostCounts() const { return reinterpret_cast<uint64_t*>(static_cast<char*>(host_) + 4096); }
  char* hostLayout() const { return reinterpret_cast<char*>(hostCounts() + planWords()); }
  size_t hostBytes() const { return 4096 + planWords() * 8 + layoutBytes() + prefixBytes(); }
  const uint64_t* srcBase() const { return srcBaseOf(layout_); }
  // The list's first position per source in a layout (after its RecvStates).
  uint64_t* srcBaseOf(void* layout) const {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(layout) + lanes() * sizeof(RecvState));
  }

  // The receive list of a normal dispatch: (source, channel) in order,
  // fromLane[src][c] rows each, uploaded as rs_ and srcBase() on the stream;
  // with receivedBy ([j][i]: rows rank j received from rank i), DeepEP's
  // rank prefix matrix too, to uploadedPrefix() in the same copy.
  // Returns the rows in all.
  size_t layOut(const std::vector<uint64_t>& fromLane, const std::vector<int>* receivedBy = nullptr) {
    const size_t R = size_t(l_.shape.ranks), C = size_t(l_.shape.channels);
    RecvState* rs = reinterpret_cast<RecvState*>(hostLayout());
    uint64_t* base = reinterpret_cast<uint64_t*>(hostLayout() + lanes() * sizeof(RecvState));
    uint64_t at = 0;
    for (size_t src = 0; src < R; ++src) {
      base[src] = at;
      for (size_t c = 0; c < C; ++c) {
        rs[src * C + c] = RecvState{};
        rs[src * C + c].expect = fromLane[src * C + c];
        rs[src * C + c].base = at;
        at += fromLane[src * C + c];
      }
    }
    base[R] = at;
    if (at > maxRecv())
      throw std::logic_error("ep: " + std::to_string(at) + " rows would come, more than the " +
                             std::to_string(maxRecv()) + " the ranks can send");
    if (receivedBy) {
      int* prefix = reinterpret_cast<int*>(hostLayout() + layoutBytes());
      for (size_t j = 0; j < R; ++j)
        for (size_t i = 0, sum = 0; i < R; ++i) prefix[i * R + j] = int(sum += size_t((*receivedBy)[j * R + i]));
    }
    upload(layout_, hostLayout(), layoutBytes() + (receivedBy ? prefixBytes() : 0));
    return size_t(at);
  }

  // Host to device on the stream (pinned sources are written again only
  // after the next call's synchronization; pageable ones are staged by the call).
  void upload(void* to, const void* from, size_t bytes) {
    if (bytes) GIN_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, st_));
  }

  void checkCall(bool lowLatency, int tokens, const char* call) const {
    if (pendingReceive_)
      throw std::invalid_argument(std::string("ep: ") + call + " while the last low-latency call's receive is "
                                  "pending: call receive() (the hook) first, on every rank");
    if (lowLatency != ll_)
      throw std::invalid_argument(std::string("ep: ") + call + " on a " + (ll_ ? "low-latency" : "normal-mode") +
                                  " buffer; build the buffer with lowLatency = " + (lowLatency ? "true" : "false"));
    if (tokens < 0 || tokens > maxTokens_)
      throw std::invalid_argument(std::string("ep: ") + call + " of " + std::to_string(tokens) +
                                  " tokens; the buffer takes at most " + std::to_string(maxTokens_) +
                                  " (Shape::tokens)");
  }

  GpuDispatched cachedDispatch(const uint16_t* x, Fp8Tokens f, const GpuHandle& h) {
    const Shape& sh = l_.shape;
    const int R = sh.ranks, C = sh.channels;
    const bool fp8 = f.data != nullptr;
    checkCall(false, h.tokens, "dispatch");
    checkFp8Hidden(fp8, sh.hidden, "dispatch");
    if (h.topkIdx.size() != size_t(h.tokens) * size_t(sh.topk) || h.rows.size() != size_t(h.tokens) ||
        (h.syncFree ? h.layout.size() != layoutBytes() : h.fromLane.size() != size_t(R) * size_t(C)))
      throw std::invalid_argument("ep: a cached dispatch needs the handle of a dispatch of this buffer");
    raiseEarlier();
    clock_.start("cached dispatch");
    setCall(h.tokens, x, f);
    if (h.syncFree) {
      // Without the host, as the handle's dispatch: the plan again, the
      // handle's layout (no count exchange), the rows, the end kernel.
      GpuDispatched d;
      d.handle = h;
      void* rows = nullptr;
      allocateOrStop([&] { rows = rowsFor(d, h.received(), fp8); });  // before any kernel
      GIN_CUDA_CHECK(cudaMemsetAsync(mem_.word(0), 0, 32, st_));  // failed, arrivals, bad
      plan(h, true);
      pack(x, h.tokens, f);
      copyOn(layout_, h.layout.data(), layoutBytes());
      runDispatchKernel(rows);
      endNormal(false);
      clock_.end();
      return d;
    }
    uint64_t n = 0;
    for (const uint64_t v : h.fromLane) n += v;
    if (n != h.received())
      throw std::invalid_argument("ep: a cached dispatch was given a handle that no dispatch of this buffer made");
    GpuDispatched d;
    d.handle = h;
    void* rows = rowsFor(d, n, fp8);  // before the all-gather: a rank that cannot make it meets no peer
    startPlanned(x, f, h);
    // The receive list as the handle's dispatch laid it out (after the
    // synchronization: an earlier call's upload from the staging is done).
    layOut(h.fromLane);
    // Every position the handle lists is filled once the receivers are done
    // (a rank that passed another dispatch's handle makes them wait, and
    // the wait gives up at the timeout: a later call throws).
    runDispatchKernel(rows);
    endNormal(false);
    clock_.end();
    return d;
  }

  // The caller's routing for a dispatch that makes handle h: planKernel
  // copies it into h; `counted`: and counts its pairs per expert for the
  // host (a dispatch that synchronizes; sentPerExpert() is the plan
  // blocks' scratch where E > kPlanExperts).
  gpu::Routing kept(gpu::Routing from, const GpuHandle& h, bool counted = false) const {
    from.keep = {h.topkIdx.data(), h.topkWeights.data(), h.selfRow.data(), counted ? sentPerExpert() : nullptr};
    return from;
  }
  // Normal mode's start: the plan made on the GPU from the handle's routing
  // (its rows per token into h.rows), then begin(); an expert index outside
  // -1..E-1 is refused with the token and choice. Returns every rank's
  // startWords(): lane counts [C][R], then pairs per expert [E].
  std::vector<uint64_t> startPlanned(const uint16_t* x, Fp8Tokens f, const GpuHandle& h, const gpu::Routing& from = {}) {
    GIN_CUDA_CHECK(cudaMemsetAsync(mem_.word(0), 0, 32, st_));  // failed, arrivals, bad
    plan(h, false, from, hostCountsOnGpu_);
    return begin(x, h.tokens, f, from.keep.perExpert != nullptr);
  }
  // planKernel over the routing of `from` (a new handle's), else over the
  // handle's own (a cached dispatch). `record`: a bad index is the
  // communicator's error, for calls no host all-gather checks. toHost:
  // the counts to the host (hostCounts()'s device address).
  void plan(const GpuHandle& h, bool record, const gpu::Routing& from = {}, uint64_t* toHost = nullptr) {
    const bool own = !from.idx && !from.idx64;
    const float* weight = own ? h.topkWeights.data() : from.weight;
    char* meta = static_cast<char*>(comm_.localPointer(l_.meta));
    if (from.idx64)
      gpu::planKernel<<<l_.shape.channels, kThreads, 0, st_>>>(l_, from.idx64, weight, meta, sendList_, sendCount_,
                                                               h.rows.data(), mem_.word(2), mem_.word(3), record,
                                                               from.keep, toHost);
    else
      gpu::planKernel<<<l_.shape.channels, kThreads, 0, st_>>>(l_, own ? h.topkIdx.data() : from.idx, weight, meta,
                                                               sendList_, sendCount_, h.rows.data(), mem_.word(2),
                                                               mem_.word(3), record, from.keep, toHost);
  }
  // The tokens into the x window, unless read from the caller's x
  // (Layer::xDirect).
  void pack(const uint16_t* x, int tokens, Fp8Tokens f) {
    if (tokens > 0 && l_.xDirect == nullptr && f.data)
      gpu::packFp8Kernel<<<std::min(tokens, 1024), kThreads, 0, st_>>>(l_, f, tokens);
    else if (tokens > 0 && l_.xDirect == nullptr)
      gpu::packKernel<<<std::min(tokens, 1024), kThreads, 0, st_>>>(l_, x, tokens);
    GIN_CUDA_CHECK(cudaGetLastError());
  }

  // The tokens packed, a synchronization, then the opening all-gather
  // (below). Nothing is reset: the rings go on from where the last call
  // left them (Layer::ringPos). Returns every rank's startWords().
  // `counted`: the plan counted its pairs per expert (gpu::PlanKeep).
  std::vector<uint64_t> begin(const uint16_t* x, int tokens, Fp8Tokens f, bool counted) {
    pack(x, tokens, f);
    // The plan wrote its counts to hostCounts() (mapped): nothing to copy.
    GIN_CUDA_CHECK(cudaStreamSynchronize(st_));
    clock_.mark("plan+pack+reset");
    const size_t C = size_t(l_.shape.channels), E = size_t(l_.shape.experts);
    uint64_t* words = hostCounts();
    // The rows this rank sends (its lane counts summed: the rows its
    // combine waits for, with its own), the smallest bad index of a block.
    uint64_t sent = 0, bad = 0;
    for (size_t i = 0; i < lanes(); ++i) sent += words[i];
    for (size_t c = 0; c < C; ++c)
      if (const uint64_t b = words[lanes() + C * E + c]; b != 0 && (bad == 0 || b < bad)) bad = b;
    *hostWord(2) = sent;
    // This rank's words: its lane counts, then its pairs per expert (the
    // plan blocks' rows summed; stale where the plan did not count them, in
    // a cached dispatch, which does not read them).
    if (counted) {
      std::vector<uint64_t> sums(E, 0);
      for (size_t c = 0; c < C; ++c)
        for (size_t e = 0; e < E; ++e) sums[e] += words[lanes() + c * E + e];
      std::copy(sums.begin(), sums.end(), words + lanes());
    }
    std::vector<uint64_t> all = agreeStart(tokens, bad, startWords());
    clock_.mark("barrier");
    return all;
  }

  // A call's opening all-gather of each rank's tokens, first bad expert index (1 + token
  // x K + choice; 0: none) and its first `counts` lane counts (hostCounts):
  // a rank's bad input or more tokens than the buffer holds is thrown on
  // every rank, not only where it was found. Returns the counts of every
  // rank, [rank][counts].
  std::vector<uint64_t> agreeStart(int tokens, uint64_t bad, size_t counts = 0) {
    const size_t R = size_t(l_.shape.ranks), per = 2 + counts, me = size_t(comm_.rank());
    std::vector<uint64_t> words(R * per, 0);  // per rank: tokens, bad, counts
    words[me * per] = uint64_t(tokens);
    words[me * per + 1] = bad;
    std::copy(hostCounts(), hostCounts() + counts, words.begin() + std::ptrdiff_t(me * per + 2));
    comm_.bootstrap().allGather(words.data(), per * 8);
    std::vector<uint64_t> all(R * counts);
    for (size_t r = 0; r < R; ++r)
      std::copy(words.begin() + std::ptrdiff_t(r * per + 2), words.begin() + std::ptrdiff_t((r + 1) * per),
                all.begin() + std::ptrdiff_t(r * counts));
    for (int r = 0; r < int(R); ++r)
      if (const uint64_t b = words[size_t(r) * per + 1]) throw std::invalid_argument(badIndex(r, b));
    int64_t most = 0;
    int who = 0;
    for (int r = 0; r < int(R); ++r)
      if (int64_t(words[size_t(r) * per]) > most) most = int64_t(words[size_t(r) * per]), who = r;
    if (most > maxTokens_)
      throw CapacityError("ep: rank " + std::to_string(who) + " dispatched " + std::to_string(most) +
                              " tokens; the buffer holds at most " + std::to_string(maxTokens_) +
                              " per rank (Shape::tokens): make one for at least " + std::to_string(most),
                          int(most));
    return all;
  }

  // Device to device on the stream.
  void copyOn(void* to, const void* from, size_t bytes) {
    if (bytes) GIN_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, st_));
  }

  static int unpackGrid(size_t rows) {
    return int(std::min<size_t>((rows + gpu::kUnpackThreads - 1) / gpu::kUnpackThreads, 4096));
  }
  // The dispatch kernel (senders and receivers, all resident; selfKernel
  // for one rank), rows into recvX [rows][rowBytes], metadata into the
  // buffer's list.
  void runDispatchKernel(void* recvX) {
    gpu::launchDispatchKernel(st_, l_, rs_, recvX, recvMeta_, failed(), z_.sms);
  }

  // The most blocks a kernel whose blocks all wait for peers may have: any
  // number where this rank has its GPU to itself (no peer kernel needs room
  // beside them), half this rank's share of the GPU where ranks share it.
  int spinningGrid() const { return z_.sharing > 1 ? z_.combineGrid : 1 << 30; }

  // "rank r's token t choice k names an expert outside ...", from 1 + t x K + k.
  std::string badIndex(int rank, uint64_t b) const {
    const uint64_t K = uint64_t(l_.shape.topk);
    return "ep: rank " + std::to_string(rank) + "'s token " + std::to_string((b - 1) / K) + " choice " +
           std::to_string((b - 1) % K) + " names an expert outside -1 (no expert) .. " +
           std::to_string(l_.shape.experts - 1);
  }

  // A low-latency call's last kernel (llEndKernel: contexts flushed, round
  // words advanced, the outcome words to the host; `which` 0 dispatch, 1
  // combine).
  void endLowLatency(int which, unsigned long long* arrivals) {
    gpu::llEndKernel<<<l_.dc.nContexts, 64, 0, st_>>>(l_, rounds_, which, arrivals, failed(), mem_.word(3),
                                                     llStatus_);
    GIN_CUDA_CHECK(cudaGetLastError());
    clock_.mark("queued");
    clock_.end();
  }

  // Throws what earlier calls of this rank left behind: a bad expert index
  // of this rank, the communicator's error (a peer's, too), a wait that gave
  // up. Cheap when there is none: two host words. Else (or `synced`: the
  // stream was waited for) the stream is waited for first, so the words are
  // those of every call queued; its waits end, the communicator aborting them.
  void raiseEarlier(bool synced = false) {
    // llStatus_ as the host sees it: failed waits, bad index, rows past a sync-free dispatch's worstTokens.
    volatile unsigned long long* status = hostWord(4);
    if (!synced && status[0] == 0 && !comm_.hasError()) return;
    if (!synced) GIN_CUDA_CHECK(cudaStreamSynchronize(st_));
    if (const uint64_t b = status[1])
      throw std::invalid_argument(badIndex(comm_.rank(), b) +
                                  " (in an earlier call that returned before its work was done: that choice went "
                                  "nowhere and the communicator stopped every rank; make a new one)");
    if (const uint64_t n = status[2])
      throw std::length_error("ep: an earlier sync-free dispatch brought rank " + std::to_string(comm_.rank()) + " " +
                              std::to_string(n) +
                              " rows, more than its worstTokens (the rows past it were dropped and the "
                              "communicator stopped every rank): pass a worstTokens of at least the most rows a "
                              "rank can receive, ranks x Shape::tokens at most");
    comm_.check();
    if (status[0])
      throw std::runtime_error("ep: an earlier call that returned before its work was done: a wait gave up on rank " +
                               std::to_string(comm_.rank()));
  }

  // A combine's returns wait until every rank summed the combines before
  // it (each adds 1 to every rank's Signals::summed after its sum): then
  // every combine window they write was read, and every combine signal
  // was reset after its sum (finishCombine).
  void startCombine(const char* call) {
    clock_.start(call);
    // One rank: its earlier combines came before on the stream (as the rows
    // it waits for in finishCombine: none come from peers), and nothing in
    // its combine waits. failed() is not reset: what an earlier wait left
    // there (a sync-free layout's) its end kernel already reported in
    // llStatus_, which stays set, so the end kernel here reports it again.
    if (l_.shape.ranks == 1) return;
    GIN_CUDA_CHECK(cudaMemsetAsync(failed(), 0, 4, st_));
    gpu::summedWaitKernel<<<1, 1, 0, st_>>>(l_, normalRounds_, failed());
  }

  // After the return kernel: wait for `arrivals` rows (plus *more, a
  // count on the GPU, when given: a sync-free handle's combine), sum them
  // into out, then the end kernel (the combine signal reset, every rank
  // told that this sum is done; contexts flushed; the outcome words for
  // raiseEarlier).
  void finishCombine(uint64_t arrivals, int tokens, int stride, const int* rows, const int32_t* idx,
                     const float* weight, const uint16_t* bias0, const uint16_t* bias1, uint16_t* out,
                     gpu::SelfRows self = {}, const unsigned long long* more = nullptr) {
    if (l_.shape.ranks > 1) gpu::combineWaitKernel<<<1, 1, 0, st_>>>(l_, arrivals, failed(), more);
    // A block per token: the loads of a token's row indices (rows, self)
    // wait for no other token's rows (a grid of 1024 blocks, 4 tokens each,
    // took 40.6-40.8 us against 35.1-36.8 on one H200, 1 rank, 4096 tokens).
    if (tokens > 0)
      gpu::sumKernel<<<tokens, kThreads, 0, st_>>>(l_, tokens, stride, rows, idx, weight, bias0, bias1, out, self);
    endNormal(true);
    clock_.end();
  }

  // A normal call's last kernel (gpu::endKernel); `summed` after a combine.
  void endNormal(bool summed) {
    // A dispatch's bad index word (a combine's is not its own).
    gpu::endKernel<<<l_.dc.nContexts, 64, 0, st_>>>(l_, summed, normalRounds_, failed(),
                                                   summed ? nullptr : mem_.word(3), llStatus_);
    GIN_CUDA_CHECK(cudaGetLastError());
    clock_.mark("queued");
  }

  // Bad input of a sync-free call found on the host: the communicator's
  // error from the GPU (every rank's waits end and their next call throws),
  // then thrown here.
  [[noreturn]] void failEveryRank(const std::string& why, uint64_t value, uint64_t limit) {
    stopEveryRank(gin::Op::BadArgument, value, limit);
    throw std::invalid_argument(why);
  }

  // Records the communicator's error (op, value, limit) from the GPU, in
  // stream order: every rank's waits end and their next call throws. The
  // caller throws next, so a launch failure here is left to that exception.
  void stopEveryRank(gin::Op op, uint64_t value, uint64_t limit) {
    gpu::failKernel<<<1, 1, 0, st_>>>(l_, op, value, limit);
    (void)cudaGetLastError();
  }

  // The allocations of a call whose kernels the peers wait for without the
  // host (sync-free calls make every array before their first kernel; a
  // dispatch that synchronizes, after its all-gather; a combine): if
  // one throws, the communicator's error (callAborted, in stream order
  // after this rank's earlier calls), so that every rank's waits end at once
  // instead of at the timeout, then the exception goes on.
  template <class F>
  void allocateOrStop(F&& allocate) {
    try {
      allocate();
    } catch (...) {
      stopEveryRank(gin::Op::CallAborted, 0, 0);
      throw;
    }
  }
};

}  // namespace gin::ep
#endif  // defined(__CUDACC__)
