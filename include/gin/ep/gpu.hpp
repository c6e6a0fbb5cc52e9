// gin/ep/gpu.hpp — the expert-parallel layer of gin/ep/layer.hpp on a GPU: the
// same device bodies as the CPU driver (gin/ep/cpu.hpp), launched as kernels on the
// rank's stream. Normal mode: a count kernel, one dispatch kernel whose first
// C CTAs send (one per channel, warps per destination) while R x C CTAs
// receive (one per source and channel), an expert+combine kernel (a warp per
// received token), a kernel that waits for the combine signal (one CTA) and
// a reduce kernel. Low-latency mode: Shape::llSenders CTAs per expert
// dispatch (their warps share the tokens), one CTA waits for every count,
// CTAs per (local expert, source) run the expert and combine (a warp per
// token), then the reduce. The waits are one-CTA kernels and the other grids
// leave half the GPU free (see GpuLayer's constructor).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gin/ep/cpu.hpp"
#include "gin/gin.hpp"

// CUDA only: under a plain C++ compiler this header gives the host part
// (gin/ep/cpu.hpp) and nothing else.
#if defined(__CUDACC__)
#include <cuda_runtime.h>

namespace gin::ep {

namespace gpu {

// A spin on a non-blocking step, bounded by the communicator's timeout.
template <class Step>
__device__ bool spin(const gin::DevComm& dc, Step step, gin::Op op, int peer, uint64_t id) {
  uint64_t start = 0;
  for (uint32_t i = 1;; ++i) {
    const int r = step();
    if (r < 0) return true;
    if (r > 0) {
      start = 0;
      continue;
    }
    if ((i & 63) == 0) {
      if (gin::aborted(dc)) return false;
      const uint64_t now = gin::nowNs();
      if (start == 0) start = now;
      if (dc.timeoutNs && now - start > dc.timeoutNs) {
        gin::recordError(dc, op, peer, -1, id, 0, 0);
        return false;
      }
    }
  }
}

// This rank's counts (Layer::sendCount, lane (c, d) at c * R + d): thread i
// puts lane i's count to its destination d (no signal), then
// after a block barrier thread d adds the count signal at d (same context
// and peer as d's putValues, so the signal follows them; over lsa its
// release covers the other threads' stores through the barrier).
__global__ void countKernel(Layer l) {
  gin::Net<> net(l.dc, 0);
  const int R = l.shape.ranks, C = l.shape.channels;
  for (int i = int(threadIdx.x); i < R * C; i += int(blockDim.x)) {
    const int c = i / R, d = i % R;
    net.putValue(gin::teamWorld(l.dc), d, l.counts, (size_t(l.dc.rank) * C + size_t(c)) * 8, l.sendCount[i],
                 gin::None{});
  }
  __syncthreads();
  for (int d = int(threadIdx.x); d < R; d += int(blockDim.x))
    net.signal(gin::teamWorld(l.dc), d, gin::SignalAdd{l.sig.count(), 1});
}

// Lays out a receive list of n lanes (lane i = source i / C, channel
// i % C) with a block: rs[i] = {expect = count(i), base = the counts of the
// lanes before i, keep}, srcBase[src] = the first position of source src;
// returns the total to every thread. keep: rows from position `worst` on
// are taken out of the rings but not stored. Every count is loaded at once,
// then a block-wide scan per blockDim.x lanes (one thread walking them, a
// dependent load per lane, took 16 us for 64 lanes on one H200).
template <class Count>
__device__ uint64_t layOutLanes(int n, int C, Count count, RecvState* rs, uint64_t* srcBase,
                                uint64_t worst = ~0ull) {
  __shared__ uint64_t carry, warpSum[32];
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32, warps = int(blockDim.x / 32);
  if (tid == 0) carry = 0;
  __syncthreads();
  for (int i0 = 0; i0 < n; i0 += int(blockDim.x)) {
    const int i = i0 + tid;
    const uint64_t e = i < n ? count(i) : 0;
    uint64_t incl = e;  // inclusive scan over the warp, then over the warps
    for (int o = 1; o < 32; o <<= 1) {
      const uint64_t v = __shfl_up_sync(~0u, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) warpSum[warp] = incl;
    __syncthreads();
    uint64_t at = carry + incl - e, chunk = 0;
    for (int w = 0; w < warps; ++w) {
      at += w < warp ? warpSum[w] : 0;
      chunk += warpSum[w];
    }
    if (i < n) {
      RecvState s;
      s.expect = e;
      s.base = at;
      s.keep = at >= worst ? 0 : (worst - at < e ? worst - at : e);
      rs[i] = s;
      if (i % C == 0) srcBase[i / C] = at;
    }
    __syncthreads();  // every thread read carry and warpSum
    if (tid == 0) carry += chunk;
    __syncthreads();
  }
  return carry;
}

// Wait for every source's counts, then lay out the receive list:
// rs[src][c] = {0, expect, base}; srcOf[pos] = src; *total = positions
// (at most maxRecv, the receive list's room). Thread 0 waits; every thread
// then lays out its share of the lanes and fills its share of srcOf.
__global__ void layoutKernel(Layer l, RecvState* rs, int* srcOf, unsigned long long* total, int* failed,
                             uint64_t maxRecv) {
  __shared__ uint64_t srcBase[65];  // first position of each source; [R] = the total
  __shared__ int ok;
  const int R = l.shape.ranks, C = l.shape.channels;
  if (threadIdx.x == 0) {
    ok = gin::Net<>(l.dc, 0).waitSignal(gin::CoopThread{}, l.sig.count(), uint64_t(R)) ? 1 : 0;
    if (!ok) {
      *failed = 1;
      *total = 0;
    }
  }
  __syncthreads();
  if (!ok) return;
  const auto* got = static_cast<const uint64_t*>(gin::localPointer(l.counts, 0));
  const uint64_t n = layOutLanes(R * C, C, [got](int i) { return gin::volatileLoad(got + i); }, rs, srcBase);
  // More positions than the ranks can send would overrun the receive
  // list: fail the layer and receive nothing.
  if (n > maxRecv) {
    for (int i = int(threadIdx.x); i < R * C; i += int(blockDim.x)) rs[i].expect = 0;
    if (threadIdx.x == 0) {
      *failed = 1;
      *total = 0;
    }
    return;
  }
  if (threadIdx.x == 0) *total = n;
  srcBase[R] = n;  // every thread writes the same value
  __syncthreads();
  for (uint64_t pos = threadIdx.x; pos < n; pos += blockDim.x) {
    int src = 0;
    while (src + 1 < R && srcBase[src + 1] <= pos) ++src;
    srcOf[pos] = src;
  }
}

// Sender lanes per warp when the channel's CTA has fewer than two warps per
// destination: warp w drives the lanes (c, d) with d = w, w + warps, ...
// (ranks <= 64). With two or more, each lane gets a span of warps.
constexpr int kLanesPerWarp = 8;

// CTAs of kDispatchThreads: a sender CTA splits its warps among the
// destinations (8 per destination on 4 ranks), a receiver CTA copies a slot
// per warp. The grid is at most one CTA per SM anyway (autoShape). On 4
// H200s 1024 threads took 8% off a sync-free (dispatch, combine) pair and 11%
// off an FP8 one against 256, 5-7% on 2 (docs/performance.md), even with
// the spills that 64 registers per thread bring.
constexpr int kDispatchThreads = 1024;
static_assert(kDispatchThreads / 32 * kLanesPerWarp >= 64, "a sender CTA drives up to 64 destinations");

__global__ void __launch_bounds__(kDispatchThreads, 1)
    dispatchKernel(Layer l, const RecvState* rs, void* recvX, char* recvMeta, int* failed) {
  const int C = l.shape.channels, R = l.shape.ranks, me = l.dc.rank;
  // Lane (c, me) copies its tokens straight into the receive list
  // (selfStep): no ring, no signal; the (me, c) receiver has no ring to
  // read and returns. (The own rows in the receiver CTA and the sender's
  // warps all on peers made 2 H200s' normal dispatch 3-6% slower:
  // docs/performance.md. One rank alone runs selfKernel instead.)
  if (int(blockIdx.x) < C) {
    const int c = int(blockIdx.x), w = int(threadIdx.x / 32), nw = int(blockDim.x / 32);
    const uint64_t selfBase = rs[size_t(me) * C + size_t(c)].base, selfKeep = rs[size_t(me) * C + size_t(c)].keep;
    bool ok = true;
    if (2 * R <= nw && R < 16) {  // span ids name named barriers 1..15
      const int g = nw / R, d = w / g;  // lane d: warps [d * g, d * g + g)
      if (d >= R) return;
      SendState s;
      if (l.ringPos && d != me) s.origin = s.sent = l.ringPos[size_t(c) * R + size_t(d)];
      const gin::CoopWarpSpan span(d * g, g, d);
      ok = spin(
          l.dc,
          [&] {
            return d == me ? selfStep(l, c, selfBase, s, recvX, recvMeta, span, selfKeep) : sendStep(l, c, d, s, span);
          },
          gin::Op::WaitSignal, d, uint64_t(l.sig.head(d, c)));
      if (ok && l.ringPos && d != me && span.rank() == 0) l.ringPos[size_t(c) * R + size_t(d)] = s.sent;
    } else {
      SendState s[kLanesPerWarp];  // per thread; the warp's copies move in step (see sendStep)
      int lanes = 0;
      for (int d = w; d < R && lanes < kLanesPerWarp; d += nw) ++lanes;
      if (lanes == 0) return;
      for (int i = 0; i < lanes; ++i)
        if (const int d = w + i * nw; l.ringPos && d != me)
          s[i].origin = s[i].sent = l.ringPos[size_t(c) * R + size_t(d)];
      ok = spin(
          l.dc,
          [&] {
            int r = -1;
            for (int i = 0; i < lanes; ++i) {
              const int d = w + i * nw;
              const gin::CoopWarp warp;
              const int q = d == me ? selfStep(l, c, selfBase, s[i], recvX, recvMeta, warp, selfKeep)
                                    : sendStep(l, c, d, s[i], warp);
              r = q > 0 ? 1 : (q == 0 && r < 0 ? 0 : r);
            }
            return r;
          },
          gin::Op::WaitSignal, -1, uint64_t(c));
      for (int i = 0; i < lanes; ++i)
        if (const int d = w + i * nw; ok && l.ringPos && d != me && threadIdx.x % 32 == 0)
          l.ringPos[size_t(c) * R + size_t(d)] = s[i].sent;
    }
    if (!ok && threadIdx.x % 32 == 0) ::atomicAdd(failed, 1);
  } else {
    const int i = int(blockIdx.x) - C, src = i / C, c = i % C;
    RecvState s = rs[size_t(i)];
    if (src == me) return;  // lane (c, me) fills its part of the list in the sender CTA
    uint64_t* pos = l.ringPos ? l.ringPos + size_t(R) * C + size_t(i) : nullptr;  // this receiver's ring position
    if (pos) {
      s.origin = *pos;
      s.got += s.origin;
      s.expect += s.origin;
    }
    const bool ok = spin(
        l.dc, [&] { return recvStep(l, src, c, s, recvX, recvMeta, gin::CoopBlock{}); }, gin::Op::WaitSignal, src,
        uint64_t(l.sig.tail(src, c)));
    if (!ok && threadIdx.x == 0) ::atomicAdd(failed, 1);
    if (ok && pos && threadIdx.x == 0) *pos = s.expect;
  }
}

// A rank alone (one rank): every row is its own, so the dispatch is a
// gather with nothing to wait for, run as a plain grid instead of the
// dispatch kernel's spinning senders and receivers: a warp per row, `per`
// warps sharing each lane (c, 0) (selfStep's parts). On one H200, 4096 rows
// of 14 KiB: 33.5-34.4 us against the dispatch kernel's 62.5-63, a plain
// gather of the same rows 33.4, cudaMemcpy of their bytes 30.5
// (docs/performance.md).
constexpr int kSelfThreads = 512;
__global__ void __launch_bounds__(kSelfThreads)
    selfKernel(Layer l, const RecvState* rs, void* recvX, char* recvMeta, int per) {
  const int warp = int((blockIdx.x * blockDim.x + threadIdx.x) / 32), C = l.shape.channels;
  if (warp >= per * C) return;
  const int c = warp % C;
  const RecvState r = rs[c];
  SendState s;
  while (selfStep(l, c, r.base, s, recvX, recvMeta, gin::CoopWarp{}, r.keep, warp / C, per) > 0) {
  }
}

// Step k of a walk over a receive list of n rows grouped by source rank,
// started (me + 1) / ranks of the way in: near the rows of source me + 1
// when the sources sent about as many rows each. A combine returns each row
// to its source; walked from the start on every rank, the list sends every
// rank's first rows to source 0, then to 1, ..., and one GPU's inbound
// links take the load while the others idle. Staggered, the ranks store to
// different GPUs at each moment (on 4 H200s the combine's wait for its rows
// fell from about 290 us to 15; docs/performance.md).
__device__ inline size_t staggeredRow(size_t k, size_t n, int me, int ranks) {
  return (k + n * size_t((me + 1) % ranks) / size_t(ranks)) % n;
}

// One warp per received position: the experts, then the return to the
// source (stored straight there over lsa, else put).
__global__ void expertCombineKernel(Layer l, const unsigned long long* total, const int* srcOf, const uint16_t* recvX,
                                    const char* recvMeta) {
  float* partial = static_cast<float*>(gin::localPointer(l.partial, 0));
  const size_t warps = size_t(gridDim.x) * (blockDim.x / 32), n = size_t(*total);
  for (size_t k = size_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; k < n; k += warps) {
    const size_t pos = staggeredRow(k, n, l.dc.rank, l.shape.ranks);
    expertAndReturn(l, pos, srcOf[pos], recvX, recvMeta, partial, gin::CoopWarp{});
  }
}

// One thread waits for `want` combine arrivals; the reduce kernel after it
// on the stream reads them (a kernel boundary orders its reads after the
// wait's acquire). Waiting in one CTA instead of in every reduce CTA keeps
// the GPU free for others: on the proxy, with ranks sharing a GPU, the
// engine's device-to-device copies need room on the SMs. `more`, when
// given, adds a device word to want (a count only the GPU knows).
__global__ void combineWaitKernel(Layer l, uint64_t want, int* failed, const unsigned long long* more = nullptr) {
  if (more) want += *more;
  if (!gin::Net<>(l.dc, 0).waitSignal(gin::CoopThread{}, l.sig.combine(), want)) ::atomicAdd(failed, 1);
}

// out[t] = sum of the token's rows (rows [t][0, rows[t]) of width H, each
// scaled by scale[t][j] when given; row j skipped where idx[t][j] is -1, no
// expert, when idx is given). Four floats per load where H allows, several
// in flight per thread (restrict: out aliases no input).
__global__ void reduceKernel(Layer l, const int* __restrict__ rows, int rowStride, const float* __restrict__ scale,
                             const int32_t* __restrict__ idx, float* __restrict__ out) {
  const size_t H = size_t(l.shape.hidden);
  const float* __restrict__ comb = static_cast<const float*>(gin::localPointer(l.combine, 0));
  const bool vec = H % 4 == 0;
  const size_t W = vec ? H / 4 : H;  // items per row
  for (size_t t = blockIdx.x; t < size_t(l.shape.tokens); t += gridDim.x) {
    const int n = rows ? rows[t] : rowStride;
    const float* row0 = comb + t * size_t(rowStride) * H;
#pragma unroll 4
    for (size_t i = threadIdx.x; i < W; i += blockDim.x) {
      if (vec) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int j = 0; j < n; ++j) {
          if (idx && idx[t * size_t(rowStride) + size_t(j)] < 0) continue;
          const float s = scale ? scale[t * size_t(rowStride) + size_t(j)] : 1.f;
          const float4 v = reinterpret_cast<const float4*>(row0 + size_t(j) * H)[i];
          acc.x += s * v.x;
          acc.y += s * v.y;
          acc.z += s * v.z;
          acc.w += s * v.w;
        }
        reinterpret_cast<float4*>(out + t * H)[i] = acc;
      } else {
        float acc = 0;
        for (int j = 0; j < n; ++j)
          if (!idx || idx[t * size_t(rowStride) + size_t(j)] >= 0)
            acc += (scale ? scale[t * size_t(rowStride) + size_t(j)] : 1.f) * row0[size_t(j) * H + i];
        out[t * H + i] = acc;
      }
    }
  }
}

// llSenders CTAs per expert; each warp puts a share of the expert's pairs,
// then one warp per CTA sends the count after a block barrier (the count's
// release covers every warp's stores; proxy and ibgda: its descriptor follows
// theirs on the expert's context).
__global__ void llDispatchKernel(Layer l) {
  const int S = l.shape.llSenders, e = int(blockIdx.x) / S, nw = int(blockDim.x / 32), w = int(threadIdx.x / 32);
  llDispatchExpert(l, e, (int(blockIdx.x) % S) * nw + w, S * nw, gin::CoopWarp{});
  __syncthreads();
  if (w == 0) llDispatchCount(l, e, gin::CoopWarp{});
}

// Ends once every token dispatched to this rank is here (see llWaitDispatch);
// the expert kernel after it finds its counts there.
__global__ void llWaitKernel(Layer l, int* failed) {
  if (!llWaitDispatch(l, gin::CoopBlock{}) && threadIdx.x == 0) ::atomicAdd(failed, 1);
}

// `split` CTAs per (local expert, source); every warp of them takes a share
// of that pair's tokens.
__global__ void llExpertKernel(Layer l, int split, int* failed) {
  const int pair = int(blockIdx.x) / split, el = pair / l.shape.ranks, src = pair % l.shape.ranks;
  const int nw = int(blockDim.x / 32), part = (int(blockIdx.x) % split) * nw + int(threadIdx.x / 32);
  if (!llExpertAndCombine(l, el, src, part, split * nw, gin::CoopWarp{}) && threadIdx.x % 32 == 0)
    ::atomicAdd(failed, 1);
}

__global__ void resetKernel(Layer l, uint32_t from, uint32_t to) {
  for (uint32_t s = from + threadIdx.x; s < to; s += blockDim.x) gin::Net<>(l.dc, 0).resetSignal(s);
}

__global__ void flushKernel(Layer l) { gin::Net<>(l.dc, int(blockIdx.x)).flush(gin::CoopThread{}); }

// Load every kernel now: with CUDA's lazy loading a kernel's first launch
// may wait for the device to go idle, which must not happen while a kernel
// of this or another rank spins on this one (nor inside a timed region of a
// caller).
inline void loadKernels() {
  cudaFuncAttributes a{};
  GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, countKernel));
  GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, layoutKernel));
  GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, dispatchKernel));
  GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, selfKernel));
  GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, expertCombineKernel));
  GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, combineWaitKernel));
  GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, reduceKernel));
  GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, llDispatchKernel));
  GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, llWaitKernel));
  GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, llExpertKernel));
  GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, resetKernel));
  GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, flushKernel));
}

// Grid sizes of a rank's kernels (sizing() below).
struct Sizing {
  int sharing = 1;      // ranks on this GPU
  int combineGrid = 1;  // CTAs of a warp-per-row combine kernel
  int llSplit = 1;      // CTAs per (local expert, source) in low-latency mode
  int sms = 1;          // of this GPU (one rank's selfKernel grid)
};

// How many ranks of the communicator run on this rank's GPU (collective).
inline int ranksOnThisGpu(gin::Comm& comm) {
  int dev = 0;
  GIN_CUDA_CHECK(cudaGetDevice(&dev));
  char bus[32] = {};
  GIN_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, dev));
  const size_t R = size_t(comm.nRanks());
  std::vector<char> buses(sizeof bus * R);
  std::memcpy(buses.data() + sizeof bus * size_t(comm.rank()), bus, sizeof bus);
  comm.bootstrap().allGather(buses.data(), sizeof bus);
  int n = 0;
  for (size_t r = 0; r < R; ++r) n += std::memcmp(buses.data() + sizeof bus * r, bus, sizeof bus) == 0;
  return n;
}

// Shape::channels 0 and Shape::slots 0 chosen for this GPU (collective):
// the dispatch kernel's C x (1 + R) spinning CTAs of every rank on this GPU
// within one per SM (half of them where a peer goes through the proxy or
// ibgda, whose host or NIC side needs room), at most 64 channels; rings of
// 32 slots (gin-bench moe, one H100: dispatch time falls with channels, and
// with slots up to 16); Shape::batch 0: GIN_EP_BATCH tokens per tail/head
// signal (default 1).
inline Shape autoShape(gin::Comm& comm, Shape sh) {
  if (sh.channels == 0) {
    int dev = 0, sms = 0;
    GIN_CUDA_CHECK(cudaGetDevice(&dev));
    GIN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    bool allLsa = true;
    for (int r = 0; r < comm.nRanks(); ++r) allLsa = allLsa && comm.transportTo(r) == gin::Transport::Lsa;
    const int budget = allLsa ? sms : sms / 2;
    sh.channels = std::min(64, std::max(1, budget / ((1 + sh.ranks) * ranksOnThisGpu(comm))));
  }
  if (sh.slots == 0) sh.slots = 32;
  if (sh.batch == 0) sh.batch = int(gin::env::integer("GIN_EP_BATCH").value_or(1));
  return sh;
}

// Launches the dispatch kernel, whose senders and receivers wait on each
// other, cooperatively (as DeepEP launches its kernels): CUDA starts all of
// its CTAs at once or refuses the launch, instead of running part of the
// grid while the rest waits for SMs behind other work (another stream's
// kernels, a tool that runs CTAs one after another). Its grid: C sender
// CTAs and R x C receivers. `sms`: the GPU's (Sizing::sms), for one rank's
// selfKernel.
inline void launchDispatchKernel(cudaStream_t st, const Layer& l, const RecvState* rs, void* recvX, char* recvMeta,
                                 int* failed, int sms) {
  if (l.shape.ranks == 1) {  // alone: selfKernel, a warp per row, 32 warps per SM
    const int C = l.shape.channels, per = std::max(1, sms * 32 / C), warps = kSelfThreads / 32;
    selfKernel<<<(per * C + warps - 1) / warps, kSelfThreads, 0, st>>>(l, rs, recvX, recvMeta, per);
    GIN_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int grid = l.shape.channels * (1 + l.shape.ranks);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(unsigned(kDispatchThreads));
  cfg.stream = st;
  cudaLaunchAttribute coop{};
  coop.id = cudaLaunchAttributeCooperative;
  coop.val.cooperative = 1;
  cfg.attrs = &coop;
  cfg.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, dispatchKernel, l, rs, recvX, recvMeta, failed);
  if (e != cudaSuccess)
    throw gin::Error(std::string("moe: the dispatch kernel (") + std::to_string(grid) + " CTAs of " +
                     std::to_string(kDispatchThreads) +
                     " threads, launched cooperatively: all resident at once) did not launch: " +
                     cudaGetErrorString(e) + "; use fewer channels");
}

// Grid sizes for a rank (collective: ranks compare GPUs). The dispatch
// kernel's senders and receivers wait on each other (and on other ranks'
// CTAs): all C + R x C CTAs must be resident at once, or the layer stalls
// until the timeout; a shape that cannot be is refused. The combine grids
// are sized so that all ranks on this GPU (tests share one GPU among ranks)
// together leave half of it free.
inline Sizing sizing(gin::Comm& comm, const Shape& sh, bool lowLatency, int threads) {
  const size_t R = size_t(sh.ranks), C = size_t(sh.channels);
  Sizing z;
  int dev = 0, sms = 0, perSm = 0;
  GIN_CUDA_CHECK(cudaGetDevice(&dev));
  GIN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  GIN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, dispatchKernel, kDispatchThreads, 0));
  z.sharing = ranksOnThisGpu(comm);
  z.sms = sms;
  if (!lowLatency && int(C + R * C) * z.sharing > perSm * sms)
    throw std::invalid_argument("moe: the dispatch kernel needs " + std::to_string(C + R * C) +
                                " resident CTAs (channels + ranks x channels) on each of " + std::to_string(z.sharing) +
                                " rank(s) of this GPU, which holds " + std::to_string(perSm * sms) +
                                "; use fewer channels");
  GIN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, expertCombineKernel, threads, 0));
  z.combineGrid = std::max(1, perSm * sms / (2 * z.sharing));
  GIN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, llExpertKernel, threads, 0));
  z.llSplit = std::max(1, perSm * sms / (2 * z.sharing) / std::max(1, sh.localExperts() * sh.ranks));
  return z;
}

// Device memory of a driver (GpuLayer, GpuBuffer): zeroed allocations
// freed together when it goes, and the scratch words its kernels report
// through (a failed wait, the receive count).
class DeviceAllocs {
 public:
  DeviceAllocs() { scratch_ = alloc(4096); }
  DeviceAllocs(const DeviceAllocs&) = delete;
  DeviceAllocs& operator=(const DeviceAllocs&) = delete;
  ~DeviceAllocs() {
    for (void* p : ps_) (void)cudaFree(p);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    GIN_CUDA_CHECK(cudaMalloc(&p, bytes));
    ps_.push_back(p);
    GIN_CUDA_CHECK(cudaMemset(p, 0, bytes));
    return p;
  }
  int* failed() const { return static_cast<int*>(scratch_); }
  unsigned long long* total() const { return word(1); }
  unsigned long long* word(int i) const { return reinterpret_cast<unsigned long long*>(scratch_) + i; }

 private:
  std::vector<void*> ps_;
  void* scratch_ = nullptr;
};

}  // namespace gpu

// Runs layers on one GPU rank, on `stream`. Collective like CpuLayer.
class GpuLayer {
 public:
  static constexpr int kThreads = 256;

  GpuLayer(gin::Comm& comm, const Shape& sh, bool lowLatency, cudaStream_t stream)
      : comm_(comm), sh_(sh), ll_(lowLatency), st_(stream), l_(openLayer(comm, sh, lowLatency, 0)) {
    const size_t T = size_t(sh.tokens), R = size_t(sh.ranks), C = size_t(sh.channels), E = size_t(sh.experts);
    const size_t H = size_t(sh.hidden), K = size_t(sh.topk);
    idx_ = static_cast<int32_t*>(alloc(std::max<size_t>(T * K * 4, 4)));
    w_ = static_cast<float*>(alloc(std::max<size_t>(T * K * 4, 4)));
    out_ = static_cast<float*>(alloc(std::max<size_t>(T * H * 4, 4)));
    rows_ = static_cast<int*>(alloc(std::max<size_t>(T * 4, 4)));
    sendList_ = static_cast<uint32_t*>(alloc(std::max<size_t>(std::max(C * R * sh.laneCap(), E * T) * 4, 4)));
    sendCount_ = static_cast<uint64_t*>(alloc(std::max(C * R, E) * 8));
    rs_ = static_cast<RecvState*>(alloc(R * C * sizeof(RecvState)));
    srcOf_ = static_cast<int*>(alloc(std::max<size_t>(R * T * 4, 4)));
    recvX_ = static_cast<uint16_t*>(alloc(std::max<size_t>(R * T * H * 2, 4)));
    recvMeta_ = static_cast<char*>(alloc(std::max<size_t>(R * T * sh.metaBytes(), 4)));
    l_.topkIdx = idx_;
    l_.topkW = w_;
    l_.sendList = sendList_;
    l_.sendCount = sendCount_;
    gpu::loadKernels();
    const gpu::Sizing z = gpu::sizing(comm, sh, lowLatency, kThreads);
    combineGrid_ = z.combineGrid;
    llSplit_ = z.llSplit;
    sms_ = z.sms;
  }
  GpuLayer(const GpuLayer&) = delete;
  GpuLayer& operator=(const GpuLayer&) = delete;
  ~GpuLayer() {
    (void)cudaStreamSynchronize(st_);
    closeLayer(comm_, l_);  // prints, never throws; mem_ frees the device memory after it
  }

  // Upload the inputs (not timed by callers that time run()).
  void prepare(const Inputs& in) {
    const Shape& sh = sh_;
    const size_t T = size_t(sh.tokens), K = size_t(sh.topk);
    plan_ = plan(l_, ll_, in);
    GIN_CUDA_CHECK(
        cudaMemcpyAsync(comm_.localPointer(l_.x), plan_.x.data(), plan_.x.size(), cudaMemcpyHostToDevice, st_));
    GIN_CUDA_CHECK(cudaMemcpyAsync(comm_.localPointer(l_.meta), plan_.meta.data(), plan_.meta.size(),
                                   cudaMemcpyHostToDevice, st_));
    GIN_CUDA_CHECK(cudaMemcpyAsync(idx_, in.idx.data(), T * K * 4, cudaMemcpyHostToDevice, st_));
    GIN_CUDA_CHECK(cudaMemcpyAsync(w_, in.weight.data(), T * K * 4, cudaMemcpyHostToDevice, st_));
    if (!ll_) {
      GIN_CUDA_CHECK(cudaMemcpyAsync(rows_, plan_.rows.data(), T * 4, cudaMemcpyHostToDevice, st_));
    }
    GIN_CUDA_CHECK(
        cudaMemcpyAsync(sendList_, plan_.sendList.data(), plan_.sendList.size() * 4, cudaMemcpyHostToDevice, st_));
    GIN_CUDA_CHECK(
        cudaMemcpyAsync(sendCount_, plan_.sendCount.data(), plan_.sendCount.size() * 8, cudaMemcpyHostToDevice, st_));
    GIN_CUDA_CHECK(cudaStreamSynchronize(st_));
    rearm();
  }

  // Signals back to zero on every rank before anyone sends (collective).
  // prepare() does it; after finish() or wait(), rearm() and launch() run
  // the same inputs again (gin-bench moe times layers that way).
  void rearm() {
    gpu::resetKernel<<<1, 256, 0, st_>>>(l_, 0, signalsNeeded(sh_));
    GIN_CUDA_CHECK(cudaGetLastError());
    GIN_CUDA_CHECK(cudaStreamSynchronize(st_));
    comm_.bootstrap().barrier();
  }

  // Dispatch, experts, combine, reduce: kernels on the stream. Call prepare()
  // (or rearm()) first on every rank; finish() or wait() waits and checks.
  // `dispatched`, when given, is recorded on the stream once every token
  // sent to this rank has arrived and before any expert runs (in low-latency
  // mode, after the one-CTA kernel that waits for that), so a caller can time
  // dispatch and combine apart.
  void launch(cudaEvent_t dispatched = nullptr) {
    const Shape& sh = sh_;
    const int R = sh.ranks;
    GIN_CUDA_CHECK(cudaMemsetAsync(failed(), 0, 4, st_));
    if (!ll_) {
      gpu::countKernel<<<1, kThreads, 0, st_>>>(l_);
      gpu::layoutKernel<<<1, kThreads, 0, st_>>>(l_, rs_, srcOf_, total(), failed(), uint64_t(R) * uint64_t(sh.tokens));
      gpu::launchDispatchKernel(st_, l_, rs_, recvX_, recvMeta_, failed(), sms_);
      if (dispatched) GIN_CUDA_CHECK(cudaEventRecord(dispatched, st_));
      gpu::expertCombineKernel<<<combineGrid_, kThreads, 0, st_>>>(l_, total(), srcOf_, recvX_, recvMeta_);
      gpu::combineWaitKernel<<<1, 1, 0, st_>>>(l_, plan_.combineArrivals, failed());
      gpu::reduceKernel<<<std::max(1, std::min(sh.tokens, 264)), kThreads, 0, st_>>>(l_, rows_, sh.maxDests(), nullptr,
                                                                                     nullptr, out_);
    } else {
      gpu::llDispatchKernel<<<sh.experts * sh.llSenders, kThreads, 0, st_>>>(l_);
      gpu::llWaitKernel<<<1, kThreads, 0, st_>>>(l_, failed());
      if (dispatched) GIN_CUDA_CHECK(cudaEventRecord(dispatched, st_));
      gpu::llExpertKernel<<<sh.localExperts() * R * llSplit_, kThreads, 0, st_>>>(l_, llSplit_, failed());
      gpu::combineWaitKernel<<<1, 1, 0, st_>>>(l_, plan_.combineArrivals, failed());
      gpu::reduceKernel<<<std::max(1, std::min(sh.tokens, 264)), kThreads, 0, st_>>>(l_, nullptr, sh.topk, w_, idx_,
                                                                                     out_);
    }
    gpu::flushKernel<<<l_.dc.nContexts, 1, 0, st_>>>(l_);
    GIN_CUDA_CHECK(cudaGetLastError());
  }

  // Waits for the layer and checks it; out[T][H] stays on the GPU.
  void wait() {
    const cudaError_t e = cudaStreamSynchronize(st_);
    comm_.check();
    GIN_CUDA_CHECK(e);
    int f = 0;
    GIN_CUDA_CHECK(cudaMemcpy(&f, failed(), 4, cudaMemcpyDeviceToHost));
    if (f) throw std::runtime_error("moe: a wait gave up on rank " + std::to_string(comm_.rank()));
    comm_.bootstrap().barrier();  // nobody resets signals for the next layer while a peer still signals
  }

  std::vector<float> finish() {
    wait();
    std::vector<float> out(size_t(sh_.tokens) * sh_.hidden);
    GIN_CUDA_CHECK(cudaMemcpy(out.data(), out_, out.size() * 4, cudaMemcpyDeviceToHost));
    return out;
  }

  std::vector<float> run(const Inputs& in) {
    prepare(in);
    launch();
    return finish();
  }

 private:
  gin::Comm& comm_;
  Shape sh_;
  bool ll_;
  cudaStream_t st_;
  Layer l_;
  int combineGrid_ = 1, llSplit_ = 1, sms_ = 1;
  Plan plan_;
  gpu::DeviceAllocs mem_;
  int32_t* idx_ = nullptr;
  float *w_ = nullptr, *out_ = nullptr;
  int* rows_ = nullptr;
  uint32_t* sendList_ = nullptr;
  uint64_t* sendCount_ = nullptr;
  RecvState* rs_ = nullptr;
  int* srcOf_ = nullptr;
  uint16_t* recvX_ = nullptr;
  char* recvMeta_ = nullptr;

  void* alloc(size_t bytes) { return mem_.alloc(bytes); }
  int* failed() const { return mem_.failed(); }
  unsigned long long* total() const { return mem_.total(); }
};

}  // namespace gin::ep
#endif  // defined(__CUDACC__)
