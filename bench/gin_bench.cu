// gin-bench — gin's benchmark program: bandwidth of puts, signal round-trip
// latency and barrier latency over the lsa transport, the proxy's descriptor
// rate, the ring AllReduce, p2p send/recv and the MoE dispatch/combine of
// gin::ep, between GPUs of one host (one process, one thread and one
// gin::Comm per GPU) or between CPU ranks (threads) running the same device API.
//
//   gin-bench OP [--transport lsa|proxy|ibgda] [--ranks N] [--emulate] [--sizes MIN:MAX]
//                [--iters K] [--json FILE] [--no-nccl] [--channels N]
//                [--mode normal|ll|both] [--tokens T] [--hidden H] [--batch B] [--slots S]
//   OP: put-bw | signal-lat | barrier | msg-rate | allreduce | sendrecv | moe
//
// Every op first checks that what it times did the right thing (bytes,
// signal values, barrier ordering) and exits 1 if not, so a fast wrong number
// is never printed. The kernels' bodies are GIN_HD functions, so the CPU
// emulation times the same gin code the GPUs run (only the clock differs).
//
// This file is compiled by nvcc (GPU + CPU paths) and, through
// gin_bench_cpu.cpp, by a plain C++ compiler (CPU path only): everything that
// touches CUDA sits under __CUDACC__.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gin/gin.hpp"
// The transports' counters (msg-rate): gin internals, not the user API.
#include "gin/host/test_access.hpp"
// The MoE layer is gin::ep's own code (device bodies, CPU driver, host
// reference), not a copy: gin-bench moe times exactly what the library runs.
#include "gin/ep/cpu.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include "gin/ep/gpu.hpp"
#if defined(GIN_BENCH_HAVE_NCCL) && GIN_BENCH_HAVE_NCCL
// NCCL's device headers trip -Wunused-parameter in the host pass; not ours to fix.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <nccl.h>
#include <nccl_device.h>
#pragma GCC diagnostic pop
#define GIN_BENCH_NCCL 1
#endif
#endif
#ifndef GIN_BENCH_NCCL
#define GIN_BENCH_NCCL 0
#endif

namespace bench {

using gin::Window;

// ---------------------------------------------------------------------------
// Constants that shape the measurements (printed in the method section).

constexpr uint32_t kSigVerify = 0;  // put-bw: the verification put's signal
constexpr uint32_t kSigTimed = 1;   // put-bw: the timed puts' signals (counted afterwards)
constexpr uint32_t kSigPing = 2;    // signal-lat
constexpr uint32_t kSigMsg = 3;     // msg-rate
constexpr size_t kGuard = 64;       // bytes after each put's destination that must stay poisoned
constexpr uint8_t kPoison = 0xAB;
constexpr int kBlockThreads = 512;         // put-bw block coop
constexpr size_t kBytesPerCta = 32 << 10;  // put-bw block coop: one CTA per 32 KiB, up to one per SM
constexpr int kCpuCtas = 132;              // CPU emulation: CTA count of an H100 SXM
constexpr int kBarrierThreads = 256;
constexpr int kBarrierCtas[] = {1, 32, 132};
constexpr double kSlowPutS = 0.25;  // a coop whose single put takes longer stops at that size
constexpr int kPutRuns = 3, kLatRuns = 5, kBarRuns = 5;
constexpr int kArRuns = 5;                       // allreduce: timed runs per size (median)
constexpr uint32_t kArSignalBase = 64;           // allreduce: the ring's signal ids (4 per block)
constexpr uint32_t kArMaxBlocks = 32;            // allreduce: the workspace's most blocks (the plans use 16 or 32)
constexpr int kSrRuns = 5;                       // sendrecv: timed runs per size (median)
constexpr int kSrThreads = 512;                  // sendrecv: threads of each sending or receiving CTA
constexpr int kSrMaxChannelsGpu = 32;            // sendrecv: most channels (CTA pairs), GPUs
constexpr int kSrMaxChannelsCpu = 2;             // sendrecv: most channels, CPU ranks
constexpr size_t kSrBytesPerChannel = 64 << 10;  // sendrecv: one channel per 64 KiB, up to the most
constexpr uint64_t kSrChunkGpu = 128 << 10;      // sendrecv: FIFO slot (one step), GPUs (NCCL's p2p chunk)
constexpr uint64_t kSrChunkCpu = 32 << 10;       // sendrecv: FIFO slot, CPU ranks
constexpr uint32_t kSrSlots = 8;                 // sendrecv: FIFO depth (NCCL_STEPS)
constexpr int kMoeExpertsPerRank = 8;
constexpr int kMoeTopk = 8;

enum class Op { PutBw, SignalLat, Barrier, MsgRate, AllReduce, SendRecv, Moe };
enum class CoopKind { Thread = 0, Warp = 1, Block = 2 };
constexpr const char* kCoopNames[] = {"thread", "warp", "block"};

struct Shape {
  int ctas, threads;
};

// ---------------------------------------------------------------------------
// Device-API bodies: one definition, run by a GPU kernel or a CPU rank.

// A byte pattern that differs every 8 bytes and by seed, so a shifted, stale
// or partial copy does not pass.
GIN_HD inline uint8_t patternByte(uint64_t seed, size_t i) {
  uint64_t x = (uint64_t(i) >> 3) * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return uint8_t(x >> (8 * (i & 7)));
}

// CTA `part` of `nParts` moves a contiguous, 16-byte aligned share.
struct Share {
  size_t off, len;
};
GIN_HD inline Share shareOf(size_t bytes, int part, int nParts) {
  size_t per = (bytes + size_t(nParts) - 1) / size_t(nParts);
  per = (per + 15) & ~size_t(15);
  size_t off = size_t(part) * per;
  if (off > bytes) off = bytes;
  return Share{off, per < bytes - off ? per : bytes - off};
}

// One put of this part's share from rank 0's src to rank 1's dst, with a
// remote SignalInc so it is a complete, observable transfer (the signal's
// system-scope release is what makes the payload visible).
//
// Large transfers are cut into kChunk pieces dealt round-robin to the CTAs
// (CTA b moves chunks b, b+G, b+2G, ...), so at any moment the CTAs work on
// neighbouring addresses; one contiguous share per CTA puts all CTAs on
// addresses a share apart, which measured ~6% slower on H200 NVLink at
// >= 256 MiB. Only each CTA's last put carries the SignalInc: it is ordered
// after the CTA's earlier puts to the same peer on the same context.
inline constexpr size_t kChunk = 64 << 10;
// B: the transports compiled into the Net (gin::kBackendLsa, or
// kBackendProxy for --transport proxy), so the lsa numbers carry no dispatch.
template <unsigned B, class Coop>
GIN_HD inline void putShare(const gin::DevComm& dc, Window dst, Window src, size_t bytes, int part, int nParts,
                            uint32_t sig, Coop coop) {
  gin::Net<B> net(dc, 0);
  const gin::Team world = gin::teamWorld(dc);
  const size_t nChunks = (bytes + kChunk - 1) / kChunk;
  if (nParts > 1 && nChunks >= 2 * size_t(nParts)) {
    size_t c = size_t(part);
    for (; c + size_t(nParts) < nChunks; c += size_t(nParts))
      net.put(world, 1, dst, c * kChunk, src, c * kChunk, kChunk, gin::None{}, gin::None{}, coop);
    const size_t off = c * kChunk, len = bytes - off < kChunk ? bytes - off : kChunk;
    net.put(world, 1, dst, off, src, off, len, gin::SignalInc{sig}, gin::None{}, coop);
    return;
  }
  const Share s = shareOf(bytes, part, nParts);
  net.put(world, 1, dst, s.off, src, s.off, s.len, gin::SignalInc{sig}, gin::None{}, coop);
}

// Ping-pong between world ranks 0 and 1 on signal kSigPing, one thread each.
// Rank 0 signals and waits for the answer; rank 1 waits and answers. After
// the call both ranks' kSigPing equal base + iters. *steadyNs: time from the
// end of the first round trip to the end of the last (rank 0), so it excludes
// any skew between the two ranks' start.
// mode 0: signal() releases and waitSignal() acquires (the general case).
// mode 1: the caller has nothing of its own to publish, so it tells signal()
//   it already released (alreadyReleased = Scope::System): no release fence.
// mode 2: as 1, and the wait is relaxed too (nothing to acquire): the pure
//   signal latency.
template <unsigned B>
GIN_HD inline bool pingPong(const gin::DevComm& dc, int iters, uint64_t base, uint64_t* steadyNs, int mode) {
  gin::Net<B> net(dc, 0);
  const gin::Team world = gin::teamWorld(dc);
  const bool initiator = dc.rank == 0;
  const int peer = initiator ? 1 : 0;
  const gin::Scope released = mode >= 1 ? gin::Scope::System : gin::Scope::Thread;
  const gin::MemoryOrder waitOrder = mode == 2 ? gin::MemoryOrder::Relaxed : gin::MemoryOrder::Acquire;
  uint64_t t0 = 0;
  bool ok = true;
  for (int i = 0; i < iters && ok; ++i) {
    if (initiator) net.signal(world, peer, gin::SignalInc{kSigPing}, gin::CoopThread{}, released);
    ok = net.waitSignal(gin::CoopThread{}, kSigPing, base + uint64_t(i) + 1, 64, waitOrder);
    if (!initiator) net.signal(world, peer, gin::SignalInc{kSigPing}, gin::CoopThread{}, released);
    if (i == 0) t0 = gin::nowNs();
  }
  *steadyNs = gin::nowNs() - t0;
  return ok;
}

// msg-rate: one producer (a thread, or lane 0 of a warp) pushes `count`
// SignalAdd descriptors to `peer` on context `ctx`, nothing to publish
// (alreadyReleased), then flushes: it returns once the engine consumed them.
GIN_HD inline bool msgBurst(const gin::DevComm& dc, int ctx, int peer, int count) {
  gin::Net<gin::kBackendProxy> net(dc, ctx);
  for (int i = 0; i < count; ++i)
    net.signal(gin::teamWorld(dc), peer, gin::SignalAdd{kSigMsg, 1}, gin::CoopThread{}, gin::Scope::System);
  return net.flush(gin::CoopThread{});
}

// msg-rate over ibgda: one producer thread posts `count` SignalAdd WQEs
// (fetch-add; nothing to publish) to `peer` on context `ctx`, then flushes:
// it returns once the NIC completed them.
GIN_HD inline bool postBurst(const gin::DevComm& dc, int ctx, int peer, int count) {
  gin::Net<gin::kBackendIbgda> net(dc, ctx);
  for (int i = 0; i < count; ++i)
    net.signal(gin::teamWorld(dc), peer, gin::SignalAdd{kSigMsg, 1}, gin::CoopThread{}, gin::Scope::System);
  return net.flush(gin::CoopThread{});
}

// msg-rate latency: one descriptor at a time, from the push to the moment the
// producer sees the engine's consumer index pass it (flush). Sum of ns.
// *pushNs: the part of it spent in the push itself (until signal() returns).
GIN_HD inline bool msgLatency(const gin::DevComm& dc, int peer, int iters, uint64_t* sumNs, uint64_t* pushNs) {
  gin::Net<gin::kBackendProxy> net(dc, 0);
  uint64_t sum = 0, push = 0;
  bool ok = true;
  for (int i = 0; i < iters && ok; ++i) {
    const uint64_t t0 = gin::nowNs();
    net.signal(gin::teamWorld(dc), peer, gin::SignalAdd{kSigMsg, 1}, gin::CoopThread{}, gin::Scope::System);
    const uint64_t t1 = gin::nowNs();
    ok = net.flush(gin::CoopThread{});
    sum += gin::nowNs() - t0;
    push += t1 - t0;
  }
  *sumNs = sum;
  *pushNs = push;
  return ok;
}

// The hardware floor under that latency: the producer stores a sequence
// number into a host word (system-scope release, as a push publishes its
// descriptor), a host thread spinning on that word echoes it into a second
// one, and the producer polls the echo (system-scope acquire, as flush polls
// the consumer index). No gin code: the same memory, the same two PCIe trips.
GIN_HD inline uint64_t rawEcho(uint64_t* ping, const uint64_t* pong, int iters) {
  const uint64_t t0 = gin::nowNs();
  for (int i = 1; i <= iters; ++i) {
    gin::atomicStore<gin::Scope::System>(ping, uint64_t(i), gin::MemoryOrder::Release);
    while (gin::atomicLoad<gin::Scope::System>(pong, gin::MemoryOrder::Acquire) != uint64_t(i)) {
    }
  }
  return gin::nowNs() - t0;
}

// The host side of rawEcho: echoes ping into pong until it saw `iters`.
inline void rawEchoResponder(const uint64_t* ping, uint64_t* pong, int iters) {
  uint64_t last = 0;
  while (last != uint64_t(iters)) {
    const uint64_t v = gin::atomicLoad<gin::Scope::System>(ping, gin::MemoryOrder::Acquire);
    if (v != last) {
      gin::atomicStore<gin::Scope::System>(pong, v, gin::MemoryOrder::Release);
      last = v;
    }
  }
}

// Barrier check, around one sync of barrier index b (of nB): before the sync
// each rank writes `value` into its slot at every peer (putValue, no signal);
// after it, every peer's value must be in this rank's slots. Two slot sets
// alternate by parity, so a peer that runs ahead to the next iteration cannot
// overwrite a slot before it was read.
GIN_HD inline size_t barrierSlot(int parity, uint32_t b, uint32_t nB, int n, int from) {
  return ((size_t(parity) * nB + b) * size_t(n) + size_t(from)) * sizeof(uint64_t);
}
template <class Coop>
GIN_HD inline void barrierWrite(const gin::DevComm& dc, Window w, uint32_t b, uint32_t nB, uint64_t value, Coop coop) {
  gin::Net<gin::kBackendLsa> net(dc, 0);
  const gin::Team lsa = gin::teamLsa(dc);
  const size_t off = barrierSlot(int(value & 1), b, nB, lsa.nRanks, lsa.rank);
  for (int p = coop.rank(); p < lsa.nRanks; p += coop.size())
    if (p != lsa.rank) net.putValue(lsa, p, w, off, value, gin::None{}, gin::CoopThread{});
}
template <class Coop>
GIN_HD inline uint64_t barrierRead(const gin::DevComm& dc, Window w, uint32_t b, uint32_t nB, uint64_t value,
                                   Coop coop) {
  const gin::Team lsa = gin::teamLsa(dc);
  uint64_t bad = 0;
  for (int p = coop.rank(); p < lsa.nRanks; p += coop.size()) {
    if (p == lsa.rank) continue;
    const auto* slot =
        static_cast<const uint64_t*>(gin::localPointer(w, barrierSlot(int(value & 1), b, nB, lsa.nRanks, p)));
    bad += gin::volatileLoad(slot) != value;
  }
  return bad;
}

// allreduce: rank `rank`'s float i, small integers so the sum is exact in
// any order; the expected result sums them over the ranks.
GIN_HD inline float arInput(uint64_t seed, int rank, size_t i) {
  return float(int((uint64_t(rank) * 7 + i * 13 + (i >> 5) + seed) % 41) - 20);
}
GIN_HD inline float arExpected(uint64_t seed, int nRanks, size_t i) {
  float v = 0;
  for (int r = 0; r < nRanks; ++r) v += arInput(seed, r, i);
  return v;
}

// sendrecv: a ring shift, every rank sends `bytes` from its src window to
// rank + 1 and receives as many from rank - 1 into its dst window, cut into
// nCh contiguous shares, one per p2p channel (its own connector and FIFO
// ring, as NCCL spreads a send over channels). B: the backend the transport
// needs (lsa, proxy or ibgda), so a Net carries no dispatch.
template <unsigned B, class Coop>
GIN_HD inline bool shiftSend(const gin::DevComm& dc, const gin::p2p::Fifo& f, Window src, size_t bytes, int c, int nCh,
                             Coop coop) {
  const Share s = shareOf(bytes, c, nCh);
  const gin::p2p::Endpoint<B> ep(gin::Net<B>(dc, c % dc.nContexts), f, c);
  return ep.send(coop, (dc.rank + 1) % dc.nRanks, src, s.off, s.len);
}
template <unsigned B, class Coop>
GIN_HD inline bool shiftRecv(const gin::DevComm& dc, const gin::p2p::Fifo& f, Window dst, size_t bytes, int c, int nCh,
                             Coop coop) {
  const Share s = shareOf(bytes, c, nCh);
  const gin::p2p::Endpoint<B> ep(gin::Net<B>(dc, c % dc.nContexts), f, c);
  return ep.recv(coop, (dc.rank + dc.nRanks - 1) % dc.nRanks, gin::localPointer(dst, s.off), s.len);
}
// A single thread cannot run a send and a recv at once; sendRecv interleaves
// their steps (deadlock-free around the ring). The CPU rank's form.
template <unsigned B, class Coop>
GIN_HD inline bool shiftSendRecv(const gin::DevComm& dc, const gin::p2p::Fifo& f, Window src, Window dst, size_t bytes,
                                 int c, int nCh, Coop coop) {
  const Share s = shareOf(bytes, c, nCh);
  const gin::p2p::Endpoint<B> ep(gin::Net<B>(dc, c % dc.nContexts), f, c);
  return ep.sendRecv(coop, (dc.rank + 1) % dc.nRanks, src, s.off, s.len, (dc.rank + dc.nRanks - 1) % dc.nRanks,
                     gin::localPointer(dst, s.off), s.len);
}

// ---------------------------------------------------------------------------
// Kernels.

#if defined(__CUDACC__)
template <unsigned B, class Coop>
__global__ void putKernel(gin::DevComm dc, Window dst, Window src, size_t bytes, int iters, uint32_t sig) {
  for (int i = 0; i < iters; ++i) putShare<B>(dc, dst, src, bytes, int(blockIdx.x), int(gridDim.x), sig, Coop{});
  // Over the proxy a put returns once queued: the kernel (and the timer) ends
  // when the engine has carried every put out and applied its signal.
  (void)gin::Net<B>(dc, 0).flush(Coop{});
}

// Lane 0 of every warp is a producer, on context (global warp index) % nContexts.
__global__ void msgBurstKernel(gin::DevComm dc, int peer, int count, unsigned long long* failed) {
  if (threadIdx.x % 32 != 0) return;
  const int w = int(blockIdx.x) * int(blockDim.x / 32) + int(threadIdx.x / 32);
  if (!msgBurst(dc, w % dc.nContexts, peer, count)) atomicAdd(failed, 1ull);
}

// Every thread of the launch is a producer, on context (global thread index) % nContexts.
__global__ void postBurstKernel(gin::DevComm dc, int peer, int count, unsigned long long* failed) {
  const int t = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (!postBurst(dc, t % dc.nContexts, peer, count)) atomicAdd(failed, 1ull);
}

__global__ void msgLatencyKernel(gin::DevComm dc, int peer, int iters, unsigned long long* out) {
  uint64_t ns = 0, push = 0;
  out[0] = msgLatency(dc, peer, iters, &ns, &push) ? 1 : 0;
  out[1] = ns;
  out[2] = push;
}

__global__ void rawEchoKernel(uint64_t* ping, const uint64_t* pong, int iters, unsigned long long* out) {
  out[0] = rawEcho(ping, pong, iters);
}

__global__ void fillKernel(uint8_t* p, size_t bytes, uint64_t seed) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
    p[i] = patternByte(seed, i);
}

// Mismatches in [0, bytes) against the pattern and in [bytes, bytes+guard)
// against the poison.
__global__ void verifyKernel(const uint8_t* p, size_t bytes, size_t guard, uint64_t seed, unsigned long long* bad) {
  unsigned long long n = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes + guard; i += size_t(gridDim.x) * blockDim.x)
    n += p[i] != (i < bytes ? patternByte(seed, i) : kPoison);
  if (n) atomicAdd(bad, n);
}

__global__ void waitSignalKernel(gin::DevComm dc, uint32_t sig, uint64_t least, unsigned long long* failed) {
  gin::Net<gin::kBackendLsa> net(dc, 0);
  if (!net.waitSignal(gin::CoopThread{}, sig, least)) *failed = 1;
}

__global__ void resetSignalKernel(gin::DevComm dc, uint32_t sig) { gin::Net<gin::kBackendLsa>(dc, 0).resetSignal(sig); }

__global__ void readSignalKernel(gin::DevComm dc, uint32_t sig, unsigned long long* out) {
  *out = gin::Net<gin::kBackendLsa>(dc, 0).readSignal(sig);
}

template <unsigned B>
__global__ void pingKernel(gin::DevComm dc, int iters, uint64_t base, int mode, unsigned long long* out) {
  uint64_t ns = 0;
  out[0] = pingPong<B>(dc, iters, base, &ns, mode) ? 1 : 0;
  out[1] = ns;
}

__global__ void ginBarrierKernel(gin::DevComm dc, int iters, unsigned long long* failed) {
  gin::LsaBarrierSession<gin::CoopBlock> bar(gin::CoopBlock{}, dc, blockIdx.x);
  bool ok = true;
  // No early exit: every thread must reach every __syncthreads inside sync().
  for (int i = 0; i < iters; ++i) ok = bar.sync(gin::CoopBlock{}) && ok;
  if (!ok) atomicAdd(failed, 1ull);
}

__global__ void ginBarrierCheckKernel(gin::DevComm dc, Window w, int iters, uint64_t base, unsigned long long* bad) {
  gin::LsaBarrierSession<gin::CoopBlock> bar(gin::CoopBlock{}, dc, blockIdx.x);
  unsigned long long n = 0;
  for (int i = 0; i < iters; ++i) {
    const uint64_t v = base + uint64_t(i) + 1;
    barrierWrite(dc, w, blockIdx.x, gridDim.x, v, gin::CoopBlock{});
    n += bar.sync(gin::CoopBlock{}) ? 0 : 1;
    n += barrierRead(dc, w, blockIdx.x, gridDim.x, v, gin::CoopBlock{});
  }
  if (n) atomicAdd(bad, n);
}

// One ring shift: CTAs 0..nCh-1 send channel c's share, CTAs nCh..2nCh-1
// receive it (separate coops, as NCCL runs send and recv warps).
template <unsigned B>
__global__ void ringShiftKernel(gin::DevComm dc, gin::p2p::Fifo f, Window src, Window dst, size_t bytes, int nCh,
                                unsigned long long* failed) {
  const int c = int(blockIdx.x) % nCh;
  const bool ok = int(blockIdx.x) < nCh ? shiftSend<B>(dc, f, src, bytes, c, nCh, gin::CoopBlock{})
                                        : shiftRecv<B>(dc, f, dst, bytes, c, nCh, gin::CoopBlock{});
  if (!ok && threadIdx.x == 0) atomicAdd(failed, 1ull);
}

__global__ void arFillKernel(float* p, size_t count, int rank, uint64_t seed) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    p[i] = arInput(seed, rank, i);
}

// Wrong floats in [0, count) and non-poison bytes in the `guard` bytes after.
__global__ void arCheckKernel(const float* p, size_t count, int nRanks, uint64_t seed, size_t guard,
                              unsigned long long* bad) {
  unsigned long long n = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    n += p[i] != arExpected(seed, nRanks, i);
  const uint8_t* g = reinterpret_cast<const uint8_t*>(p + count);
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < guard; i += size_t(gridDim.x) * blockDim.x)
    n += g[i] != kPoison;
  if (n) atomicAdd(bad, n);
}

#if GIN_BENCH_NCCL
__global__ void ncclBarrierKernel(ncclDevComm ndc, int iters) {
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), ndc, ncclTeamTagLsa(), blockIdx.x);
  for (int i = 0; i < iters; ++i) bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

// The same check as ginBarrierCheckKernel with NCCL's barrier between the
// writes (into a gin window, through lsa pointers) and the reads.
__global__ void ncclBarrierCheckKernel(ncclDevComm ndc, gin::DevComm dc, Window w, int iters, uint64_t base,
                                       unsigned long long* bad) {
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), ndc, ncclTeamTagLsa(), blockIdx.x);
  unsigned long long n = 0;
  for (int i = 0; i < iters; ++i) {
    const uint64_t v = base + uint64_t(i) + 1;
    barrierWrite(dc, w, blockIdx.x, gridDim.x, v, gin::CoopBlock{});
    bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
    n += barrierRead(dc, w, blockIdx.x, gridDim.x, v, gin::CoopBlock{});
  }
  if (n) atomicAdd(bad, n);
}
#endif
#endif  // __CUDACC__

// ---------------------------------------------------------------------------
// Small host utilities.

struct Failure : std::runtime_error {  // a verification failure: exit 1
  using std::runtime_error::runtime_error;
};

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

std::string sizeName(uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return std::to_string(b >> 30) + " GiB";
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Collectives on plain values through the communicator's bootstrap.
template <class T>
T bcast(gin::Comm& c, T v, int root) {
  c.bootstrap().broadcast(&v, sizeof v, root);
  return v;
}
template <class T>
std::vector<T> allGather(gin::Comm& c, T v) {
  std::vector<T> all(size_t(c.nRanks()));
  all[size_t(c.rank())] = v;
  c.bootstrap().allGather(all.data(), sizeof(T));
  return all;
}

// A tiny JSON tree (objects keep insertion order).
struct J {
  enum class T { Null, Bool, Num, Str, Arr, Obj } t = T::Null;
  bool b = false;
  double n = 0;
  std::string s;
  std::vector<std::string> keys;
  std::vector<J> vals;

  static J num(double v) {
    J j;
    j.t = T::Num;
    j.n = v;
    return j;
  }
  static J str(std::string v) {
    J j;
    j.t = T::Str;
    j.s = std::move(v);
    return j;
  }
  static J boolean(bool v) {
    J j;
    j.t = T::Bool;
    j.b = v;
    return j;
  }
  static J arr() {
    J j;
    j.t = T::Arr;
    return j;
  }
  static J obj() {
    J j;
    j.t = T::Obj;
    return j;
  }
  J& set(std::string k, J v) {
    keys.push_back(std::move(k));
    vals.push_back(std::move(v));
    return *this;
  }
  J& set(std::string k, double v) { return set(std::move(k), num(v)); }
  J& set(std::string k, const char* v) { return set(std::move(k), str(v)); }
  J& set(std::string k, const std::string& v) { return set(std::move(k), str(v)); }
  J& push(J v) {
    vals.push_back(std::move(v));
    return *this;
  }

  static void quote(std::string& o, const std::string& v) {
    o += '"';
    for (unsigned char ch : v) {
      if (ch == '"' || ch == '\\') {
        o += '\\';
        o += char(ch);
      } else if (ch == '\n')
        o += "\\n";
      else if (ch < 0x20)
        o += fmt("\\u%04x", ch);
      else
        o += char(ch);
    }
    o += '"';
  }
  void write(std::string& o, int ind) const {
    const std::string pad(size_t(ind + 2), ' '), end(size_t(ind), ' ');
    switch (t) {
      case T::Null: o += "null"; break;
      case T::Bool: o += b ? "true" : "false"; break;
      case T::Num:
        if (!std::isfinite(n))
          o += "null";
        else if (n == std::floor(n) && std::fabs(n) < 9e15)
          o += fmt("%.0f", n);
        else
          o += fmt("%.6g", n);
        break;
      case T::Str: quote(o, s); break;
      case T::Arr:
      case T::Obj: {
        const bool isObj = t == T::Obj;
        o += isObj ? "{" : "[";
        for (size_t i = 0; i < vals.size(); ++i) {
          o += i ? ",\n" : "\n";
          o += pad;
          if (isObj) {
            quote(o, keys[i]);
            o += ": ";
          }
          vals[i].write(o, ind + 2);
        }
        if (!vals.empty()) {
          o += "\n";
          o += end;
        }
        o += isObj ? "}" : "]";
        break;
      }
    }
  }
};

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  void print() const {
    std::vector<size_t> w(header.size());
    for (size_t c = 0; c < header.size(); ++c) w[c] = header[c].size();
    for (auto& r : rows)
      for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
    auto line = [&](const std::vector<std::string>& r) {
      std::string o = " ";
      for (size_t c = 0; c < w.size(); ++c) {
        const std::string cell = c < r.size() ? r[c] : "";
        const std::string fill(w[c] - std::min(w[c], cell.size()), ' ');
        o += "  " + (c == 0 ? cell + fill : fill + cell);
      }
      std::printf("%s\n", o.c_str());
    };
    line(header);
    std::string rule = " ";
    for (size_t c = 0; c < w.size(); ++c) rule += "  " + std::string(w[c], '-');
    std::printf("%s\n", rule.c_str());
    for (auto& r : rows) line(r);
  }
};

// What rank 0 prints and writes.
struct Report {
  std::vector<std::string> head, method, notes;
  Table table;
  J json = J::obj();
};

// ---------------------------------------------------------------------------
// Options.

struct Options {
  Op op = Op::PutBw;
  std::string opName;
  std::string transport = "lsa";
  bool transportGiven = false;
  int ranks = 0;  // 0: default
  bool emulate = false;
  bool sizesGiven = false;
  uint64_t minSize = 8, maxSize = 0;
  long iters = 0;  // 0: default
  std::string json;
  bool noNccl = false;
  int channels = 0;            // sendrecv: most channels; moe: normal mode's channels; 0: default
  std::string mode = "both";   // moe: normal, ll or both
  int tokens = 0, hidden = 0;  // moe: 0: default
  int batch = 1;               // moe: normal mode's slots per tail/head signal
  int slots = 0;               // moe: normal mode's ring slots; 0: default
  bool modeGiven = false, tokensGiven = false;
};

const char* kUsage =
    "usage: gin-bench OP [--transport lsa|proxy|ibgda] [--ranks N] [--emulate] [--sizes MIN:MAX] [--iters K]\n"
    "                    [--json FILE] [--no-nccl]\n"
    "  OP            put-bw | signal-lat | barrier | msg-rate (descriptors/s into the proxy) |\n"
    "                allreduce (ring AllReduce, float sum, next to ncclAllReduce on GPUs) |\n"
    "                sendrecv (p2p send/recv ring shift, next to ncclSend/ncclRecv on GPUs) |\n"
    "                moe (gin::ep dispatch and combine, next to an NCCL send/recv all-to-all)\n"
    "  --transport   lsa (default) or proxy (every peer through the proxy engine; msg-rate\n"
    "                uses it unless told ibgda). With proxy, ranks may share a GPU (--ranks > GPUs)\n"
    "                ibgda: msg-rate (the WQE post rate into the soft NIC in sink mode) and\n"
    "                sendrecv (through the soft NIC); GIN_IBGDA_DEVICE picks another NIC\n"
    "  --ranks N     GPUs: default all visible (one host thread + gin::Comm per GPU);\n"
    "                --emulate: CPU ranks as threads, default 2\n"
    "  --emulate     run CPU ranks (threads) through the same gin device API; also the\n"
    "                fallback when no GPU is visible. Numbers are CPU numbers.\n"
    "  --sizes A:B   put-bw, allreduce, sendrecv: powers of two from A to B bytes (suffixes K, M, G =\n"
    "                KiB, MiB, GiB); put-bw default 8:1G on GPUs, 8:16M emulated; allreduce and\n"
    "                sendrecv 4K:1G, 4K:1M emulated\n"
    "  --iters K     put-bw: at most K puts per timed kernel (default 1000); allreduce, sendrecv:\n"
    "                operations per timed run (default by size); moe: timed layers (default 20,\n"
    "                emulated 3); signal-lat: round trips\n"
    "                per run (default 10000, emulated 2000); barrier: syncs per run (default\n"
    "                10000, emulated 1000)\n"
    "  --json FILE   also write the results as JSON\n"
    "  --no-nccl     do not set up NCCL for the barrier, allreduce, sendrecv and moe comparisons\n"
    "  --channels N  sendrecv: the most p2p channels (CTA pairs) a transfer is spread over (default\n"
    "                32, emulated 2); moe: channels of the normal mode (default 132 / (1 + ranks),\n"
    "                at most 64; half that over proxy or ibgda; emulated 2)\n"
    "  --mode M      moe: normal (4096 tokens per rank), ll (low latency, 128 tokens) or both (default)\n"
    "  --tokens T    moe: tokens per rank (default by mode; emulated 256 normal, 32 ll)\n"
    "  --hidden H    moe: hidden size in bf16 elements (default 7168, emulated 1024)\n"
    "  --batch B     moe: normal mode advances ring tails and heads every B slots (default 1:\n"
    "                every step; at most the ring's slots are useful)\n"
    "  --slots S     moe: normal mode's ring slots per (source, channel) (default 32, emulated 4)\n";

[[noreturn]] void usageError(const std::string& msg) {
  std::fprintf(stderr, "gin-bench: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

bool parseInt(const std::string& s, long lo, long hi, long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (errno || !end || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parseSize(const std::string& s, uint64_t* out) {
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno) return false;
  std::string suf(end);
  for (auto& ch : suf) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  int shift = 0;
  if (suf == "" || suf == "B")
    shift = 0;
  else if (suf == "K" || suf == "KB" || suf == "KIB")
    shift = 10;
  else if (suf == "M" || suf == "MB" || suf == "MIB")
    shift = 20;
  else if (suf == "G" || suf == "GB" || suf == "GIB")
    shift = 30;
  else
    return false;
  if (v == 0 || v > (~0ull >> (shift + 1))) return false;
  *out = uint64_t(v) << shift;
  return true;
}

Options parseArgs(int argc, char** argv) {
  Options o;
  bool haveOp = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], val;
    bool inlineVal = false;
    if (a.rfind("--", 0) == 0) {
      const size_t eq = a.find('=');
      if (eq != std::string::npos) {
        val = a.substr(eq + 1);
        a = a.substr(0, eq);
        inlineVal = true;
      }
    }
    auto value = [&]() -> std::string {
      if (inlineVal) return val;
      if (i + 1 >= argc) usageError(a + " needs a value");
      return argv[++i];
    };
    auto noValue = [&] {
      if (inlineVal) usageError(a + " takes no value");
    };
    if (a == "-h" || a == "--help") {
      std::printf("%s", kUsage);
      std::exit(0);
    } else if (a == "--transport") {
      o.transport = value();
      if (o.transport != "lsa" && o.transport != "proxy" && o.transport != "ibgda")
        usageError("--transport " + o.transport + ": expected lsa, proxy or ibgda");
      o.transportGiven = true;
    } else if (a == "--ranks") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 1024, &n)) usageError("--ranks " + v + ": expected a whole number from 1 to 1024");
      o.ranks = int(n);
    } else if (a == "--emulate") {
      noValue();
      o.emulate = true;
    } else if (a == "--sizes") {
      const std::string v = value();
      const size_t c = v.find(':');
      if (c == std::string::npos || !parseSize(v.substr(0, c), &o.minSize) || !parseSize(v.substr(c + 1), &o.maxSize))
        usageError("--sizes " + v + ": expected MIN:MAX in bytes, e.g. 8:1G or 4K:64M (suffixes K, M, G)");
      if (o.minSize > o.maxSize) usageError("--sizes " + v + ": MIN is larger than MAX");
      o.sizesGiven = true;
    } else if (a == "--iters") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 100000000, &n)) usageError("--iters " + v + ": expected a whole number from 1 to 100000000");
      o.iters = n;
    } else if (a == "--json") {
      o.json = value();
      if (o.json.empty()) usageError("--json needs a file name");
    } else if (a == "--no-nccl") {
      noValue();
      o.noNccl = true;
    } else if (a == "--channels") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 64, &n)) usageError("--channels " + v + ": expected a whole number from 1 to 64");
      o.channels = int(n);
    } else if (a == "--batch") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 1024, &n)) usageError("--batch " + v + ": expected a whole number from 1 to 1024");
      o.batch = int(n);
    } else if (a == "--slots") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 1024, &n)) usageError("--slots " + v + ": expected a whole number from 1 to 1024");
      o.slots = int(n);
    } else if (a == "--mode") {
      o.mode = value();
      if (o.mode != "normal" && o.mode != "ll" && o.mode != "both")
        usageError("--mode " + o.mode + ": expected normal, ll or both");
      o.modeGiven = true;
    } else if (a == "--tokens") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 0, 1 << 20, &n)) usageError("--tokens " + v + ": expected a whole number from 0 to 1048576");
      o.tokens = int(n);
      o.tokensGiven = true;
    } else if (a == "--hidden") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 1 << 16, &n)) usageError("--hidden " + v + ": expected a whole number from 1 to 65536");
      o.hidden = int(n);
    } else if (!a.empty() && a[0] == '-') {
      usageError("unknown option " + a);
    } else {
      if (haveOp) usageError("more than one OP given (" + o.opName + " and " + a + ")");
      haveOp = true;
      o.opName = a;
      if (a == "put-bw")
        o.op = Op::PutBw;
      else if (a == "signal-lat")
        o.op = Op::SignalLat;
      else if (a == "barrier")
        o.op = Op::Barrier;
      else if (a == "msg-rate")
        o.op = Op::MsgRate;
      else if (a == "allreduce")
        o.op = Op::AllReduce;
      else if (a == "sendrecv")
        o.op = Op::SendRecv;
      else if (a == "moe")
        o.op = Op::Moe;
      else
        usageError("unknown OP " + a + " (expected put-bw, signal-lat, barrier, msg-rate, allreduce, sendrecv or moe)");
    }
  }
  if (!haveOp) usageError("no OP given");
  if (o.op == Op::MsgRate && o.transport != "ibgda") o.transport = "proxy";
  if (o.transport == "ibgda" && o.op != Op::MsgRate && o.op != Op::SendRecv)
    usageError(
        "--transport ibgda measures msg-rate (the post rate into a sink NIC) and sendrecv (through the soft NIC) "
        "only: no ConnectX device was available to measure put-bw, signal-lat, barrier, allreduce or moe over a "
        "real NIC");
  if (o.sizesGiven && o.op != Op::PutBw && o.op != Op::AllReduce && o.op != Op::SendRecv)
    usageError("--sizes applies to put-bw, allreduce and sendrecv");
  if (o.channels && o.op != Op::SendRecv && o.op != Op::Moe) usageError("--channels applies to sendrecv and moe");
  if ((o.modeGiven || o.tokensGiven || o.hidden || o.batch != 1 || o.slots) && o.op != Op::Moe)
    usageError("--mode, --tokens, --hidden, --batch and --slots apply to moe");
  if (o.op == Op::AllReduce && o.sizesGiven && o.minSize < 4)
    usageError("allreduce sizes are bytes of floats: MIN must be at least 4");
  if (o.op == Op::SignalLat && o.iters == 1) usageError("signal-lat needs --iters of at least 2");
  return o;
}

// ---------------------------------------------------------------------------
// Engines: what one rank does, on its GPU or on its CPU thread.

struct PingResult {
  double seconds;     // cudaEvents / chrono around the whole run
  uint64_t steadyNs;  // in-run clock, round trips 2..iters (rank 0)
};

// moe: one rank's layer of gin::ep (gin::ep::CpuLayer or gin::ep::GpuLayer).
// Collective: every rank calls the same methods in the same order.
struct MoeTimes {
  double dispatchS, combineS;
};
class MoeRunner {
 public:
  virtual ~MoeRunner() = default;
  // One layer on `in` (kept for timed()); returns this rank's out[T][H].
  virtual std::vector<float> run(const gin::ep::Inputs& in) = 0;
  // One more layer on the last inputs, timed by phase on this rank: dispatch
  // (from the layer's start until every token sent to this rank is here) and
  // combine (experts, the returns, the weighted sums).
  virtual MoeTimes timed() = 0;
};

class Engine {
 public:
  explicit Engine(gin::Comm& c) : comm_(c) {}
  virtual ~Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  virtual bool gpu() const = 0;
  virtual std::string where() const = 0;
  virtual int maxCtas() const = 0;
  virtual void fill(Window w, size_t bytes, uint64_t seed) = 0;
  virtual void poison(Window w, size_t bytes) = 0;
  virtual void resetSignal(uint32_t sig) = 0;
  virtual uint64_t readSignal(uint32_t sig) = 0;
  // Wait until `sig` reaches `least` (bounded by the communicator's timeout);
  // false when the wait gave up. A check of a signal's count waits for it
  // first: neither a put's return nor a flush says the puts have arrived.
  virtual bool waitSignal(uint32_t sig, uint64_t least) = 0;
  // Wait for `least` on `sig`, then compare the window with the pattern. The
  // GPU version only launches; endReceiveCheck() returns the bad count.
  virtual void beginReceiveCheck(Window dst, size_t bytes, uint64_t seed, uint32_t sig, uint64_t least) = 0;
  virtual uint64_t endReceiveCheck() = 0;
  virtual uint64_t checkLocal(Window dst, size_t bytes, uint64_t seed) = 0;
  // Seconds for `iters` puts of `bytes` to rank 1 in shape `sh`.
  virtual double put(CoopKind k, Shape sh, Window dst, Window src, size_t bytes, int iters, uint32_t sig) = 0;
  // Seconds for `iters` copies with the copy engine (CPU: memcpy).
  virtual double copyToPeer(void* peerDst, Window src, size_t bytes, int iters) = 0;
  virtual PingResult pingPong(int iters, uint64_t base, int mode) = 0;
  virtual uint64_t barrierCheck(Window w, int ctas, int iters, uint64_t base) = 0;
  virtual double barrierTime(int ctas, int iters) = 0;
  // msg-rate: seconds for `ctas` x `threads`/32 producers to push `count`
  // descriptors each and see them consumed; throws if a flush gave up.
  virtual double msgRate(int ctas, int threads, int peer, int count) = 0;
  // msg-rate latency: mean ns from a push to its consumption, over `iters`,
  // and mean ns of the push alone (*pushNs).
  virtual double msgLatencyNs(int peer, int iters, double* pushNs) = 0;
  // Mean ns of one rawEcho round trip through words where the rings live.
  virtual double rawEchoNs(int iters) = 0;
  // msg-rate over ibgda: seconds for `ctas` x `threads` producer threads to
  // post `count` WQEs each and see them completed; throws if a flush gave up.
  virtual double postRate(int ctas, int threads, int peer, int count) = 0;
  // allreduce: fill `count` floats of rank `rank` at p (this rank's memory);
  // count the wrong floats at p and the disturbed guard bytes after them;
  // seconds for `iters` AllReduces of plan.count floats from send to recv.
  virtual void arFill(void* p, size_t count, int rank, uint64_t seed) = 0;
  virtual uint64_t arCheck(const void* p, size_t count, int nRanks, uint64_t seed, size_t guard) = 0;
  virtual double arRun(const gin::coll::RingWorkspace& ws, const gin::coll::RingPlan& plan, Window send, Window recv,
                       int iters) = 0;
  // sendrecv: seconds for `iters` ring shifts of `bytes` (see shiftSend) over
  // `nCh` channels of `fifo`; throws if a send or recv gave up.
  virtual double ringShift(const gin::p2p::Fifo& fifo, Window src, Window dst, size_t bytes, int nCh, int iters) = 0;
  // moe: a layer of shape `sh` on this rank (collective).
  virtual std::unique_ptr<MoeRunner> moeLayer(const gin::ep::Shape& sh, bool lowLatency) = 0;

 protected:
  gin::Comm& comm_;
  // Every peer through the proxy (--transport proxy): device bodies use
  // Net<kBackendProxy>; otherwise Net<kBackendLsa>.
  bool proxy() const { return comm_.devComm().proxyAll != 0; }
  // Every peer through ibgda (--transport ibgda): Net<kBackendIbgda>.
  bool ibgda() const { return comm_.devComm().ibgdaAll != 0; }
};

class CpuMoe final : public MoeRunner {
 public:
  CpuMoe(gin::Comm& c, const gin::ep::Shape& sh, bool ll) : layer_(c, sh, ll) {}
  std::vector<float> run(const gin::ep::Inputs& in) override {
    in_ = in;
    return layer_.run(in_);
  }
  MoeTimes timed() override {
    (void)layer_.run(in_);
    return {layer_.timing().dispatchS, layer_.timing().combineS};
  }

 private:
  gin::ep::CpuLayer layer_;
  gin::ep::Inputs in_;
};

class CpuEngine final : public Engine {
 public:
  using Engine::Engine;
  bool gpu() const override { return false; }
  std::string where() const override { return "CPU thread"; }
  int maxCtas() const override { return kCpuCtas; }
  void fill(Window w, size_t bytes, uint64_t seed) override {
    auto* p = static_cast<uint8_t*>(comm_.localPointer(w));
    for (size_t i = 0; i < bytes; ++i) p[i] = patternByte(seed, i);
  }
  void poison(Window w, size_t bytes) override { std::memset(comm_.localPointer(w), kPoison, bytes); }
  void resetSignal(uint32_t sig) override { net().resetSignal(sig); }
  uint64_t readSignal(uint32_t sig) override { return net().readSignal(sig); }
  bool waitSignal(uint32_t sig, uint64_t least) override { return net().waitSignal(gin::CoopThread{}, sig, least); }
  void beginReceiveCheck(Window dst, size_t bytes, uint64_t seed, uint32_t sig, uint64_t least) override {
    // A CPU rank is its own thread: wait here while rank 0's thread puts.
    // A wait that gave up becomes a verification failure every rank agrees
    // on (not an exception on this rank alone, which would leave the others
    // waiting for it).
    const bool ok = net().waitSignal(gin::CoopThread{}, sig, least);
    pendingBad_ = ok ? checkLocal(dst, bytes, seed) : ~0ull;
  }
  uint64_t endReceiveCheck() override { return pendingBad_; }
  uint64_t checkLocal(Window dst, size_t bytes, uint64_t seed) override {
    const auto* p = static_cast<const uint8_t*>(comm_.localPointer(dst));
    uint64_t bad = 0;
    for (size_t i = 0; i < bytes + kGuard; ++i) bad += p[i] != (i < bytes ? patternByte(seed, i) : kPoison);
    return bad;
  }
  double put(CoopKind k, Shape sh, Window dst, Window src, size_t bytes, int iters, uint32_t sig) override {
    const gin::DevComm& dc = comm_.devComm();
    const auto t0 = Clock::now();
    // A CPU rank runs the CTAs of a GPU launch one after another; on the host
    // every coop is one thread doing the whole coop's share.
    for (int i = 0; i < iters; ++i)
      for (int part = 0; part < sh.ctas; ++part) {
        if (proxy())
          putShare<gin::kBackendProxy>(dc, dst, src, bytes, part, sh.ctas, sig, gin::CoopThread{});
        else if (k == CoopKind::Thread)
          putShare<gin::kBackendLsa>(dc, dst, src, bytes, part, sh.ctas, sig, gin::CoopThread{});
        else if (k == CoopKind::Warp)
          putShare<gin::kBackendLsa>(dc, dst, src, bytes, part, sh.ctas, sig, gin::CoopWarp{});
        else
          putShare<gin::kBackendLsa>(dc, dst, src, bytes, part, sh.ctas, sig, gin::CoopBlock{});
      }
    const double s = seconds(t0);
    comm_.check();
    return s;
  }
  double copyToPeer(void* peerDst, Window src, size_t bytes, int iters) override {
    const void* s = comm_.localPointer(src);
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      std::memcpy(peerDst, s, bytes);
      std::atomic_signal_fence(std::memory_order_seq_cst);  // keep repeated copies from being merged
    }
    return seconds(t0);
  }
  PingResult pingPong(int iters, uint64_t base, int mode) override {
    uint64_t ns = 0;
    const auto t0 = Clock::now();
    const bool ok = pingPong_(iters, base, &ns, mode);
    const double s = seconds(t0);
    comm_.check();
    if (!ok) throw gin::Error("signal ping-pong: a wait gave up without a device error record");
    return {s, ns};
  }
  uint64_t barrierCheck(Window w, int ctas, int iters, uint64_t base) override {
    const gin::DevComm& dc = comm_.devComm();
    auto bars = openBarriers(ctas);
    uint64_t bad = 0;
    // The CTAs of a GPU launch become barrier indices visited in order; every
    // rank visits them in the same order, so this cannot deadlock.
    for (int i = 0; i < iters; ++i)
      for (int b = 0; b < ctas; ++b) {
        const uint64_t v = base + uint64_t(i) + 1;
        barrierWrite(dc, w, uint32_t(b), uint32_t(ctas), v, gin::CoopBlock{});
        bad += bars[size_t(b)]->sync(gin::CoopBlock{}) ? 0 : 1;
        bad += barrierRead(dc, w, uint32_t(b), uint32_t(ctas), v, gin::CoopBlock{});
      }
    bars.clear();
    comm_.check();
    return bad;
  }
  double barrierTime(int ctas, int iters) override {
    auto bars = openBarriers(ctas);
    bool ok = true;
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i)
      for (int b = 0; b < ctas; ++b) ok = bars[size_t(b)]->sync(gin::CoopBlock{}) && ok;
    const double s = seconds(t0);
    bars.clear();
    comm_.check();
    if (!ok) throw gin::Error("barrier: a wait gave up without a device error record");
    return s;
  }
  // A CPU rank has one producer thread: the warps of a launch run in turn.
  double msgRate(int ctas, int threads, int peer, int count) override {
    const gin::DevComm& dc = comm_.devComm();
    const int warps = ctas * std::max(1, threads / 32);
    bool ok = true;
    const auto t0 = Clock::now();
    for (int w = 0; w < warps; ++w) ok = msgBurst(dc, w % dc.nContexts, peer, count) && ok;
    const double s = seconds(t0);
    comm_.check();
    if (!ok) throw gin::Error("msg-rate: a flush gave up without a device error record");
    return s;
  }
  // A CPU rank has one producer thread: the launch's threads run in turn.
  double postRate(int ctas, int threads, int peer, int count) override {
    const gin::DevComm& dc = comm_.devComm();
    const int producers = ctas * threads;
    bool ok = true;
    const auto t0 = Clock::now();
    for (int t = 0; t < producers; ++t) ok = postBurst(dc, t % dc.nContexts, peer, count) && ok;
    const double s = seconds(t0);
    comm_.check();
    if (!ok) throw gin::Error("msg-rate: an ibgda flush gave up without a device error record");
    return s;
  }
  double msgLatencyNs(int peer, int iters, double* pushNs) override {
    uint64_t ns = 0, push = 0;
    const bool ok = msgLatency(comm_.devComm(), peer, iters, &ns, &push);
    comm_.check();
    if (!ok) throw gin::Error("msg-rate: a flush gave up without a device error record");
    *pushNs = double(push) / iters;
    return double(ns) / iters;
  }
  double rawEchoNs(int iters) override {
    alignas(64) uint64_t ping = 0;
    alignas(64) uint64_t pong = 0;
    std::thread echo(rawEchoResponder, &ping, &pong, iters);
    const uint64_t ns = rawEcho(&ping, &pong, iters);
    echo.join();
    return double(ns) / iters;
  }
  void arFill(void* p, size_t count, int rank, uint64_t seed) override {
    float* f = static_cast<float*>(p);
    for (size_t i = 0; i < count; ++i) f[i] = arInput(seed, rank, i);
  }
  uint64_t arCheck(const void* p, size_t count, int nRanks, uint64_t seed, size_t guard) override {
    const float* f = static_cast<const float*>(p);
    uint64_t bad = 0;
    for (size_t i = 0; i < count; ++i) bad += f[i] != arExpected(seed, nRanks, i);
    const uint8_t* g = reinterpret_cast<const uint8_t*>(f + count);
    for (size_t i = 0; i < guard; ++i) bad += g[i] != kPoison;
    return bad;
  }
  double arRun(const gin::coll::RingWorkspace& ws, const gin::coll::RingPlan& plan, Window send, Window recv,
               int iters) override {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i)
      gin::coll::runRingAllReduce<float, gin::coll::Sum>(comm_, ws, plan, send, 0, recv, 0);
    return seconds(t0);
  }
  // One thread per rank: each channel's share with sendRecv, channel after
  // channel (every rank visits them in the same order).
  double ringShift(const gin::p2p::Fifo& fifo, Window src, Window dst, size_t bytes, int nCh, int iters) override {
    const gin::DevComm& dc = comm_.devComm();
    bool ok = true;
    const auto t0 = Clock::now();
    for (int i = 0; i < iters && ok; ++i)
      for (int c = 0; c < nCh && ok; ++c) {
        if (ibgda())
          ok = shiftSendRecv<gin::kBackendIbgda>(dc, fifo, src, dst, bytes, c, nCh, gin::CoopThread{});
        else if (proxy())
          ok = shiftSendRecv<gin::kBackendProxy>(dc, fifo, src, dst, bytes, c, nCh, gin::CoopThread{});
        else
          ok = shiftSendRecv<gin::kBackendLsa>(dc, fifo, src, dst, bytes, c, nCh, gin::CoopThread{});
      }
    const double s = seconds(t0);
    comm_.check();
    if (!ok) throw gin::Error("sendrecv: a send or recv gave up without a device error record");
    return s;
  }
  std::unique_ptr<MoeRunner> moeLayer(const gin::ep::Shape& sh, bool ll) override {
    return std::make_unique<CpuMoe>(comm_, sh, ll);
  }

 private:
  using Clock = std::chrono::steady_clock;
  using Bar = gin::LsaBarrierSession<gin::CoopBlock>;
  uint64_t pendingBad_ = 0;

  static double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
  gin::Net<gin::kBackendLsa> net() const { return gin::Net<gin::kBackendLsa>(comm_.devComm(), 0); }
  bool pingPong_(int iters, uint64_t base, uint64_t* ns, int mode) {
    return proxy() ? bench::pingPong<gin::kBackendProxy>(comm_.devComm(), iters, base, ns, mode)
                   : bench::pingPong<gin::kBackendLsa>(comm_.devComm(), iters, base, ns, mode);
  }
  std::vector<std::unique_ptr<Bar>> openBarriers(int ctas) {
    std::vector<std::unique_ptr<Bar>> bars;
    for (int b = 0; b < ctas; ++b)
      bars.push_back(std::make_unique<Bar>(gin::CoopBlock{}, comm_.devComm(), uint32_t(b)));
    return bars;
  }
};

#if defined(__CUDACC__)
#define BENCH_CUDA(call) GIN_CUDA_CHECK(call)

// gin::ep::GpuLayer on the rank's stream; cudaEvents split the layer into its
// dispatch and combine phases (GpuLayer::launch records `dispatched`).
class GpuMoe final : public MoeRunner {
 public:
  GpuMoe(gin::Comm& c, const gin::ep::Shape& sh, bool ll, cudaStream_t st) : st_(st), layer_(c, sh, ll, st) {
    for (cudaEvent_t* e : {&e0_, &e1_, &e2_}) BENCH_CUDA(cudaEventCreate(e));
  }
  ~GpuMoe() override {
    (void)cudaStreamSynchronize(st_);
    for (cudaEvent_t e : {e0_, e1_, e2_}) (void)cudaEventDestroy(e);
  }
  std::vector<float> run(const gin::ep::Inputs& in) override { return layer_.run(in); }
  MoeTimes timed() override {
    layer_.rearm();
    BENCH_CUDA(cudaEventRecord(e0_, st_));
    layer_.launch(e1_);
    BENCH_CUDA(cudaEventRecord(e2_, st_));
    layer_.wait();
    float d = 0, c = 0;
    BENCH_CUDA(cudaEventElapsedTime(&d, e0_, e1_));
    BENCH_CUDA(cudaEventElapsedTime(&c, e1_, e2_));
    return {double(d) * 1e-3, double(c) * 1e-3};
  }

 private:
  cudaStream_t st_;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr, e2_ = nullptr;
  gin::ep::GpuLayer layer_;
};

class GpuEngine final : public Engine {
 public:
  explicit GpuEngine(gin::Comm& c) : Engine(c) {
    comm_.makeCurrent();
    dev_ = comm_.cudaDevice();
    cudaDeviceProp p{};
    BENCH_CUDA(cudaGetDeviceProperties(&p, dev_));
    name_ = p.name;
    BENCH_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev_));
    BENCH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    BENCH_CUDA(cudaEventCreate(&e0_));
    BENCH_CUDA(cudaEventCreate(&e1_));
    BENCH_CUDA(cudaMalloc(&scratch_, kScratchWords * sizeof(unsigned long long)));
    // Load every kernel now: with lazy loading, a kernel's first launch may
    // wait for the device to go idle, which must not happen while another
    // kernel spins on a peer, nor inside a timed region.
    cudaFuncAttributes a{};
    BENCH_CUDA(cudaFuncGetAttributes(&a, putKernel<gin::kBackendLsa, gin::CoopThread>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, putKernel<gin::kBackendLsa, gin::CoopWarp>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, putKernel<gin::kBackendLsa, gin::CoopBlock>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, putKernel<gin::kBackendProxy, gin::CoopThread>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, putKernel<gin::kBackendProxy, gin::CoopWarp>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, putKernel<gin::kBackendProxy, gin::CoopBlock>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, pingKernel<gin::kBackendProxy>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, msgBurstKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, msgLatencyKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, fillKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, verifyKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, waitSignalKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, resetSignalKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, readSignalKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, pingKernel<gin::kBackendLsa>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, ginBarrierKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, ginBarrierCheckKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, arFillKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, arCheckKernel));
    BENCH_CUDA(
        cudaFuncGetAttributes(&a, gin::coll::ringAllReduceKernel<float, gin::coll::Sum, true, gin::kBackendLsa>));
    BENCH_CUDA(
        cudaFuncGetAttributes(&a, gin::coll::ringAllReduceKernel<float, gin::coll::Sum, false, gin::kBackendLsa>));
    BENCH_CUDA(
        cudaFuncGetAttributes(&a, gin::coll::ringAllReduceKernel<float, gin::coll::Sum, true, gin::kBackendAll>));
    BENCH_CUDA(
        cudaFuncGetAttributes(&a, gin::coll::ringAllReduceKernel<float, gin::coll::Sum, false, gin::kBackendAll>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, ringShiftKernel<gin::kBackendLsa>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, ringShiftKernel<gin::kBackendProxy>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, ringShiftKernel<gin::kBackendIbgda>));
#if GIN_BENCH_NCCL
    BENCH_CUDA(cudaFuncGetAttributes(&a, ncclBarrierKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, ncclBarrierCheckKernel));
#endif
  }
  ~GpuEngine() override {
    cudaSetDevice(dev_);
    cudaStreamSynchronize(stream_);
    cudaFree(scratch_);
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
    cudaStreamDestroy(stream_);
  }
  bool gpu() const override { return true; }
  std::string where() const override { return fmt("GPU %d (%s, %d SMs)", dev_, name_.c_str(), sms_); }
  int maxCtas() const override { return sms_; }

  void fill(Window w, size_t bytes, uint64_t seed) override {
    fillKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<uint8_t*>(comm_.localPointer(w)), bytes, seed);
    launched();
    sync();
  }
  void poison(Window w, size_t bytes) override {
    BENCH_CUDA(cudaMemsetAsync(comm_.localPointer(w), kPoison, bytes, stream_));
    sync();
  }
  void resetSignal(uint32_t sig) override {
    resetSignalKernel<<<1, 1, 0, stream_>>>(comm_.devComm(), sig);
    launched();
    sync();
  }
  uint64_t readSignal(uint32_t sig) override {
    readSignalKernel<<<1, 1, 0, stream_>>>(comm_.devComm(), sig, scratch_);
    launched();
    return fetch(0);
  }
  bool waitSignal(uint32_t sig, uint64_t least) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_ + 1, 0, sizeof(unsigned long long), stream_));
    waitSignalKernel<<<1, 1, 0, stream_>>>(comm_.devComm(), sig, least, scratch_ + 1);
    launched();
    return fetch(1) == 0;
  }
  void beginReceiveCheck(Window dst, size_t bytes, uint64_t seed, uint32_t sig, uint64_t least) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, 2 * sizeof(unsigned long long), stream_));
    waitSignalKernel<<<1, 1, 0, stream_>>>(comm_.devComm(), sig, least, scratch_ + 1);
    launched();
    verifyKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<const uint8_t*>(comm_.localPointer(dst)), bytes, kGuard,
                                                seed, scratch_);
    launched();
  }
  uint64_t endReceiveCheck() override {
    // No comm.check() here: a wait that gave up becomes a verification
    // failure every rank agrees on (see CpuEngine).
    BENCH_CUDA(cudaStreamSynchronize(stream_));
    unsigned long long h[2] = {0, 0};
    BENCH_CUDA(cudaMemcpy(h, scratch_, sizeof h, cudaMemcpyDeviceToHost));
    return h[1] ? ~0ull : h[0];
  }
  uint64_t checkLocal(Window dst, size_t bytes, uint64_t seed) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    verifyKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<const uint8_t*>(comm_.localPointer(dst)), bytes, kGuard,
                                                seed, scratch_);
    launched();
    return fetch(0);
  }
  double put(CoopKind k, Shape sh, Window dst, Window src, size_t bytes, int iters, uint32_t sig) override {
    const gin::DevComm dc = comm_.devComm();
    if (proxy()) return putWith<gin::kBackendProxy>(k, sh, dc, dst, src, bytes, iters, sig);
    return putWith<gin::kBackendLsa>(k, sh, dc, dst, src, bytes, iters, sig);
  }
  void setPeerDevice(int d) { peerDev_ = d; }
  double copyToPeer(void* peerDst, Window src, size_t bytes, int iters) override {
    const void* s = comm_.localPointer(src);
    return timed([&] {
      for (int i = 0; i < iters; ++i) BENCH_CUDA(cudaMemcpyPeerAsync(peerDst, peerDev_, s, dev_, bytes, stream_));
    });
  }
  PingResult pingPong(int iters, uint64_t base, int mode) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, 2 * sizeof(unsigned long long), stream_));
    const double s = timed([&] {
      if (proxy())
        pingKernel<gin::kBackendProxy><<<1, 1, 0, stream_>>>(comm_.devComm(), iters, base, mode, scratch_);
      else
        pingKernel<gin::kBackendLsa><<<1, 1, 0, stream_>>>(comm_.devComm(), iters, base, mode, scratch_);
    });
    unsigned long long h[2] = {0, 0};
    BENCH_CUDA(cudaMemcpy(h, scratch_, sizeof h, cudaMemcpyDeviceToHost));
    if (!h[0]) throw gin::Error("signal ping-pong: a wait gave up without a device error record");
    return {s, h[1]};
  }
  uint64_t barrierCheck(Window w, int ctas, int iters, uint64_t base) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    ginBarrierCheckKernel<<<ctas, kBarrierThreads, 0, stream_>>>(comm_.devComm(), w, iters, base, scratch_);
    launched();
    return fetch(0);
  }
  double barrierTime(int ctas, int iters) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    const double s =
        timed([&] { ginBarrierKernel<<<ctas, kBarrierThreads, 0, stream_>>>(comm_.devComm(), iters, scratch_); });
    if (fetch(0)) throw gin::Error("barrier: a wait gave up without a device error record");
    return s;
  }

  double msgRate(int ctas, int threads, int peer, int count) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    const double s =
        timed([&] { msgBurstKernel<<<ctas, threads, 0, stream_>>>(comm_.devComm(), peer, count, scratch_); });
    if (fetch(0)) throw gin::Error("msg-rate: a flush gave up without a device error record");
    return s;
  }
  void arFill(void* p, size_t count, int rank, uint64_t seed) override {
    arFillKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<float*>(p), count, rank, seed);
    launched();
    sync();
  }
  uint64_t arCheck(const void* p, size_t count, int nRanks, uint64_t seed, size_t guard) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    arCheckKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<const float*>(p), count, nRanks, seed, guard, scratch_);
    launched();
    return fetch(0);
  }
  double arRun(const gin::coll::RingWorkspace& ws, const gin::coll::RingPlan& plan, Window send, Window recv,
               int iters) override {
    return timed([&] {
      for (int i = 0; i < iters; ++i)
        gin::coll::launchRingAllReduce<float, gin::coll::Sum>(comm_, ws, plan, send, 0, recv, 0, stream_);
    });
  }
  void poisonBytes(void* p, size_t bytes) {
    BENCH_CUDA(cudaMemsetAsync(p, kPoison, bytes, stream_));
    sync();
  }
  // The byte pattern of `seed` at p (device memory), and its mismatches
  // (plus `guard` bytes after it that must still hold the poison).
  void fillBytes(void* p, size_t bytes, uint64_t seed) {
    if (bytes == 0) return;
    fillKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<uint8_t*>(p), bytes, seed);
    launched();
    sync();
  }
  uint64_t checkBytes(const void* p, size_t bytes, uint64_t seed, size_t guard = 0) {
    if (bytes + guard == 0) return 0;
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    verifyKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<const uint8_t*>(p), bytes, guard, seed, scratch_);
    launched();
    return fetch(0);
  }
  double ringShift(const gin::p2p::Fifo& fifo, Window src, Window dst, size_t bytes, int nCh, int iters) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    const gin::DevComm dc = comm_.devComm();
    const double s = timed([&] {
      for (int i = 0; i < iters; ++i) {
        if (ibgda())
          ringShiftKernel<gin::kBackendIbgda>
              <<<2 * nCh, kSrThreads, 0, stream_>>>(dc, fifo, src, dst, bytes, nCh, scratch_);
        else if (proxy())
          ringShiftKernel<gin::kBackendProxy>
              <<<2 * nCh, kSrThreads, 0, stream_>>>(dc, fifo, src, dst, bytes, nCh, scratch_);
        else
          ringShiftKernel<gin::kBackendLsa>
              <<<2 * nCh, kSrThreads, 0, stream_>>>(dc, fifo, src, dst, bytes, nCh, scratch_);
      }
    });
    if (fetch(0)) throw gin::Error("sendrecv: a send or recv gave up without a device error record");
    return s;
  }
  std::unique_ptr<MoeRunner> moeLayer(const gin::ep::Shape& sh, bool ll) override {
    return std::make_unique<GpuMoe>(comm_, sh, ll, stream_);
  }
  void copyLocal(void* dst, const void* src, size_t bytes) {
    BENCH_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    sync();
  }
#if GIN_BENCH_NCCL
  double ncclAllReduceTime(ncclComm_t nc, const void* send, void* recv, size_t count, int iters) {
    ncclResult_t r = ncclSuccess;
    const double t = timed([&] {
      for (int i = 0; i < iters && r == ncclSuccess; ++i)
        r = ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, nc, stream_);
    });
    if (r != ncclSuccess) throw gin::Error(std::string("ncclAllReduce failed: ") + ncclGetErrorString(r));
    return t;
  }
  // One ncclGroupStart/End per iteration holding an ncclSend of sends[i]
  // bytes at send + sendOff[i] to peer i and an ncclRecv of recvs[i] at
  // recv + recvOff[i] from peer i, for every peer with bytes (this rank
  // included: NCCL copies to itself). Zero-byte pairs are left out on both
  // sides (the sizes are symmetric).
  double ncclExchange(ncclComm_t nc, const uint8_t* send, const std::vector<size_t>& sendOff,
                      const std::vector<size_t>& sends, uint8_t* recv, const std::vector<size_t>& recvOff,
                      const std::vector<size_t>& recvs, int iters) {
    ncclResult_t r = ncclSuccess;
    const char* what = "";
    auto step = [&](ncclResult_t x, const char* call) {
      if (x != ncclSuccess && r == ncclSuccess) r = x, what = call;
    };
    const double t = timed([&] {
      for (int i = 0; i < iters && r == ncclSuccess; ++i) {
        step(ncclGroupStart(), "ncclGroupStart");
        for (size_t p = 0; p < sends.size(); ++p) {
          if (sends[p]) step(ncclSend(send + sendOff[p], sends[p], ncclUint8, int(p), nc, stream_), "ncclSend");
          if (recvs[p]) step(ncclRecv(recv + recvOff[p], recvs[p], ncclUint8, int(p), nc, stream_), "ncclRecv");
        }
        step(ncclGroupEnd(), "ncclGroupEnd");
      }
    });
    if (r != ncclSuccess) throw gin::Error(std::string(what) + " failed: " + ncclGetErrorString(r));
    return t;
  }
#endif
  double postRate(int ctas, int threads, int peer, int count) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    const double s =
        timed([&] { postBurstKernel<<<ctas, threads, 0, stream_>>>(comm_.devComm(), peer, count, scratch_); });
    if (fetch(0)) throw gin::Error("msg-rate: an ibgda flush gave up without a device error record");
    return s;
  }
  double msgLatencyNs(int peer, int iters, double* pushNs) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, 3 * sizeof(unsigned long long), stream_));
    msgLatencyKernel<<<1, 1, 0, stream_>>>(comm_.devComm(), peer, iters, scratch_);
    launched();
    sync();
    unsigned long long h[3] = {0, 0, 0};
    BENCH_CUDA(cudaMemcpy(h, scratch_, sizeof h, cudaMemcpyDeviceToHost));
    if (!h[0]) throw gin::Error("msg-rate: a flush gave up without a device error record");
    *pushNs = double(h[2]) / iters;
    return double(h[1]) / iters;
  }
  // The words sit in mapped pinned host memory, like the rings.
  double rawEchoNs(int iters) override {
    uint64_t* words = nullptr;
    BENCH_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&words), 128, cudaHostAllocMapped | cudaHostAllocPortable));
    words[0] = words[8] = 0;
    uint64_t* dev = nullptr;
    BENCH_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), words, 0));
    std::thread echo(rawEchoResponder, words, words + 8, iters);
    rawEchoKernel<<<1, 1, 0, stream_>>>(dev, dev + 8, iters, scratch_);
    launched();
    sync();
    echo.join();
    unsigned long long ns = 0;
    BENCH_CUDA(cudaMemcpy(&ns, scratch_, sizeof ns, cudaMemcpyDeviceToHost));
    BENCH_CUDA(cudaFreeHost(words));
    return double(ns) / iters;
  }

#if GIN_BENCH_NCCL
  uint64_t ncclBarrierCheck(const ncclDevComm& ndc, Window w, int ctas, int iters, uint64_t base) {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    ncclBarrierCheckKernel<<<ctas, kBarrierThreads, 0, stream_>>>(ndc, comm_.devComm(), w, iters, base, scratch_);
    launched();
    return fetch(0);
  }
  double ncclBarrierTime(const ncclDevComm& ndc, int ctas, int iters) {
    return timed([&] { ncclBarrierKernel<<<ctas, kBarrierThreads, 0, stream_>>>(ndc, iters); });
  }
#endif

 private:
  static constexpr int kScratchWords = 8;
  int dev_ = -1, peerDev_ = -1, sms_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
  unsigned long long* scratch_ = nullptr;

  void launched() { BENCH_CUDA(cudaGetLastError()); }
  template <unsigned B>
  double putWith(CoopKind k, Shape sh, const gin::DevComm& dc, Window dst, Window src, size_t bytes, int iters,
                 uint32_t sig) {
    return timed([&] {
      if (k == CoopKind::Thread)
        putKernel<B, gin::CoopThread><<<1, 1, 0, stream_>>>(dc, dst, src, bytes, iters, sig);
      else if (k == CoopKind::Warp)
        putKernel<B, gin::CoopWarp><<<1, 32, 0, stream_>>>(dc, dst, src, bytes, iters, sig);
      else
        putKernel<B, gin::CoopBlock><<<sh.ctas, sh.threads, 0, stream_>>>(dc, dst, src, bytes, iters, sig);
    });
  }
  // Wait for this rank's work; a device-side failure (a wait that timed out)
  // becomes the gin::Error that names it.
  void sync() {
    const cudaError_t e = cudaStreamSynchronize(stream_);
    comm_.check();
    BENCH_CUDA(e);
  }
  uint64_t fetch(int word) {
    sync();
    unsigned long long h = 0;
    BENCH_CUDA(cudaMemcpy(&h, scratch_ + word, sizeof h, cudaMemcpyDeviceToHost));
    return h;
  }
  template <class Launch>
  double timed(Launch launch) {
    BENCH_CUDA(cudaEventRecord(e0_, stream_));
    launch();
    launched();
    BENCH_CUDA(cudaEventRecord(e1_, stream_));
    sync();
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, e0_, e1_));
    return double(ms) * 1e-3;
  }
};
#endif  // __CUDACC__

// ---------------------------------------------------------------------------
// The ops. Every rank runs the same function; collectives keep them in step
// and rank 0 builds the report.

struct Setup {
  bool gpu = false;
  int ranks = 2;
  int gpus = 0;             // visible; ranks > gpus: ranks share GPUs round-robin (proxy only)
  std::string whyEmulated;  // when emulating without --emulate
};

std::vector<uint64_t> putSizes(const Options& o, bool gpu) {
  const uint64_t lo = o.sizesGiven ? o.minSize : 8;
  const uint64_t hi = o.sizesGiven ? o.maxSize : (gpu ? (1ull << 30) : (16ull << 20));
  std::vector<uint64_t> v;
  for (uint64_t s = lo; s <= hi; s *= 2) {
    v.push_back(s);
    if (s > (~0ull >> 2)) break;
  }
  return v;
}

Shape shapeFor(CoopKind k, size_t bytes, int maxCtas) {
  if (k == CoopKind::Thread) return {1, 1};
  if (k == CoopKind::Warp) return {1, 32};
  const size_t want = (bytes + kBytesPerCta - 1) / kBytesPerCta;
  return {int(std::clamp<size_t>(want, 1, size_t(maxCtas))), kBlockThreads};
}

std::string timerName(bool gpu) {
  return gpu ? "cudaEvents on the measuring rank's stream" : "std::chrono::steady_clock on the measuring rank's thread";
}

void commonJson(Report& rep, const Options& o, const Setup& s, const std::vector<std::string>& where) {
  rep.json.set("tool", "gin-bench");
  rep.json.set("gin_version", fmt("%d.%d.%d", gin::kVersionMajor, gin::kVersionMinor, gin::kVersionPatch));
  rep.json.set("op", o.opName);
  rep.json.set("mode", s.gpu ? "gpu" : "cpu-emulation");
  if (!s.gpu)
    rep.json.set("note", fmt("CPU emulation: ranks are threads of one process on a %u-core machine; the numbers are "
                             "CPU numbers, not GPU numbers",
                             std::thread::hardware_concurrency()));
  rep.json.set("transport", o.transport);
  rep.json.set("ranks", double(s.ranks));
  J w = J::arr();
  for (auto& x : where) w.push(J::str(x));
  rep.json.set("rank_devices", std::move(w));
}

std::vector<std::string> headLines(const Options& o, const Setup& s, const std::vector<std::string>& where) {
  std::vector<std::string> h;
  h.push_back(
      fmt("gin-bench %s: transport %s, %d ranks, %s", o.opName.c_str(), o.transport.c_str(), s.ranks,
          s.gpu ? "GPUs of one host (one gin::Comm per GPU)" : "CPU emulation (CPU ranks running the gin device API)"));
  if (!s.whyEmulated.empty()) h.push_back("  note: " + s.whyEmulated);
  if (s.gpu && s.ranks > s.gpus)
    h.push_back(fmt("  note: %d ranks share %d GPU%s (round-robin); over the proxy the GPUs never address each other",
                    s.ranks, s.gpus, s.gpus == 1 ? "" : "s"));
  if (!s.gpu)
    h.push_back(fmt("  CPU numbers on a %u-core machine, not GPU numbers", std::thread::hardware_concurrency()));
  std::string r = " ";
  for (size_t i = 0; i < where.size(); ++i) r += fmt(" rank %zu: %s;", i, where[i].c_str());
  r.pop_back();
  h.push_back(r);
  return h;
}

// ---- put-bw ----

void runPutBw(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
              const std::vector<std::string>& where) {
  const int me = comm.rank();
  const bool gpu = e.gpu();
  const std::vector<uint64_t> sizes = putSizes(o, gpu);
  const size_t maxBytes = size_t(sizes.back());
  const int K = o.iters ? int(o.iters) : 1000;
  const double budget = gpu ? 0.05 : 0.02;  // seconds per timed run

  const gin::Transport want = o.transport == "proxy" ? gin::Transport::Proxy : gin::Transport::Lsa;
  if (me == 0 && comm.transportTo(1) != want)
    throw gin::Error("rank 1 is not reached over " + o.transport + " from rank 0");
  Window src = comm.allocWindow(maxBytes + kGuard);
  Window dst = comm.allocWindow(maxBytes + kGuard);
  // Rank 1's destination as mapped here, for the copy-engine baseline.
  const uint64_t peerDst = me == 0 ? uint64_t(reinterpret_cast<uintptr_t>(comm.lsaPointer(dst, 0, 1))) : 0;
#if defined(__CUDACC__)
  const int peerDev = bcast(comm, comm.cudaDevice(), 1);
  if (gpu) static_cast<GpuEngine&>(e).setPeerDevice(peerDev);
#endif
  const int maxCtas = bcast(comm, e.maxCtas(), 0);

  struct Cell {
    bool done = false;
    Shape shape{0, 0};
    int iters = 0;
    double seconds = 0, gbps = 0;
  };
  bool skipped[3] = {false, false, false};
  std::vector<std::array<Cell, 4>> cells(sizes.size());  // thread, warp, block, copy

  auto fail = [&](const std::string& what) { throw Failure("put-bw verification failed: " + what); };

  // Times `runOnce(iters)` on rank 0: warm-up, a one-iteration probe that
  // sizes the runs to the budget, then kPutRuns runs; returns the median cell.
  auto measure = [&](Shape sh, const std::function<double(int)>& runOnce, size_t bytes, int* totalCalls) {
    Cell c;
    c.shape = sh;
    runOnce(1);  // warm-up (first touch, instruction cache, clocks)
    const double t1 = runOnce(1);
    c.iters = int(std::clamp(budget / std::max(t1, 1e-9), 1.0, double(K)));
    std::vector<double> t;
    for (int r = 0; r < kPutRuns; ++r) t.push_back(runOnce(c.iters));
    c.seconds = median(t);
    c.gbps = double(bytes) * c.iters / c.seconds / 1e9;
    c.done = true;
    *totalCalls = 2 + kPutRuns * c.iters;
    return std::make_pair(c, t1);
  };

  for (size_t si = 0; si < sizes.size(); ++si) {
    const size_t bytes = size_t(sizes[si]);
    for (int ci = 0; ci < 3; ++ci) {
      if (skipped[ci]) continue;
      const CoopKind k = CoopKind(ci);
      const Shape sh = shapeFor(k, bytes, maxCtas);
      const uint64_t seed = mix(uint64_t(bytes) * 4 + uint64_t(ci));
      // 1. Verify one put: poisoned destination, signal awaited at rank 1,
      //    every byte compared, guard bytes untouched.
      if (me == 0) e.fill(src, bytes, seed);
      if (me == 1) {
        e.poison(dst, bytes + kGuard);
        e.resetSignal(kSigVerify);
        e.resetSignal(kSigTimed);
      }
      comm.bootstrap().barrier();
      if (me == 1) e.beginReceiveCheck(dst, bytes, seed, kSigVerify, uint64_t(sh.ctas));
      if (me == 0) e.put(k, sh, dst, src, bytes, 1, kSigVerify);
      uint64_t bad = me == 1 ? e.endReceiveCheck() : 0;
      bad = bcast(comm, bad, 1);
      if (bad == ~0ull)
        fail(
            fmt("%s coop, %s: rank 1 never saw the put's signal (waitSignal gave up after the communicator's "
                "timeout, GIN_TIMEOUT_MS)",
                kCoopNames[ci], sizeName(bytes).c_str()));
      if (bad)
        fail(fmt("%s coop, %s: rank 1 received %" PRIu64 " wrong bytes (of %zu, plus %zu guard bytes)", kCoopNames[ci],
                 sizeName(bytes).c_str(), bad, bytes, kGuard));
      // 2. Time it on rank 0.
      int calls = 0;
      double t1 = 0;
      if (me == 0) {
        auto [c, probe] = measure(
            sh, [&](int it) { return e.put(k, sh, dst, src, bytes, it, kSigTimed); }, bytes, &calls);
        cells[si][size_t(ci)] = c;
        t1 = probe;
      }
      // 3. Every timed put's signal arrived: rank 1 waits for the count (rank 0's
      //    return from its puts says nothing about their arrival: over the proxy
      //    the engine may still be carrying the last ones out), then reads it
      //    (more would be a signal applied twice).
      const uint64_t expect = bcast(comm, uint64_t(calls) * uint64_t(sh.ctas), 0);
      const bool arrived = bcast(comm, me == 1 ? uint64_t(e.waitSignal(kSigTimed, expect)) : uint64_t(1), 1) != 0;
      const uint64_t got = bcast(comm, me == 1 ? e.readSignal(kSigTimed) : uint64_t(0), 1);
      if (!arrived || got != expect)
        fail(fmt("%s coop, %s: rank 1's signal counted %" PRIu64 " timed puts, expected %" PRIu64 "%s", kCoopNames[ci],
                 sizeName(bytes).c_str(), got, expect,
                 arrived ? "" : " (waitSignal gave up after the communicator's timeout, GIN_TIMEOUT_MS)"));
      skipped[ci] = bcast(comm, t1 > kSlowPutS, 0);
    }
    // Copy engine (GPU) / memcpy (CPU): same bytes, verified the same way.
    const uint64_t seed = mix(uint64_t(bytes) * 4 + 3);
    if (me == 0) e.fill(src, bytes, seed);
    if (me == 1) e.poison(dst, bytes + kGuard);
    comm.bootstrap().barrier();
    if (me == 0) e.copyToPeer(reinterpret_cast<void*>(uintptr_t(peerDst)), src, bytes, 1);
    comm.bootstrap().barrier();
    uint64_t bad = bcast(comm, me == 1 ? e.checkLocal(dst, bytes, seed) : uint64_t(0), 1);
    if (bad)
      fail(fmt("%s baseline, %s: rank 1 received %" PRIu64 " wrong bytes", gpu ? "copy-engine" : "memcpy",
               sizeName(bytes).c_str(), bad));
    if (me == 0) {
      int calls = 0;
      cells[si][3] =
          measure(
              Shape{0, 0},
              [&](int it) { return e.copyToPeer(reinterpret_cast<void*>(uintptr_t(peerDst)), src, bytes, it); }, bytes,
              &calls)
              .first;
    }
    comm.bootstrap().barrier();
  }
  comm.bootstrap().barrier();
  comm.deregisterWindow(dst);
  comm.deregisterWindow(src);
  if (me != 0) return;

  // ---- report ----
  const char* base = gpu ? "CE" : "memcpy";
  rep->head = headLines(o, s, where);
  rep->method = {
      "rank 0 puts SIZE bytes from its src window into rank 1's dst window with gin Net<lsa>::put(..., SignalInc):",
      "  every put carries a remote SignalInc (system-scope release), one per CTA for the block coop",
      fmt("launch: thread = 1 CTA x 1 thread; warp = 1 CTA x 32 threads; block = min(%d, ceil(SIZE / 32 KiB)) CTAs x "
          "%d threads,",
          maxCtas, kBlockThreads),
      "  CTA b moving a contiguous 16-byte aligned share, or, from 2 x 64 KiB per CTA up, 64 KiB chunks dealt",
      "  round-robin to the CTAs (CTA b: chunks b, b+G, ...; SignalInc on each CTA's last put) (shape per size in the "
      "table)",
      fmt("iterations: one %s runs ITERS puts back to back; ITERS = min(%d, %.0f ms / time of one put), at least 1;",
          gpu ? "kernel" : "call (per rank thread)", K, budget * 1e3),
      "  warm-up: one untimed put, then a timed one-put probe that sets ITERS",
      fmt("timer: %s; reported: median of %d runs;", timerName(gpu).c_str(), kPutRuns),
      gpu ? "  GB/s = SIZE * ITERS / time / 1e9 (time of the whole kernel, launch included)"
          : "  GB/s = SIZE * ITERS / time / 1e9 (time of the whole call)",
      gpu ? "baseline: copy engine, ITERS x cudaMemcpyPeerAsync(rank 1 dst, GPU 1, rank 0 src, GPU 0, SIZE) in one "
            "stream between the same events"
          : "baseline: ITERS x std::memcpy from rank 0's src into rank 1's dst (the emulation's copy engine)",
      "verified before timing: rank 1 waits for the put's signal, compares every byte with the source pattern and",
      fmt("  checks %zu guard bytes after it are untouched; after timing it checks its signal counted every timed put",
          kGuard),
      fmt("  (the %s baseline's bytes are checked the same way)", base),
      fmt("a coop's larger sizes are skipped once one put takes more than %.2f s ('-' in the table)", kSlowPutS),
  };
  if (!gpu)
    rep->method.push_back(
        "CPU emulation: every coop is one thread on the host, and the block coop's CTAs run one after another");
  rep->table.header = {"size",
                       "thread GB/s",
                       "warp GB/s",
                       "block GB/s",
                       "block launch",
                       std::string(base) + " GB/s",
                       std::string("thread/") + base,
                       std::string("warp/") + base,
                       std::string("block/") + base,
                       "iters t/w/b/" + std::string(gpu ? "ce" : "memcpy")};
  J rows = J::arr();
  for (size_t si = 0; si < sizes.size(); ++si) {
    const auto& c = cells[si];
    auto g = [&](int i) { return c[size_t(i)].done ? fmt("%.3f", c[size_t(i)].gbps) : std::string("-"); };
    auto ratio = [&](int i) {
      return c[size_t(i)].done && c[3].gbps > 0 ? fmt("%.2f", c[size_t(i)].gbps / c[3].gbps) : std::string("-");
    };
    auto it = [&](int i) { return c[size_t(i)].done ? std::to_string(c[size_t(i)].iters) : std::string("-"); };
    rep->table.rows.push_back({sizeName(sizes[si]), g(0), g(1), g(2),
                               c[2].done ? fmt("%dx%d", c[2].shape.ctas, c[2].shape.threads) : std::string("-"), g(3),
                               ratio(0), ratio(1), ratio(2), it(0) + "/" + it(1) + "/" + it(2) + "/" + it(3)});
    J row = J::obj();
    row.set("bytes", double(sizes[si]));
    for (int i = 0; i < 4; ++i) {
      const Cell& x = c[size_t(i)];
      J m = J::obj();
      if (!x.done) {
        m = J::obj().set("skipped", J::boolean(true));
      } else {
        if (i < 3) m.set("launch", fmt("%dx%d", x.shape.ctas, x.shape.threads));
        m.set("iters", double(x.iters)).set("seconds", x.seconds).set("GBps", x.gbps);
        if (i < 3 && c[3].gbps > 0) m.set("ratio_to_baseline", x.gbps / c[3].gbps);
      }
      row.set(i < 3 ? std::string("gin_") + kCoopNames[i] : std::string(gpu ? "copy_engine" : "memcpy"), std::move(m));
    }
    rows.push(std::move(row));
  }
  const std::string nccl =
      !gpu ? "CPU emulation: NCCL's device API runs on GPUs only"
           : "not measured: NCCL 2.28's LSA device API has no put (a kernel copies through ncclGetLsaPointer itself, "
             "which would time the same copy loop as gin's lsa put), and ncclGin::put needs a GIN-capable network, "
             "not the load/store path between GPUs of one host";
  rep->notes.push_back("nccl: " + nccl);
  commonJson(*rep, o, s, where);
  rep->json.set("method",
                J::obj()
                    .set("operation", "Net<lsa>::put + SignalInc, rank 0 -> rank 1")
                    .set("block_launch", fmt("min(%d, ceil(bytes/32KiB)) CTAs x %d threads", maxCtas, kBlockThreads))
                    .set("iters_max", double(K))
                    .set("budget_seconds_per_run", budget)
                    .set("runs", double(kPutRuns))
                    .set("statistic", "median")
                    .set("timer", timerName(gpu))
                    .set("GB", "1e9 bytes")
                    .set("baseline", gpu ? "cudaMemcpyPeerAsync" : "std::memcpy"));
  rep->json.set("verified", J::boolean(true));
  rep->json.set("results", std::move(rows));
  rep->json.set("nccl", J::obj().set("measured", J::boolean(false)).set("reason", nccl));
}

// ---- signal-lat ----

void runSignalLat(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                  const std::vector<std::string>& where) {
  const int me = comm.rank();
  const bool gpu = e.gpu();
  const int K = o.iters ? int(o.iters) : (gpu ? 10000 : 2000);
  const int warm = std::max(2, std::min(K, 1000));
  uint64_t base = 0;
  constexpr int kModes = 3;
  std::vector<double> evt[kModes], steady[kModes];
  // Each run: both ranks start together (bootstrap barrier), one kernel (or
  // call) per rank runs all the round trips, in each mode of pingPong().
  for (int variant = 0; variant < kModes; ++variant)
    for (int r = -1; r < kLatRuns; ++r) {
      const int iters = r < 0 ? warm : K;
      comm.bootstrap().barrier();
      PingResult p{0, 0};
      if (me <= 1) p = e.pingPong(iters, base, variant);
      base += uint64_t(iters);
      // The rank that started second has no start skew in its time.
      const auto t = allGather(comm, p.seconds);
      if (r >= 0 && me == 0) {
        evt[variant].push_back(std::min(t[0], t[1]) / iters * 1e6);
        steady[variant].push_back(double(p.steadyNs) / (iters - 1) * 1e-3);
      }
    }
  // Both ranks' signal must now hold exactly the number of round trips.
  const uint64_t got = me <= 1 ? e.readSignal(kSigPing) : base;
  const auto all = allGather(comm, got);
  for (int r = 0; r < 2; ++r)
    if (all[size_t(r)] != base)
      throw Failure(fmt("signal-lat verification failed: rank %d's signal is %" PRIu64 " after %" PRIu64
                        " round trips (expected %" PRIu64 ")",
                        r, all[size_t(r)], base, base));
  comm.bootstrap().barrier();
  if (me != 0) return;

  rep->head = headLines(o, s, where);
  rep->method = {
      "ping-pong between rank 0 and rank 1, one thread each side, signal kSigPing:",
      "  rank 0: net.signal(world, 1, SignalInc) then net.waitSignal(CoopThread, sig, i+1);",
      "  rank 1: net.waitSignal(CoopThread, sig, i+1) then net.signal(world, 0, SignalInc)",
      gpu ? fmt("launch: one kernel of 1 CTA x 1 thread per rank, both started after a host barrier, each running "
                "all ITERS = %d round trips",
                K)
          : fmt("launch: one call per rank thread, both started after a host barrier, each running all ITERS = %d "
                "round trips",
                K),
      fmt("warm-up: one run of %d round trips; then %d timed runs; reported: median, min, max over the runs", warm,
          kLatRuns),
      fmt("timer (row 1): %s around each rank's run; per run the smaller of the two", timerName(gpu).c_str()),
      "  times (the rank that started second has no start skew in it) / ITERS",
      fmt("timer (row 2): rank 0's clock inside the run (%s) from the end of round trip 1 to the end,",
          gpu ? "%globaltimer" : "steady_clock"),
      "  / (ITERS-1): the same loop, with no launch or start skew in it",
      "verified: afterwards each rank's signal equals the total number of round trips",
      "rows 'release/acquire': signal() releases the caller's earlier writes, the wait acquires (the defaults);",
      "rows 'alreadyReleased/acquire': the caller has nothing to publish and says so (no release fence);",
      "rows 'alreadyReleased/relaxed': and the wait is relaxed too (nothing to acquire): the signal's own latency",
  };
  if (!gpu) rep->method.push_back("CPU emulation: the waiting thread polls and yields its core every 64 polls");
  auto row = [&](const std::string& name, const std::vector<double>& v) {
    rep->table.rows.push_back({name, fmt("%.3f", median(v)), fmt("%.3f", *std::min_element(v.begin(), v.end())),
                               fmt("%.3f", *std::max_element(v.begin(), v.end())), fmt("%.3f", median(v) / 2)});
  };
  rep->table.header = {"metric", "median us", "min us", "max us", "one-way us (median/2)"};
  for (int v = 0; v < kModes; ++v) {
    const std::string tag = v == 0 ? "release/acquire" : v == 1 ? "alreadyReleased/acquire" : "alreadyReleased/relaxed";
    row("round trip, " + tag + " (" + (gpu ? "cudaEvents" : "chrono") + " / iters)", evt[v]);
    row("round trip, " + tag + " (in-run " + (gpu ? "globaltimer" : "clock") + ")", steady[v]);
  }
  const std::string nccl =
      !gpu ? "CPU emulation: NCCL's device API runs on GPUs only"
           : "not measured: NCCL 2.28's device-side signals belong to ncclGin, which runs over a GIN-capable network "
             "plugin, not over the load/store path between GPUs of one host; its LSA API has no signal object";
  rep->notes.push_back("nccl: " + nccl);
  commonJson(*rep, o, s, where);
  auto arr = [](const std::vector<double>& v) {
    J a = J::arr();
    for (double x : v) a.push(J::num(x));
    return a;
  };
  rep->json.set("method", J::obj()
                              .set("operation", "signal(SignalInc) + waitSignal ping-pong, rank 0 <-> rank 1")
                              .set("launch", "1x1 per rank")
                              .set("iters", double(K))
                              .set("warmup_iters", double(warm))
                              .set("runs", double(kLatRuns))
                              .set("timer", timerName(gpu)));
  rep->json.set("verified", J::boolean(true));
  rep->json.set("results", J::obj()
                               .set("round_trip_us_median", median(evt[0]))
                               .set("round_trip_us_runs", arr(evt[0]))
                               .set("round_trip_in_run_clock_us_median", median(steady[0]))
                               .set("round_trip_in_run_clock_us_runs", arr(steady[0]))
                               .set("already_released_round_trip_us_median", median(evt[1]))
                               .set("already_released_round_trip_us_runs", arr(evt[1]))
                               .set("already_released_in_run_clock_us_median", median(steady[1]))
                               .set("relaxed_round_trip_us_median", median(evt[2]))
                               .set("relaxed_round_trip_us_runs", arr(evt[2])));
  rep->json.set("nccl", J::obj().set("measured", J::boolean(false)).set("reason", nccl));
}

// ---- NCCL, the baseline of barrier, allreduce, sendrecv and moe ----

// Why NCCL is not measured next to gin in this run ("" when it is, as far as
// the options and the build can tell). NCCL picks its own transport, so it is
// compared only with gin's lsa unless `anyTransport`.
std::string ncclSkipReason(const Options& o, bool gpu, bool anyTransport = false) {
  if (!gpu) return "CPU emulation: NCCL runs on GPUs only";
#if GIN_BENCH_NCCL
  if (o.noNccl) return "disabled by --no-nccl";
  if (!anyTransport && o.transport != "lsa")
    return "not measured with --transport " + o.transport + " (NCCL picks its own transport)";
  return "";
#else
  (void)o, (void)anyTransport;
  return "this gin-bench was built without NCCL (libnccl was not found when configuring)";
#endif
}

#if GIN_BENCH_NCCL
#define BENCH_NCCL_TRY(call, what)                                                                              \
  do {                                                                                                          \
    const ncclResult_t r_ = (call);                                                                             \
    if (r_ != ncclSuccess && reason.empty()) reason = std::string(what) + " failed: " + ncclGetErrorString(r_); \
  } while (0)

// NCCL communicator + device communicator with lsaBarrierCount barriers, for
// the comparison. Every step is agreed on by all ranks, so a failure on one
// rank turns into "not measured (reason)" everywhere instead of a hang.
struct NcclSide {
  bool ok = false;
  std::string reason;
  ncclComm_t comm = nullptr;
  ncclDevComm dev{};
  bool haveDev = false;
  void* send = nullptr;  // the op's own buffers for NCCL (start's sizes), freed by close
  void* recv = nullptr;

  // An op's setup: when `why` is empty (nothing rules NCCL out), open the
  // communicator with `barriers` device barriers (0: host only) and allocate
  // the send and receive buffers (0 bytes: none); otherwise, or when that
  // fails, `why` says why NCCL is not measured. Returns whether it is.
  bool start(gin::Comm& g, std::string& why, int barriers, size_t sendBytes = 0, size_t recvBytes = 0) {
    if (!why.empty()) return false;
    open(g, barriers);
    if (!ok) {
      why = reason;
      return false;
    }
    if (sendBytes) BENCH_CUDA(cudaMalloc(&send, sendBytes));
    if (recvBytes) BENCH_CUDA(cudaMalloc(&recv, recvBytes));
    return true;
  }

  // Any rank's first failure, agreed by every rank.
  static std::string agree(gin::Comm& c, const std::string& mine) {
    struct Msg {
      char text[240];
    } m{};
    std::snprintf(m.text, sizeof m.text, "%s", mine.c_str());
    const auto all = allGather(c, m);
    for (int r = 0; r < c.nRanks(); ++r)
      if (all[size_t(r)].text[0]) return fmt("rank %d: %s", r, all[size_t(r)].text);
    return "";
  }

  // barriers == 0: the host communicator only (ncclAllReduce), no device communicator.
  void open(gin::Comm& g, int barriers) {
    std::string reason;
    ncclUniqueId id{};
    if (g.rank() == 0) BENCH_NCCL_TRY(ncclGetUniqueId(&id), "ncclGetUniqueId");
    reason = agree(g, reason);
    if (!reason.empty()) return fail(reason);
    g.bootstrap().broadcast(&id, sizeof id, 0);
    BENCH_NCCL_TRY(ncclCommInitRank(&comm, g.nRanks(), id, g.rank()), "ncclCommInitRank");
    reason = agree(g, reason);
    if (!reason.empty()) return fail(reason);
    if (barriers == 0) {
      ok = true;
      return;
    }
    ncclDevCommRequirements reqs;
    std::memset(&reqs, 0, sizeof reqs);
    reqs.lsaBarrierCount = barriers;
    BENCH_NCCL_TRY(ncclDevCommCreate(comm, &reqs, &dev),
                   "ncclDevCommCreate (needs symmetric memory: CUDA VMM, "
                   "NCCL_CUMEM_ENABLE)");
    reason = agree(g, reason);
    if (!reason.empty()) return fail(reason);
    haveDev = true;
    reason = agree(g, dev.lsaSize == g.nRanks() ? std::string()
                                                : fmt("NCCL's lsa team has %d ranks, not %d (are all GPUs "
                                                      "peer-accessible?)",
                                                      dev.lsaSize, g.nRanks()));
    if (!reason.empty()) return fail(reason);
    ok = true;
  }
  void fail(const std::string& why) {
    reason = why;
    ok = false;
  }
  // Every rank calls this at the same point. After a failure some ranks may
  // lack a communicator, so the collective teardown is replaced by a local
  // ncclCommAbort.
  void close() {
    if (ok) {
      if (haveDev) (void)ncclDevCommDestroy(comm, &dev);
      (void)ncclCommFinalize(comm);
      (void)ncclCommDestroy(comm);
    } else if (comm) {
      (void)ncclCommAbort(comm);
    }
    comm = nullptr;
    ok = false;
    haveDev = false;
    if (send) cudaFree(send);
    if (recv) cudaFree(recv);
    send = recv = nullptr;
  }
};
#endif

// ---- barrier ----

void runBarrier(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                const std::vector<std::string>& where) {
  const int me = comm.rank(), n = comm.nRanks();
  const bool gpu = e.gpu();
  const int K = o.iters ? int(o.iters) : (gpu ? 10000 : 1000);
  const int checkIters = std::min(K, gpu ? 1000 : 200);
  const int warm = std::min(K, gpu ? 1000 : 100);
  const int nB = comm.config().nBarriers;
  std::vector<int> ctaCounts;
  for (int c : kBarrierCtas)
    if (c <= nB) ctaCounts.push_back(c);
  Window w = comm.allocWindow(2 * size_t(kBarrierCtas[2]) * size_t(n) * sizeof(uint64_t));
  uint64_t checkBase = 0;  // values differ between checks, so a stale slot never passes

  // NCCL's device barrier runs over any gin transport: only the GPU and the build matter.
  std::string ncclReason = ncclSkipReason(o, gpu, /*anyTransport=*/true);
#if GIN_BENCH_NCCL
  NcclSide nccl;
  const bool withNccl = nccl.start(comm, ncclReason, kBarrierCtas[2]);
#else
  const bool withNccl = false;
#endif

  struct Result {
    int ctas;
    double ginUs, ncclUs;
    std::vector<double> ginRuns, ncclRuns;
  };
  std::vector<Result> results;

  // Every rank times its own run, from its own start to the common end: the
  // rank that started last has no start skew in its time, so a run counts
  // the smallest time over the ranks. Reported: median over runs.
  auto timeRuns = [&](const std::function<double(int)>& once) {
    comm.bootstrap().barrier();
    once(warm);
    std::vector<double> runs;
    for (int r = 0; r < kBarRuns; ++r) {
      comm.bootstrap().barrier();
      const double t = once(K);
      const auto all = allGather(comm, t);
      runs.push_back(*std::min_element(all.begin(), all.end()) / K * 1e6);
    }
    return runs;
  };
  auto verify = [&](const char* which, int ctas, const std::function<uint64_t(uint64_t)>& check) {
    checkBase += 1ull << 32;
    comm.bootstrap().barrier();
    const uint64_t bad = check(checkBase);
    const auto all = allGather(comm, bad);
    for (int r = 0; r < n; ++r)
      if (all[size_t(r)])
        throw Failure(fmt("barrier verification failed: %s barrier, %d CTAs: rank %d saw %" PRIu64
                          " stale or missing peer writes after a sync",
                          which, ctas, r, all[size_t(r)]));
  };

  for (int ctas : ctaCounts) {
    Result res{ctas, 0, 0, {}, {}};
    verify("gin", ctas, [&](uint64_t b) { return e.barrierCheck(w, ctas, checkIters, b); });
    res.ginRuns = timeRuns([&](int it) { return e.barrierTime(ctas, it); });
    res.ginUs = median(res.ginRuns);
#if GIN_BENCH_NCCL
    if (withNccl) {
      auto& ge = static_cast<GpuEngine&>(e);
      verify("nccl", ctas, [&](uint64_t b) { return ge.ncclBarrierCheck(nccl.dev, w, ctas, checkIters, b); });
      res.ncclRuns = timeRuns([&](int it) { return ge.ncclBarrierTime(nccl.dev, ctas, it); });
      res.ncclUs = median(res.ncclRuns);
    }
#endif
    results.push_back(std::move(res));
  }
  comm.bootstrap().barrier();
#if GIN_BENCH_NCCL
  nccl.close();
#endif
  comm.deregisterWindow(w);
  if (me != 0) return;

  rep->head = headLines(o, s, where);
  rep->method = {
      "every rank opens gin::LsaBarrierSession<CoopBlock>(CoopBlock{}, devComm, blockIdx.x) in each CTA (its own",
      "  barrier index) and calls sync(CoopBlock{}) ITERS times (default memory order: acq_rel)",
      gpu ? fmt("launch: 1, 32 and 132 CTAs x %d threads, one kernel per rank, all ranks started after a host "
                "barrier",
                kBarrierThreads)
          : "launch: 1, 32 and 132 'CTAs' (barrier indices), one call per rank thread, all ranks started after a "
            "host barrier",
      fmt("ITERS = %d; warm-up: one run of %d syncs; then %d timed runs", K, warm, kBarRuns),
      fmt("timer: %s around each rank's run; per run the smallest time over the ranks", timerName(gpu).c_str()),
      "  (the rank that started last, whose time has no start skew) / ITERS; reported: median of runs",
      fmt("verified first (%d syncs per CTA): before each sync every rank writes the iteration's value into its slot "
          "at",
          checkIters),
      "  every peer (Net::putValue); after the sync every peer's value must be there (slots alternate by parity)",
  };
  if (withNccl)
    rep->method.push_back(
        "nccl: the same kernels with ncclLsaBarrierSession<ncclCoopCta>(ncclCoopCta(), devComm, ncclTeamTagLsa(), "
        "blockIdx.x).sync(coop, acq_rel), verified the same way (writes to peers' gin window, NCCL barrier between)");
  if (!gpu)
    rep->method.push_back(
        "CPU emulation: each rank is one thread; per iteration it syncs barrier indices 0..CTAS-1 one after another, "
        "so 'per iteration' covers CTAS syncs");
  if (gpu) {
    rep->table.header = {"CTAs", "gin us/sync", "gin min", "gin max", "nccl us/sync", "gin/nccl"};
  } else {
    rep->table.header = {"CTAs", "us/iteration", "min", "max", "us per barrier index"};
  }
  J rows = J::arr();
  for (auto& r : results) {
    const double mn = *std::min_element(r.ginRuns.begin(), r.ginRuns.end());
    const double mx = *std::max_element(r.ginRuns.begin(), r.ginRuns.end());
    if (gpu)
      rep->table.rows.push_back({std::to_string(r.ctas), fmt("%.3f", r.ginUs), fmt("%.3f", mn), fmt("%.3f", mx),
                                 withNccl ? fmt("%.3f", r.ncclUs) : std::string("-"),
                                 withNccl && r.ncclUs > 0 ? fmt("%.2f", r.ginUs / r.ncclUs) : std::string("-")});
    else
      rep->table.rows.push_back({std::to_string(r.ctas), fmt("%.3f", r.ginUs), fmt("%.3f", mn), fmt("%.3f", mx),
                                 fmt("%.3f", r.ginUs / r.ctas)});
    J row = J::obj();
    row.set("ctas", double(r.ctas)).set("threads_per_cta", double(kBarrierThreads));
    J gr = J::arr();
    for (double x : r.ginRuns) gr.push(J::num(x));
    row.set(gpu ? "gin_us_per_sync" : "gin_us_per_iteration", r.ginUs).set("gin_runs_us", std::move(gr));
    if (withNccl) {
      J nr = J::arr();
      for (double x : r.ncclRuns) nr.push(J::num(x));
      row.set("nccl_us_per_sync", r.ncclUs).set("nccl_runs_us", std::move(nr));
    }
    rows.push(std::move(row));
  }
  rep->notes.push_back(withNccl ? "nccl: measured (ncclLsaBarrierSession, same launch shapes)"
                                : "nccl: not measured (" + ncclReason + ")");
  commonJson(*rep, o, s, where);
  rep->json.set("method",
                J::obj()
                    .set("operation", "LsaBarrierSession<CoopBlock>::sync, one barrier index per CTA")
                    .set("threads_per_cta", double(kBarrierThreads))
                    .set("iters", double(K))
                    .set("warmup_iters", double(warm))
                    .set("runs", double(kBarRuns))
                    .set("statistic", "median over runs of the smallest per-rank time (the last rank to start)")
                    .set("timer", timerName(gpu)));
  rep->json.set("verified", J::boolean(true));
  rep->json.set("results", std::move(rows));
  rep->json.set("nccl", withNccl ? J::obj().set("measured", J::boolean(true))
                                 : J::obj().set("measured", J::boolean(false)).set("reason", ncclReason));
}

// ---- msg-rate ----

// One shape's rates (msg-rate over the proxy and over ibgda).
struct RateRes {
  std::string name;
  int producers;
  uint64_t each;
  std::vector<double> rates;
};

// A table row per shape (median, min, max in millions per second) and the
// JSON rows, the median under `key`.
J rateRows(Report* rep, const std::vector<RateRes>& res, const char* key) {
  J rows = J::arr();
  for (const RateRes& r : res) {
    const double m = median(r.rates);
    rep->table.rows.push_back({r.name, fmt("%" PRIu64, r.each), fmt("%.2f", m),
                               fmt("%.2f", *std::min_element(r.rates.begin(), r.rates.end())),
                               fmt("%.2f", *std::max_element(r.rates.begin(), r.rates.end()))});
    rows.push(
        J::obj().set("producers", r.name).set("count", double(r.producers)).set("each", double(r.each)).set(key, m));
  }
  return rows;
}

void runPostRate(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                 const std::vector<std::string>& where);

void runMsgRate(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                const std::vector<std::string>& where) {
  if (o.transport == "ibgda") return runPostRate(comm, e, o, s, rep, where);
  const int me = comm.rank(), n = comm.nRanks(), peer = 1 % n;
  const bool gpu = e.gpu();
  if (!gin::test::CommAccess::proxyEngine(comm))
    throw gin::Error("msg-rate measures the proxy transport, which this communicator lacks");
  const int sms = bcast(comm, e.maxCtas(), 0);
  struct ShapeRow {
    std::string name;
    int ctas, threads;
  };
  std::vector<ShapeRow> shapes = {{"1 warp", 1, 32}};
  if (gpu) {
    shapes.push_back({"1 CTA (32 warps)", 1, 1024});
    shapes.push_back({fmt("1 warp per SM (%d warps)", sms), sms, 32});
    shapes.push_back({fmt("every warp (%d x 32 warps)", sms), sms, 1024});
  }
  const uint64_t perShape = o.iters ? uint64_t(o.iters) : (gpu ? (4ull << 20) : (200ull << 10));
  const int latIters = gpu ? 10000 : 2000;
  uint64_t pushed = 0;  // descriptors rank 0 pushed so far = the peer's signal
  std::vector<RateRes> res;
  // The peer waits for the count, then reads it (more would be a descriptor
  // run twice): a flush says the engine consumed the descriptors, not that
  // their signals reached the peer (over a network wire they may still travel).
  const auto verify = [&](const char* what) {
    const bool arrived = bcast(comm, me == peer ? uint64_t(e.waitSignal(kSigMsg, pushed)) : uint64_t(1), peer) != 0;
    const uint64_t g = bcast(comm, me == peer ? e.readSignal(kSigMsg) : uint64_t(0), peer);
    if (!arrived || g != pushed)
      throw Failure(fmt(
          "msg-rate verification failed after %s: rank %d's signal is %" PRIu64 ", expected %" PRIu64 "%s", what, peer,
          g, pushed, arrived ? "" : " (waitSignal gave up after the communicator's timeout, GIN_TIMEOUT_MS)"));
  };
  for (const ShapeRow& sh : shapes) {
    const int producers = sh.ctas * (sh.threads / 32);
    const int each = int(std::max<uint64_t>(16, perShape / uint64_t(producers)));
    RateRes r{sh.name, producers, uint64_t(each), {}};
    for (int run = -1; run < kLatRuns; ++run) {
      comm.bootstrap().barrier();
      if (me == 0) {
        const double t = e.msgRate(sh.ctas, sh.threads, peer, run < 0 ? std::min(each, 64) : each);
        if (run >= 0) r.rates.push_back(double(producers) * each / t / 1e6);
      }
      pushed += uint64_t(producers) * uint64_t(run < 0 ? std::min(each, 64) : each);
    }
    verify(sh.name.c_str());
    res.push_back(std::move(r));
  }
  std::vector<double> lat, pushLat, echo;
  for (int run = -1; run < kLatRuns; ++run) {
    comm.bootstrap().barrier();
    if (me == 0) {
      double push = 0;
      const double ns = e.msgLatencyNs(peer, latIters, &push);
      const double raw = e.rawEchoNs(latIters);
      if (run >= 0) {
        lat.push_back(ns / 1e3);
        pushLat.push_back(push / 1e3);
        echo.push_back(raw / 1e3);
      }
    }
    pushed += uint64_t(latIters);
  }
  verify("the latency runs");
  comm.bootstrap().barrier();
  if (me != 0) return;

  rep->head = headLines(o, s, where);
  const gin::ProxyConfig pc = comm.config().proxy;
  rep->method = {
      fmt("producers: lane 0 of every warp of the launch (CPU: one thread runs the warps in turn) pushes EACH "
          "SignalAdd(+1) descriptors to rank %d on context (warp index %% %d), alreadyReleased, then flush()es",
          peer, comm.devComm().nContexts),
      fmt("rings: %d contexts x %u slots in %s; one engine thread (spin %u polls, then yield, then sleep %u us)",
          comm.devComm().nContexts, pc.ringSlots, gpu ? "mapped pinned host memory" : "host memory", pc.spinPolls,
          pc.sleepUs),
      fmt("rate = producers x EACH / time, time = %s around the launch, which ends when every flush saw its "
          "descriptors consumed (so it is the rate the engine sustains)",
          timerName(gpu).c_str()),
      fmt("warm-up: one launch of up to 64 descriptors per producer; then %d timed runs: median, min, max", kLatRuns),
      fmt("latency: one thread, %d times: push one descriptor, flush; mean of (flush return - push start) "
          "(%s); %d runs, median",
          latIters, gpu ? "%globaltimer" : "steady_clock", kLatRuns),
      "verified: after each shape, the target's signal equals every descriptor pushed so far (none lost, none run "
      "twice)",
      fmt("raw echo (the floor, no gin code): the producer stores i into a word %s (system-scope release), a host "
          "thread spinning on it stores i into a second word, the producer polls that (system-scope acquire); "
          "mean of %d round trips",
          gpu ? "in mapped pinned host memory" : "in host memory", latIters),
  };
  rep->table.header = {"producers", "descriptors each", "median M desc/s", "min", "max"};
  J rows = rateRows(rep, res, "mdesc_per_s_median");
  const auto latRow = [&](const std::string& name, const std::vector<double>& v) {
    rep->table.rows.push_back({name, "1", fmt("%.3f", median(v)), fmt("%.3f", *std::min_element(v.begin(), v.end())),
                               fmt("%.3f", *std::max_element(v.begin(), v.end()))});
  };
  latRow("post-to-consume latency, us", lat);
  latRow("  of which the push, us", pushLat);
  latRow("raw echo through host memory, us", echo);
  rep->notes.push_back(fmt("post-to-consume / raw echo = %.2f", median(lat) / median(echo)));
  commonJson(*rep, o, s, where);
  rep->json.set("rates", std::move(rows));
  rep->json.set("latency_us_median", median(lat));
  rep->json.set("push_us_median", median(pushLat));
  rep->json.set("raw_echo_us_median", median(echo));
}

// ---- msg-rate over ibgda: the WQE post rate ----

void runPostRate(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                 const std::vector<std::string>& where) {
  const int me = comm.rank(), n = comm.nRanks(), peer = 1 % n;
  const bool gpu = e.gpu();
  gin::IbgdaTransport* ib = gin::test::CommAccess::ibgda(comm);
  if (!ib) throw gin::Error("msg-rate --transport ibgda: this communicator has no ibgda transport");
  const int sms = bcast(comm, e.maxCtas(), 0);
  struct ShapeRow {
    std::string name;
    int ctas, threads;
  };
  std::vector<ShapeRow> shapes = {{"1 thread", 1, 1}, {"1 warp (32 threads)", 1, 32}};
  if (gpu) {
    shapes.push_back({"1 SM (1 CTA x 256 threads)", 1, 256});
    shapes.push_back({fmt("the whole GPU (%d CTAs x 256 threads)", sms), sms, 256});
  }
  // The sink consumes a few million WQEs/s: 256 Ki per run keeps the op under a minute.
  const uint64_t perShape = o.iters ? uint64_t(o.iters) : (gpu ? (256ull << 10) : (64ull << 10));
  std::vector<RateRes> res;
  for (const ShapeRow& sh : shapes) {
    const int producers = sh.ctas * sh.threads;
    const int each = int(std::max<uint64_t>(8, perShape / uint64_t(producers)));
    RateRes r{sh.name, producers, uint64_t(each), {}};
    for (int run = -1; run < kLatRuns; ++run) {
      comm.bootstrap().barrier();
      if (me == 0) {
        const int count = run < 0 ? std::min(each, 16) : each;
        const uint64_t before = ib->nicExecuted();
        const double t = e.postRate(sh.ctas, sh.threads, peer, count);
        const uint64_t done = ib->nicExecuted() - before, want = uint64_t(producers) * uint64_t(count);
        // Every flush returned, so the NIC completed every WQE: exactly that many.
        if (ib->softNic() && done != want)
          throw Failure(fmt("msg-rate verification failed (%s): the NIC completed %" PRIu64 " WQEs, %" PRIu64
                            " were posted",
                            sh.name.c_str(), done, want));
        if (run >= 0) r.rates.push_back(double(want) / t / 1e6);
      }
    }
    if (me == 0) std::fprintf(stderr, "gin-bench msg-rate (ibgda): %s done\n", sh.name.c_str());
    res.push_back(std::move(r));
  }
  comm.bootstrap().barrier();
  if (me != 0) return;
  rep->head = headLines(o, s, where);
  const gin::IbgdaConfig& ic = ib->config();
  rep->method = {
      fmt("producers: every thread of the launch posts EACH SignalAdd(+1) WQEs (mlx5 atomic fetch-add, "
          "alreadyReleased) to rank %d on context (thread index %% %d), then flush()es (polls its CQ up to its "
          "last WQE)",
          peer, comm.devComm().nContexts),
      fmt("queues: %d contexts x %d peers QPs of %u WQEs in %s; doorbell %s; NIC: %s", comm.devComm().nContexts, n,
          ic.qpDepth, gpu ? "mapped pinned host memory" : "host memory",
          ic.deferDoorbell ? "deferred to flush" : "rung per post", ib->nicName().c_str()),
      "the sink NIC only completes: it reads each WQE's control segment and writes a CQE, nothing else, so the "
      "rate is gin's own posting cost (slot reservation, WQE build, in-order publication, doorbell record and "
      "UAR write, CQ polling) plus the sink's consumption",
      fmt("rate = WQEs / (%s around the launch); warm-up launch of up to 16 WQEs per producer; %d timed runs: "
          "median, min, max",
          timerName(gpu).c_str(), kLatRuns),
      ib->softNic() ? "verified: after each launch the NIC completed exactly the WQEs posted (none lost, none run "
                      "twice)"
                    : "verified: every flush returned (a real NIC does not report a count to check)",
  };
  rep->table.header = {"producers", "WQEs each", "median M WQE/s", "min", "max"};
  J rows = rateRows(rep, res, "mwqe_per_s_median");
  commonJson(*rep, o, s, where);
  rep->json.set("rates", std::move(rows));
}

// ---- allreduce ----

// Sizes: powers of two from MIN to MAX bytes of floats.
std::vector<uint64_t> arSizes(const Options& o, bool gpu) {
  const uint64_t lo = o.sizesGiven ? o.minSize : 4096;
  const uint64_t hi = o.sizesGiven ? o.maxSize : (gpu ? (1ull << 30) : (1ull << 20));
  std::vector<uint64_t> v;
  for (uint64_t b = lo; b <= hi; b *= 2) v.push_back(b / 4 * 4);
  return v;
}

// AllReduces per timed run: enough to amortize launches for small sizes.
int arIters(const Options& o, uint64_t bytes, bool gpu) {
  if (o.iters) return int(o.iters);
  if (!gpu) return bytes <= (64u << 10) ? 20 : 4;
  return bytes <= (1u << 20) ? 200 : bytes <= (64u << 20) ? 50 : 10;
}

// NCCL's bus bandwidth of an AllReduce: bytes x 2 (n - 1) / n / time.
double busBw(uint64_t bytes, int n, double seconds) {
  return seconds > 0 ? double(bytes) * 2.0 * (n - 1) / n / seconds / 1e9 : 0.0;
}

std::string shortPlan(const gin::coll::RingPlan& p) {
  if (p.ll) return fmt("LL16 %ux%u", p.nBlocks, p.blockSize);
  if (p.direct) return fmt("direct %ux%u", p.nBlocks, p.blockSize);
  return fmt("d%u c%s %ux%u s%u %s", p.depth, sizeName(p.chunkBytes).c_str(), p.nBlocks, p.blockSize, p.slots,
             p.bidir ? "bi" : "uni");
}

void runAllReduce(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                  const std::vector<std::string>& where) {
  const int me = comm.rank(), n = comm.nRanks();
  const bool gpu = e.gpu();
  const std::vector<uint64_t> sizes = arSizes(o, gpu);
  const uint64_t maxBytes = sizes.back();
  gin::coll::RingWorkspaceConfig wc;
  wc.tmpBytes = gpu ? (32ull << 20) : (1ull << 20);
  wc.maxBlocks = kArMaxBlocks;
  wc.signalBase = kArSignalBase;
  // Room for LL messages up to 1 MiB on GPUs, so GIN_ALLREDUCE_LL_MAX_SIZE can
  // be swept that far; the plan's own limit (1 MiB / nRanks by default) decides.
  if (gpu) wc.llMaxBytes = 1ull << 20;
  const gin::coll::RingWorkspace ws = gin::coll::createRingWorkspace(comm, wc);
  Window send = comm.allocWindow(size_t(maxBytes + kGuard)), recv = comm.allocWindow(size_t(maxBytes + kGuard));
  uint64_t seed = 1;

  std::string ncclReason = ncclSkipReason(o, gpu);
#if GIN_BENCH_NCCL
  NcclSide nccl;
  const bool withNccl = nccl.start(comm, ncclReason, 0, size_t(maxBytes), size_t(maxBytes + kGuard));
  float *ncclSend = static_cast<float*>(nccl.send), *ncclRecv = static_cast<float*>(nccl.recv);
#else
  const bool withNccl = false;
#endif

  // Every rank times its own run; a run counts the smallest time over the
  // ranks (the rank that started last has no start skew). Median over runs.
  auto timeRuns = [&](int iters, const std::function<double(int)>& once) {
    comm.bootstrap().barrier();
    once(std::max(1, iters / 10));  // warm-up
    std::vector<double> runs;
    for (int r = 0; r < kArRuns; ++r) {
      comm.bootstrap().barrier();
      const double t = once(iters);
      const auto all = allGather(comm, t);
      runs.push_back(*std::min_element(all.begin(), all.end()) / iters);
    }
    return runs;
  };
  auto agreeBad = [&](const char* who, uint64_t bytes, uint64_t bad) {
    const auto all = allGather(comm, bad);
    for (int r = 0; r < n; ++r)
      if (all[size_t(r)])
        throw Failure(fmt("allreduce verification failed: %s, %s: rank %d has %" PRIu64
                          " wrong floats or overwritten guard bytes",
                          who, sizeName(bytes).c_str(), r, all[size_t(r)]));
  };

  struct Row {
    uint64_t bytes;
    gin::coll::RingPlan plan;
    int iters;
    std::vector<double> gin, nccl;  // seconds per AllReduce, per run
  };
  std::vector<Row> rows;
  for (uint64_t bytes : sizes) {
    const size_t count = size_t(bytes / 4);
    const gin::coll::RingPlan plan = gin::coll::planRingAllReduce(comm, ws, count, sizeof(float));
    Row row{bytes, plan, arIters(o, bytes, gpu), {}, {}};
    // Verified first, twice (the second call reuses the slots and signals).
    for (int k = 0; k < 2; ++k) {
      ++seed;
      e.arFill(comm.localPointer(send), count, me, seed);
      e.poison(recv, size_t(maxBytes + kGuard));
      comm.bootstrap().barrier();
      (void)e.arRun(ws, plan, send, recv, 1);
      comm.bootstrap().barrier();
      agreeBad("gin ring", bytes, e.arCheck(comm.localPointer(recv), count, n, seed, kGuard));
    }
    row.gin = timeRuns(row.iters, [&](int it) { return e.arRun(ws, plan, send, recv, it); });
#if GIN_BENCH_NCCL
    if (withNccl) {
      auto& ge = static_cast<GpuEngine&>(e);
      ge.copyLocal(ncclSend, comm.localPointer(send), size_t(bytes));
      ge.poisonBytes(ncclRecv, size_t(bytes + kGuard));
      comm.bootstrap().barrier();
      (void)ge.ncclAllReduceTime(nccl.comm, ncclSend, ncclRecv, count, 1);
      agreeBad("ncclAllReduce", bytes, e.arCheck(ncclRecv, count, n, seed, kGuard));
      row.nccl =
          timeRuns(row.iters, [&](int it) { return ge.ncclAllReduceTime(nccl.comm, ncclSend, ncclRecv, count, it); });
    }
#endif
    rows.push_back(std::move(row));
  }
  comm.bootstrap().barrier();
#if GIN_BENCH_NCCL
  nccl.close();
#endif
  comm.deregisterWindow(send);
  comm.deregisterWindow(recv);
  gin::coll::destroyRingWorkspace(comm, ws);
  if (me != 0) return;

  rep->head = headLines(o, s, where);
  rep->method = {
      "gin: gin::coll ring AllReduce (CTRING: ReduceScatter + AllGather over puts into the next rank's temporary "
      "slots),",
      "  float sum, out of place, plan from gin::coll::planRingAllReduce (Hopper auto-tuning + GIN_ALLREDUCE_RING_*",
      "  overrides); plan column: pipeline depth, chunk size, blocks x threads, slots per block, AllGather direction",
      gpu ? "launch: one kernel per AllReduce (launchRingAllReduce), ITERS back to back on the rank's stream"
          : "CPU emulation: each rank thread runs the plan's blocks one after another (runRingAllReduce)",
      fmt("timer: %s around ITERS AllReduces; per run the smallest time over the ranks / ITERS; warm-up ITERS/10;",
          timerName(gpu).c_str()),
      fmt("  %d runs, median reported", kArRuns),
      "busBw = bytes x 2 (n - 1) / n / time (NCCL's definition); algBw would be bytes / time",
      "verified first, twice per size: every float equals the exact sum (small integers), guard bytes untouched",
  };
  if (withNccl)
    rep->method.push_back(
        "nccl: ncclAllReduce(float, sum) on the same GPUs, same sizes, same timing, its own cudaMalloc buffers, "
        "verified the same way");
  if (gpu)
    rep->table.header = {"bytes", "gin us", "gin busBw GB/s", "nccl us", "nccl busBw GB/s", "gin/nccl time", "plan"};
  else
    rep->table.header = {"bytes", "us", "busBw GB/s", "plan"};
  J jrows = J::arr();
  for (const Row& r : rows) {
    const double g = median(r.gin), c = withNccl ? median(r.nccl) : 0.0;
    if (gpu)
      rep->table.rows.push_back({sizeName(r.bytes), fmt("%.2f", g * 1e6), fmt("%.2f", busBw(r.bytes, n, g)),
                                 withNccl ? fmt("%.2f", c * 1e6) : std::string("-"),
                                 withNccl ? fmt("%.2f", busBw(r.bytes, n, c)) : std::string("-"),
                                 withNccl && c > 0 ? fmt("%.2f", g / c) : std::string("-"), shortPlan(r.plan)});
    else
      rep->table.rows.push_back(
          {sizeName(r.bytes), fmt("%.2f", g * 1e6), fmt("%.3f", busBw(r.bytes, n, g)), shortPlan(r.plan)});
    J row = J::obj();
    J gr = J::arr();
    for (double x : r.gin) gr.push(J::num(x * 1e6));
    row.set("bytes", double(r.bytes))
        .set("iters", double(r.iters))
        .set("plan", gin::coll::describe(r.plan))
        .set("gin_us", g * 1e6)
        .set("gin_busbw_gbs", busBw(r.bytes, n, g))
        .set("gin_runs_us", std::move(gr));
    if (withNccl) {
      J nr = J::arr();
      for (double x : r.nccl) nr.push(J::num(x * 1e6));
      row.set("nccl_us", c * 1e6).set("nccl_busbw_gbs", busBw(r.bytes, n, c)).set("nccl_runs_us", std::move(nr));
    }
    jrows.push(std::move(row));
  }
  rep->notes.push_back(withNccl ? "nccl: measured (ncclAllReduce on the same GPUs, same sizes)"
                                : "nccl: not measured (" + ncclReason + ")");
  commonJson(*rep, o, s, where);
  rep->json.set("method", J::obj()
                              .set("operation", "gin::coll ring AllReduce, float sum, out of place")
                              .set("runs", double(kArRuns))
                              .set("statistic", "median over runs of the smallest per-rank time / iters")
                              .set("busbw", "bytes * 2 * (n - 1) / n / time")
                              .set("timer", timerName(gpu)));
  rep->json.set("verified", J::boolean(true));
  rep->json.set("results", std::move(jrows));
  rep->json.set("nccl", withNccl ? J::obj().set("measured", J::boolean(true))
                                 : J::obj().set("measured", J::boolean(false)).set("reason", ncclReason));
}

// ---- sendrecv and moe: shared pieces ----

// Every rank times its own run of `iters` operations after a host barrier; a
// run counts the smallest time over the ranks (the rank that started last has
// no start skew) / iters. Returns seconds per operation, one per run.
std::vector<double> timeRunsMinRank(gin::Comm& comm, int iters, int runs, const std::function<double(int)>& once) {
  comm.bootstrap().barrier();
  once(std::max(1, iters / 10));  // warm-up
  std::vector<double> v;
  for (int r = 0; r < runs; ++r) {
    comm.bootstrap().barrier();
    const double t = once(iters);
    const auto all = allGather(comm, t);
    v.push_back(*std::min_element(all.begin(), all.end()) / iters);
  }
  return v;
}

// A count of bad bytes (or outputs) on some rank fails every rank alike.
void agreeBad(gin::Comm& comm, const std::string& what, uint64_t bad) {
  const auto all = allGather(comm, bad);
  for (int r = 0; r < comm.nRanks(); ++r)
    if (all[size_t(r)])
      throw Failure(fmt("%s: rank %d has %" PRIu64 " wrong bytes or values", what.c_str(), r, all[size_t(r)]));
}

double gbs(double bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0.0; }

J runsJson(const std::vector<double>& secs) {
  J a = J::arr();
  for (double x : secs) a.push(J::num(x * 1e6));
  return a;
}

// ---- sendrecv ----

std::vector<uint64_t> srSizes(const Options& o, bool gpu) {
  const uint64_t lo = o.sizesGiven ? o.minSize : 4096;
  const uint64_t hi = o.sizesGiven ? o.maxSize : (gpu ? (1ull << 30) : (1ull << 20));
  std::vector<uint64_t> v;
  for (uint64_t b = lo; b <= hi; b *= 2) v.push_back(b);
  return v;
}

int srIters(const Options& o, uint64_t bytes, bool gpu) {
  if (o.iters) return int(o.iters);
  if (!gpu) return bytes <= (64u << 10) ? 20 : 4;
  return bytes <= (1u << 20) ? 200 : bytes <= (64u << 20) ? 50 : 10;
}

int srMaxChannels(const Options& o, bool gpu) {
  return o.channels ? o.channels : gpu ? kSrMaxChannelsGpu : kSrMaxChannelsCpu;
}

// One channel per kSrBytesPerChannel, at least one, at most the FIFO's.
int srChannels(uint64_t bytes, int maxCh) {
  const uint64_t want = (bytes + kSrBytesPerChannel - 1) / kSrBytesPerChannel;
  return int(std::clamp<uint64_t>(want, 1, uint64_t(maxCh)));
}

// Seeds of the data rank `from` sends in verification round `seed`.
uint64_t srSeed(uint64_t seed, int from) { return mix(seed * 4096 + uint64_t(from)); }

void runSendRecv(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                 const std::vector<std::string>& where) {
  const int me = comm.rank(), n = comm.nRanks(), from = (me + n - 1) % n;
  const bool gpu = e.gpu();
  const std::vector<uint64_t> sizes = srSizes(o, gpu);
  const uint64_t maxBytes = sizes.back();
  const int maxCh = srMaxChannels(o, gpu);
  gin::p2p::Config pc;
  pc.nChannels = uint32_t(maxCh);
  pc.chunkBytes = gpu ? kSrChunkGpu : kSrChunkCpu;
  pc.nSlots = kSrSlots;
  const gin::p2p::Fifo fifo = gin::p2p::create(comm, pc);
  Window src = comm.allocWindow(size_t(maxBytes)), dst = comm.allocWindow(size_t(maxBytes + kGuard));
  uint64_t seed = 1;

  std::string ncclReason = ncclSkipReason(o, gpu);
#if GIN_BENCH_NCCL
  NcclSide nccl;
  const bool withNccl = nccl.start(comm, ncclReason, 0, size_t(maxBytes), size_t(maxBytes + kGuard));
  auto *ncclSend = static_cast<uint8_t*>(nccl.send), *ncclRecv = static_cast<uint8_t*>(nccl.recv);
#else
  const bool withNccl = false;
#endif

  struct Row {
    uint64_t bytes;
    int channels, iters;
    std::vector<double> gin, nccl;  // seconds per ring shift, per run
  };
  std::vector<Row> rows;
  for (uint64_t bytes : sizes) {
    Row row{bytes, srChannels(bytes, maxCh), srIters(o, bytes, gpu), {}, {}};
    // Verified first, twice (the second call reuses the FIFO rings, their
    // step counts carried over in the signal shadows).
    for (int k = 0; k < 2; ++k) {
      ++seed;
      e.fill(src, size_t(bytes), srSeed(seed, me));
      e.poison(dst, size_t(bytes + kGuard));
      comm.bootstrap().barrier();
      (void)e.ringShift(fifo, src, dst, size_t(bytes), row.channels, 1);
      comm.bootstrap().barrier();
      agreeBad(comm, fmt("sendrecv verification failed: gin p2p, %s", sizeName(bytes).c_str()),
               e.checkLocal(dst, size_t(bytes), srSeed(seed, from)));
    }
    row.gin = timeRunsMinRank(comm, row.iters, kSrRuns,
                              [&](int it) { return e.ringShift(fifo, src, dst, size_t(bytes), row.channels, it); });
#if GIN_BENCH_NCCL
    if (withNccl) {
      auto& ge = static_cast<GpuEngine&>(e);
      // The same ring shift as one ncclSend + ncclRecv group (with 1 rank,
      // both to itself, as gin's).
      std::vector<size_t> sends(size_t(n), 0), recvs(size_t(n), 0), offs(size_t(n), 0);
      sends[size_t((me + 1) % n)] = size_t(bytes);
      recvs[size_t(from)] = size_t(bytes);
      ge.copyLocal(ncclSend, comm.localPointer(src), size_t(bytes));
      ge.poisonBytes(ncclRecv, size_t(bytes + kGuard));
      comm.bootstrap().barrier();
      (void)ge.ncclExchange(nccl.comm, ncclSend, offs, sends, ncclRecv, offs, recvs, 1);
      agreeBad(comm, fmt("sendrecv verification failed: ncclSend/ncclRecv, %s", sizeName(bytes).c_str()),
               ge.checkBytes(ncclRecv, size_t(bytes), srSeed(seed, from), kGuard));
      row.nccl = timeRunsMinRank(comm, row.iters, kSrRuns, [&](int it) {
        return ge.ncclExchange(nccl.comm, ncclSend, offs, sends, ncclRecv, offs, recvs, it);
      });
    }
#endif
    rows.push_back(std::move(row));
  }
  comm.bootstrap().barrier();
#if GIN_BENCH_NCCL
  nccl.close();
#endif
  comm.deregisterWindow(src);
  comm.deregisterWindow(dst);
  gin::p2p::destroy(comm, fifo);
  if (me != 0) return;

  rep->head = headLines(o, s, where);
  rep->method = {
      "gin: gin::p2p send/recv (step FIFO, NCCL's P2P design) as a ring shift: every rank sends BYTES from its",
      "  source window to rank+1 and receives BYTES from rank-1; one rank sends to itself",
      fmt("  the bytes are cut into CH contiguous shares, one p2p channel each (its own FIFO ring of %u x %s slots),",
          kSrSlots, sizeName(pc.chunkBytes).c_str()),
      fmt("  CH = one per %s, 1 to %d (--channels)", sizeName(kSrBytesPerChannel).c_str(), maxCh),
      gpu ? fmt("launch: one kernel per shift, CH sending CTAs (Endpoint::send) + CH receiving CTAs (Endpoint::recv) x "
                "%d threads, ITERS back to back on the rank's stream",
                kSrThreads)
          : "CPU emulation: each rank thread runs Endpoint::sendRecv (interleaved steps) channel after channel",
      fmt("timer: %s around ITERS shifts; per run the smallest time over the ranks / ITERS; warm-up ITERS/10;",
          timerName(gpu).c_str()),
      fmt("  %d runs, median reported; latency = time per shift, GB/s = BYTES / time (each rank sends and receives "
          "BYTES)",
          kSrRuns),
      "verified first, twice per size: seeded pseudo-random bytes, the receive buffer poisoned, every byte",
      "  compared with the sender's pattern, 64 guard bytes after it untouched",
  };
  if (withNccl)
    rep->method.push_back(
        "nccl: ncclGroupStart; ncclSend(rank+1); ncclRecv(rank-1); ncclGroupEnd per shift, same sizes, same timing, "
        "its own cudaMalloc buffers, verified the same way");
  if (gpu)
    rep->table.header = {"bytes", "CH", "gin us", "gin GB/s", "nccl us", "nccl GB/s", "gin/nccl time"};
  else
    rep->table.header = {"bytes", "CH", "us", "GB/s"};
  J jrows = J::arr();
  for (const Row& r : rows) {
    const double g = median(r.gin), c = withNccl ? median(r.nccl) : 0.0;
    if (gpu)
      rep->table.rows.push_back({sizeName(r.bytes), std::to_string(r.channels), fmt("%.2f", g * 1e6),
                                 fmt("%.2f", gbs(double(r.bytes), g)), withNccl ? fmt("%.2f", c * 1e6) : "-",
                                 withNccl ? fmt("%.2f", gbs(double(r.bytes), c)) : "-",
                                 withNccl && c > 0 ? fmt("%.2f", g / c) : "-"});
    else
      rep->table.rows.push_back(
          {sizeName(r.bytes), std::to_string(r.channels), fmt("%.2f", g * 1e6), fmt("%.3f", gbs(double(r.bytes), g))});
    J row = J::obj();
    row.set("bytes", double(r.bytes))
        .set("channels", double(r.channels))
        .set("iters", double(r.iters))
        .set("gin_us", g * 1e6)
        .set("gin_gbs", gbs(double(r.bytes), g))
        .set("gin_runs_us", runsJson(r.gin));
    if (withNccl)
      row.set("nccl_us", c * 1e6).set("nccl_gbs", gbs(double(r.bytes), c)).set("nccl_runs_us", runsJson(r.nccl));
    jrows.push(std::move(row));
  }
  rep->notes.push_back(withNccl ? "nccl: measured (ncclSend/ncclRecv group on the same GPUs, same sizes)"
                                : "nccl: not measured (" + ncclReason + ")");
  commonJson(*rep, o, s, where);
  rep->json.set("method", J::obj()
                              .set("operation", "gin::p2p ring shift: send to rank+1, recv from rank-1")
                              .set("chunk_bytes", double(pc.chunkBytes))
                              .set("slots", double(kSrSlots))
                              .set("max_channels", double(maxCh))
                              .set("runs", double(kSrRuns))
                              .set("statistic", "median over runs of the smallest per-rank time / iters")
                              .set("gbs", "bytes / time (each rank sends and receives bytes)")
                              .set("timer", timerName(gpu)));
  rep->json.set("verified", J::boolean(true));
  rep->json.set("results", std::move(jrows));
  rep->json.set("nccl", withNccl ? J::obj().set("measured", J::boolean(true))
                                 : J::obj().set("measured", J::boolean(false)).set("reason", ncclReason));
}

// ---- moe ----

// The layer the op runs: E = 8 experts per rank, top-8 (top-E when E < 8),
// hidden 7168 bf16 (1024 emulated); normal mode 4096 tokens per rank (256
// emulated) over up to 64 channels with rings of 32 slots (2 and 4
// emulated), low latency 128 (32 emulated). Normal-mode dispatch time falls
// with the channels and with slots up to 16 (one H100, 1 rank, 2026-11-25:
// 263 / 194 / 191 us with 32 channels and 8 / 16 / 32 slots, 166 / 139 / 143
// with 64; --batch made no difference there). The dispatch kernel's C + R x C
// CTAs must all be resident (GpuLayer checks; two fit per SM), and they spin:
// C x (1 + R) stays within one per SM (132 on an H100/H200), and within half
// that over the proxy or ibgda, whose ranks may share a GPU.
gin::ep::Shape moeShape(const Options& o, int ranks, bool gpu, bool ll) {
  gin::ep::Shape sh;
  sh.ranks = ranks;
  sh.experts = kMoeExpertsPerRank * ranks;
  sh.topk = std::min(kMoeTopk, sh.experts);
  sh.hidden = o.hidden ? o.hidden : gpu ? 7168 : 1024;
  sh.tokens = o.tokensGiven ? o.tokens : ll ? (gpu ? 128 : 32) : (gpu ? 4096 : 256);
  const int ctas = o.transport == "lsa" ? 132 : 66;
  sh.channels = o.channels ? o.channels : gpu ? std::min(64, std::max(1, ctas / (1 + ranks))) : 2;
  sh.slots = o.slots ? o.slots : gpu ? 32 : 4;
  sh.batch = o.batch;
  return sh;
}

std::vector<bool> moeModes(const Options& o) {  // low latency?
  if (o.mode == "normal") return {false};
  if (o.mode == "ll") return {true};
  return {false, true};
}

int moeIters(const Options& o, bool gpu) { return o.iters ? int(o.iters) : gpu ? 20 : 3; }

void runMoe(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
            const std::vector<std::string>& where) {
  const int me = comm.rank(), n = comm.nRanks();
  const bool gpu = e.gpu();
  const int K = moeIters(o, gpu);

  std::string ncclReason = ncclSkipReason(o, gpu);
#if GIN_BENCH_NCCL
  NcclSide nccl;
  const bool withNccl = nccl.start(comm, ncclReason, 0);
#else
  const bool withNccl = false;
#endif

  struct Row {
    bool ll;
    const char* phase;
    gin::ep::Shape sh;
    double crossBytes, allBytes;    // per rank (mean over ranks): to other ranks; including itself
    std::vector<double> gin, nccl;  // seconds, per timed layer (smallest over the ranks)
    std::vector<double> ginMax;     // seconds, per timed layer (largest over the ranks)
  };
  std::vector<Row> rows;
  uint64_t seed = 100;
  for (const bool ll : moeModes(o)) {
    const gin::ep::Shape sh = moeShape(o, n, gpu, ll);
    const char* mode = ll ? "low-latency" : "normal";
    std::unique_ptr<MoeRunner> layer = e.moeLayer(sh, ll);
    // Verified first, twice (the second layer reuses the reset signals); the
    // timed layers rerun the second one's inputs.
    gin::ep::Inputs in;
    for (int k = 0; k < 2; ++k) {
      in = gin::ep::makeInputs(sh, me, ++seed);
      const std::vector<float> out = layer->run(in);
      size_t first = 0;
      const size_t bad = gin::ep::mismatches(out, gin::ep::reference(sh, in), &first);
      agreeBad(comm, fmt("moe verification failed: %s mode, %d tokens, against the host reference", mode, sh.tokens),
               bad);
    }
    // Who sends how many units to whom: U[r][d].
    const std::vector<uint64_t> mine = gin::ep::dispatchUnits(sh, in, ll);
    std::vector<uint64_t> U(size_t(n) * size_t(n));
    std::copy(mine.begin(), mine.end(), U.begin() + ptrdiff_t(size_t(me) * size_t(n)));
    comm.bootstrap().allGather(U.data(), size_t(n) * sizeof(uint64_t));
    auto units = [&](int r, int d) { return U[size_t(r) * size_t(n) + size_t(d)]; };
    const size_t du = gin::ep::dispatchUnitBytes(sh, ll), cu = gin::ep::combineUnitBytes(sh);
    double cross = 0, all = 0;
    for (int r = 0; r < n; ++r)
      for (int d = 0; d < n; ++d) {
        all += double(units(r, d));
        cross += r == d ? 0.0 : double(units(r, d));
      }

    Row rd{ll, "dispatch", sh, cross * double(du) / n, all * double(du) / n, {}, {}, {}};
    Row rc{ll, "combine", sh, cross * double(cu) / n, all * double(cu) / n, {}, {}, {}};
    (void)layer->timed();  // warm-up
    for (int k = 0; k < K; ++k) {
      const MoeTimes t = layer->timed();
      const auto ts = allGather(comm, t);
      double dMin = 1e30, dMax = 0, cMin = 1e30, cMax = 0;
      for (const MoeTimes& x : ts) {
        dMin = std::min(dMin, x.dispatchS), dMax = std::max(dMax, x.dispatchS);
        cMin = std::min(cMin, x.combineS), cMax = std::max(cMax, x.combineS);
      }
      rd.gin.push_back(dMin), rd.ginMax.push_back(dMax);
      rc.gin.push_back(cMin), rc.ginMax.push_back(cMax);
    }
    layer.reset();

#if GIN_BENCH_NCCL
    if (withNccl) {
      // The same bytes per peer as one group of ncclSend/ncclRecv (this rank
      // included): dispatch sends U[me][d] units to d and receives U[s][me]
      // from s; combine returns as many rows the other way.
      auto& ge = static_cast<GpuEngine&>(e);
      for (Row* row : {&rd, &rc}) {
        const bool isDispatch = row == &rd;
        const size_t ub = isDispatch ? du : cu;
        const size_t N = size_t(n);
        std::vector<size_t> sends(N, 0), recvs(N, 0), sOff(N, 0), rOff(N, 0);
        size_t sTot = 0, rTot = 0;
        for (int p = 0; p < n; ++p) {
          sends[size_t(p)] = size_t(isDispatch ? units(me, p) : units(p, me)) * ub;
          recvs[size_t(p)] = size_t(isDispatch ? units(p, me) : units(me, p)) * ub;
          sOff[size_t(p)] = sTot, rOff[size_t(p)] = rTot;
          sTot += sends[size_t(p)], rTot += recvs[size_t(p)];
        }
        uint8_t *sb = nullptr, *rb = nullptr;
        BENCH_CUDA(cudaMalloc(&sb, std::max<size_t>(sTot, 16)));
        BENCH_CUDA(cudaMalloc(&rb, std::max<size_t>(rTot, 16)));
        ++seed;
        for (int p = 0; p < n; ++p) ge.fillBytes(sb + sOff[size_t(p)], sends[size_t(p)], srSeed(seed, me * n + p));
        ge.poisonBytes(rb, std::max<size_t>(rTot, 16));
        comm.bootstrap().barrier();
        (void)ge.ncclExchange(nccl.comm, sb, sOff, sends, rb, rOff, recvs, 1);
        uint64_t bad = 0;
        for (int p = 0; p < n; ++p)
          bad += ge.checkBytes(rb + rOff[size_t(p)], recvs[size_t(p)], srSeed(seed, p * n + me));
        agreeBad(comm, fmt("moe verification failed: NCCL all-to-all (%s mode %s bytes)", mode, row->phase), bad);
        comm.bootstrap().barrier();
        (void)ge.ncclExchange(nccl.comm, sb, sOff, sends, rb, rOff, recvs, 1);  // warm-up
        for (int k = 0; k < K; ++k) {
          comm.bootstrap().barrier();
          const double t = ge.ncclExchange(nccl.comm, sb, sOff, sends, rb, rOff, recvs, 1);
          const auto ts = allGather(comm, t);
          row->nccl.push_back(*std::min_element(ts.begin(), ts.end()));
        }
        cudaFree(sb);
        cudaFree(rb);
      }
    }
#endif
    rows.push_back(std::move(rd));
    rows.push_back(std::move(rc));
  }
  comm.bootstrap().barrier();
#if GIN_BENCH_NCCL
  nccl.close();
#endif
  if (me != 0) return;

  const gin::ep::Shape s0 = rows.front().sh;
  rep->head = headLines(o, s, where);
  rep->method = {
      fmt("gin: gin::ep (DeepEP-style) layer, %d experts (%d per rank), top-%d, hidden %d bf16, expert = x * (1 + "
          "e/64)",
          s0.experts, s0.localExperts(), s0.topk, s0.hidden),
      fmt("  normal mode: counts, then %d channels stream tokens through per-(source, channel) rings of %d slots "
          "(tails and heads advanced every %d slot(s)); combine",
          s0.channels, s0.slots, s0.batch),
      fmt("  puts float partials back, the source sums; low latency: per-expert buffers, one put per (token, "
          "expert) from %d sender(s) per expert,",
          s0.llSenders),
      "  combine returns each (token, k) row, the source reduces with the routing weights",
      gpu ? "  kernels of gin::ep::GpuLayer on the rank's stream; dispatch = from the first kernel until every token "
            "sent "
            "to the rank is here"
          : "  gin::ep::CpuLayer on the rank thread; dispatch = from the layer's start until every token sent to the "
            "rank "
            "is here",
      "  (low latency: plus a wait for every count), combine = from there to the end (experts,",
      "  returns, sums)",
      fmt("timer: %s; each timed layer after a host barrier, %d layers after a warm-up one; per layer the smallest",
          timerName(gpu).c_str(), K),
      "  time over the ranks (the last to start); reported: median over layers",
      "bytes: what crosses ranks per rank (mean over the ranks): dispatch = (token, rank) units x (metadata + token)",
      "  (low latency: (token, expert) units x (16 + token)); combine = as many float rows of hidden x 4 bytes back;",
      "  GB/s = those bytes / time (a rank's own units are moved too, but not counted)",
      "verified first, twice per mode: every output equals the host reference (gin::ep::reference, relative 1e-5)",
  };
  if (withNccl)
    rep->method.push_back(
        "nccl: one ncclGroupStart/End of ncclSend + ncclRecv to and from every rank (itself included) with the "
        "layer's bytes per peer, its own buffers, verified (per-peer patterns), timed the same way");
  if (gpu)
    rep->table.header = {"mode",     "phase",   "tokens",    "MB/rank",      "gin us",
                         "gin GB/s", "nccl us", "nccl GB/s", "gin/nccl time"};
  else
    rep->table.header = {"mode", "phase", "tokens", "MB/rank", "us", "GB/s"};
  J jrows = J::arr();
  for (const Row& r : rows) {
    const double g = median(r.gin), c = withNccl ? median(r.nccl) : 0.0;
    const char* mode = r.ll ? "ll" : "normal";
    if (gpu)
      rep->table.rows.push_back(
          {mode, r.phase, std::to_string(r.sh.tokens), fmt("%.2f", r.crossBytes / 1e6), fmt("%.1f", g * 1e6),
           fmt("%.2f", gbs(r.crossBytes, g)), withNccl ? fmt("%.1f", c * 1e6) : "-",
           withNccl ? fmt("%.2f", gbs(r.crossBytes, c)) : "-", withNccl && c > 0 ? fmt("%.2f", g / c) : "-"});
    else
      rep->table.rows.push_back({mode, r.phase, std::to_string(r.sh.tokens), fmt("%.3f", r.crossBytes / 1e6),
                                 fmt("%.1f", g * 1e6), fmt("%.3f", gbs(r.crossBytes, g))});
    J row = J::obj();
    row.set("mode", mode)
        .set("phase", r.phase)
        .set("tokens", double(r.sh.tokens))
        .set("hidden", double(r.sh.hidden))
        .set("topk", double(r.sh.topk))
        .set("experts", double(r.sh.experts))
        .set("channels", double(r.sh.channels))
        .set("cross_bytes_per_rank", r.crossBytes)
        .set("all_bytes_per_rank", r.allBytes)
        .set("gin_us", g * 1e6)
        .set("gin_gbs", gbs(r.crossBytes, g))
        .set("gin_runs_us", runsJson(r.gin))
        .set("gin_max_rank_us", median(r.ginMax) * 1e6);
    if (withNccl)
      row.set("nccl_us", c * 1e6).set("nccl_gbs", gbs(r.crossBytes, c)).set("nccl_runs_us", runsJson(r.nccl));
    jrows.push(std::move(row));
  }
  if (n == 1)
    rep->notes.push_back("1 rank: nothing crosses ranks (MB/rank and GB/s are 0); the times are the local path");
  rep->notes.push_back(withNccl ? "nccl: measured (an ncclSend/ncclRecv all-to-all with the same bytes per peer)"
                                : "nccl: not measured (" + ncclReason + ")");
  commonJson(*rep, o, s, where);
  rep->json.set("method", J::obj()
                              .set("operation", "gin::ep dispatch and combine")
                              .set("layers", double(K))
                              .set("statistic", "median over layers of the smallest per-rank time")
                              .set("gbs", "bytes crossing ranks per rank (mean) / time")
                              .set("timer", timerName(gpu)));
  rep->json.set("verified", J::boolean(true));
  rep->json.set("results", std::move(jrows));
  rep->json.set("nccl", withNccl ? J::obj().set("measured", J::boolean(true))
                                 : J::obj().set("measured", J::boolean(false)).set("reason", ncclReason));
}

// ---------------------------------------------------------------------------
// Driver.

int visibleGpus() {
#if defined(__CUDACC__)
  return gin::cudaDeviceCountOrZero();
#else
  return 0;
#endif
}

// --transport into the Comm's config. ibgda: the soft NIC as a sink unless
// GIN_IBGDA_DEVICE names another NIC.
void setTransport(const Options& o, gin::CommConfig* cfg) {
  if (o.transport == "ibgda") {
    cfg->transport = gin::TransportChoice::Ibgda;
    const char* dev = std::getenv("GIN_IBGDA_DEVICE");
    // msg-rate measures posting only (sink); sendrecv moves data (the full soft NIC).
    const auto soft = o.op == Op::MsgRate ? gin::IbgdaConfig::Device::SoftSink : gin::IbgdaConfig::Device::Soft;
    cfg->ibgda.device = dev && *dev ? gin::IbgdaConfig::Device::Auto : soft;
  } else {
    cfg->transport = o.transport == "proxy" ? gin::TransportChoice::Proxy : gin::TransportChoice::Lsa;
  }
}

// sendrecv's FIFOs and moe's layer take more signal ids than the default
// may hold (2 x channels x ranks; gin::ep::signalsNeeded).
void sizeSignals(const Options& o, int ranks, bool gpu, gin::CommConfig* cfg) {
  uint64_t need = 0;
  if (o.op == Op::SendRecv) {
    gin::p2p::Config pc;
    pc.nChannels = uint32_t(srMaxChannels(o, gpu));
    need = gin::p2p::signalsNeeded(pc, ranks);
  } else if (o.op == Op::Moe) {
    for (const bool ll : moeModes(o))
      need = std::max<uint64_t>(need, gin::ep::signalsNeeded(moeShape(o, ranks, gpu, ll)));
  }
  cfg->nSignals = int(std::max<uint64_t>(uint64_t(cfg->nSignals), need + 8));
}

Setup decide(const Options& o) {
  Setup s;
  const bool needsTwo = o.op == Op::PutBw || o.op == Op::SignalLat;
  // Over the proxy the GPUs never address each other, so ranks may share one.
  const bool mayShare = o.transport != "lsa" && o.op != Op::PutBw;
  const int gpus = o.emulate ? 0 : visibleGpus();
  if (!o.emulate && gpus == 0) {
#if defined(__CUDACC__)
    s.whyEmulated = "no CUDA device is visible: running CPU emulation instead (same as --emulate)";
#else
    s.whyEmulated = "this gin-bench was built without nvcc: running CPU emulation (same as --emulate)";
#endif
  }
  if (gpus > 0) {
    s.gpu = true;
    s.ranks = o.ranks ? o.ranks : (o.op == Op::MsgRate ? 1 : gpus);
    if (needsTwo && mayShare && s.ranks < 2 && !o.ranks) s.ranks = 2;
    s.gpus = gpus;
    if (s.ranks > gpus && !mayShare) {
      std::fprintf(stderr, "gin-bench: --ranks %d, but only %d GPU%s visible; one rank per GPU\n", s.ranks, gpus,
                   gpus == 1 ? " is" : "s are");
      std::exit(2);
    }
    if (needsTwo && s.ranks < 2) {
      std::fprintf(
          stderr,
          "gin-bench: %s needs 2 ranks on 2 GPUs (rank 0 on one GPU talks to rank 1 on another), but %s. Run it on a "
          "machine with at least 2 GPUs, or use --emulate for CPU ranks.\n",
          o.opName.c_str(),
          o.ranks ? ("--ranks is " + std::to_string(o.ranks)).c_str()
                  : (std::to_string(gpus) + " GPU is visible").c_str());
      std::exit(2);
    }
  } else {
    s.gpu = false;
    s.ranks = o.ranks ? o.ranks : (o.op == Op::MsgRate ? 1 : 2);
    if (needsTwo && s.ranks < 2) {
      std::fprintf(stderr, "gin-bench: %s needs at least 2 ranks (rank 0 talks to rank 1); --ranks is %d\n",
                   o.opName.c_str(), s.ranks);
      std::exit(2);
    }
  }
  return s;
}

std::unique_ptr<Engine> makeEngine(gin::Comm& comm, const Setup& s) {
#if defined(__CUDACC__)
  if (s.gpu) return std::make_unique<GpuEngine>(comm);
#endif
  (void)s;
  return std::make_unique<CpuEngine>(comm);
}

void runOp(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* mine,
           const std::vector<std::string>& where) {
  switch (o.op) {
    case Op::PutBw: runPutBw(comm, e, o, s, mine, where); break;
    case Op::SignalLat: runSignalLat(comm, e, o, s, mine, where); break;
    case Op::Barrier: runBarrier(comm, e, o, s, mine, where); break;
    case Op::MsgRate: runMsgRate(comm, e, o, s, mine, where); break;
    case Op::AllReduce: runAllReduce(comm, e, o, s, mine, where); break;
    case Op::SendRecv: runSendRecv(comm, e, o, s, mine, where); break;
    case Op::Moe: runMoe(comm, e, o, s, mine, where); break;
  }
}

// One thread per rank, each with its own Comm (and, on GPUs, its own device).
// Failures are collected; a verification failure is raised on every rank at
// the same point, so all threads end.
int run(const Options& o, const Setup& s, Report& rep) {
  gin::InProcessGroup group(s.ranks);
  std::vector<std::string> errors(size_t(s.ranks)), where(size_t(s.ranks));
  std::vector<bool> verifyFailed(size_t(s.ranks), false);
  std::vector<std::thread> threads;
  for (int r = 0; r < s.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        gin::CommConfig cfg;
        cfg.device = s.gpu ? gin::DeviceKind::Gpu : gin::DeviceKind::Cpu;
        if (s.gpu) cfg.cudaDevice = r % s.gpus;
        setTransport(o, &cfg);
        sizeSignals(o, s.ranks, s.gpu, &cfg);
        gin::Comm comm(group.rank(r), cfg);
        comm.makeCurrent();
        std::unique_ptr<Engine> e = makeEngine(comm, s);
        where[size_t(r)] = e->where();
        comm.bootstrap().barrier();  // every rank's description is in place
        Report* mine = r == 0 ? &rep : nullptr;
        runOp(comm, *e, o, s, mine, where);
        e.reset();
      } catch (const Failure& f) {
        errors[size_t(r)] = f.what();
        verifyFailed[size_t(r)] = true;
      } catch (const std::exception& ex) {
        errors[size_t(r)] = ex.what();
      }
    });
  for (auto& t : threads) t.join();
  std::vector<std::string> shown;
  bool any = false, verify = false;
  for (int r = 0; r < s.ranks; ++r) {
    if (errors[size_t(r)].empty()) continue;
    any = true;
    verify = verify || verifyFailed[size_t(r)];
    if (std::find(shown.begin(), shown.end(), errors[size_t(r)]) != shown.end()) continue;
    shown.push_back(errors[size_t(r)]);
    std::fprintf(stderr, "gin-bench: rank %d: %s\n", r, errors[size_t(r)].c_str());
  }
  if (verify) std::fprintf(stderr, "gin-bench: FAILED: what was to be timed gave wrong results; no numbers reported\n");
  return any ? 1 : 0;
}

// One rank in this process, the others in theirs: started by a launcher
// (torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, Slurm, Open MPI). The
// same ops run; rank 0 prints. Collectives keep the ranks in step, and a
// failure on one rank is reported by it (the others stop at the next
// collective, within the bootstrap's timeout).
int runProcess(const Options& o, Setup s, Report& rep) {
  std::unique_ptr<gin::TcpBootstrap> bs = gin::TcpBootstrap::fromEnvironment();
  s.ranks = bs->nRanks();
  const bool needsTwo = o.op == Op::PutBw || o.op == Op::SignalLat;
  if (needsTwo && s.ranks < 2) {
    std::fprintf(stderr, "gin-bench: %s needs at least 2 ranks; WORLD_SIZE is %d\n", o.opName.c_str(), s.ranks);
    return 2;
  }
  gin::CommConfig cfg;
  cfg.device = s.gpu ? gin::DeviceKind::Gpu : gin::DeviceKind::Cpu;
  setTransport(o, &cfg);
  sizeSignals(o, s.ranks, s.gpu, &cfg);
  const int r = bs->rank();
  try {
    gin::Comm comm(*bs, cfg);  // GPU: LOCAL_RANK (modulo the visible GPUs)
    comm.makeCurrent();
    std::unique_ptr<Engine> e = makeEngine(comm, s);
    struct Where {
      char text[192];
    };
    std::vector<Where> all(size_t(s.ranks));
    std::snprintf(all[size_t(r)].text, sizeof all[size_t(r)].text, "%s, pid %d", e->where().c_str(), int(::getpid()));
    comm.bootstrap().allGather(all.data(), sizeof(Where));
    std::vector<std::string> where;
    for (auto& w : all) where.push_back(w.text);
    s.gpus = std::max(s.gpus, 1);
    Report* mine = r == 0 ? &rep : nullptr;
    runOp(comm, *e, o, s, mine, where);
    e.reset();
  } catch (const Failure& f) {
    std::fprintf(stderr, "gin-bench: rank %d: %s\ngin-bench: FAILED: what was to be timed gave wrong results\n", r,
                 f.what());
    return 1;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "gin-bench: rank %d: %s\n", r, ex.what());
    return 1;
  }
  if (r != 0) return 3;  // success, but only rank 0 prints
  rep.head.insert(rep.head.begin() + 1, fmt("  one process per rank (%s launch variables), %d processes",
                                            gin::detectLaunch().source.c_str(), s.ranks));
  return 0;
}

void print(const Report& rep) {
  for (auto& l : rep.head) std::printf("%s\n", l.c_str());
  std::printf("method:\n");
  for (auto& l : rep.method) std::printf("  %s\n", l.c_str());
  std::printf("\n");
  rep.table.print();
  std::printf("\n");
  for (auto& l : rep.notes) std::printf("%s\n", l.c_str());
  std::fflush(stdout);
}

}  // namespace bench

int main(int argc, char** argv) {
  const bench::Options o = bench::parseArgs(argc, argv);
  bool launched = false;
  try {
    launched = gin::detectLaunch().source != "single";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gin-bench: %s\n", e.what());
    return 2;
  }
  bench::Setup s;
  if (launched) {  // one rank here; each process takes its own GPU (LOCAL_RANK)
    s.gpus = o.emulate ? 0 : bench::visibleGpus();
    s.gpu = s.gpus > 0;
    if (!s.gpu && !o.emulate)
      s.whyEmulated = "no CUDA device is visible (or no nvcc build): running CPU ranks instead (same as --emulate)";
  } else {
    s = bench::decide(o);
  }
  bench::Report rep;
  int rc = 1;
  try {
    rc = launched ? bench::runProcess(o, s, rep) : bench::run(o, s, rep);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gin-bench: %s\n", e.what());
    return 1;
  }
  if (rc == 3) return 0;  // a rank other than 0 of a launched job
  if (rc != 0) return rc;
  bench::print(rep);
  if (!o.json.empty()) {
    std::string text;
    rep.json.write(text, 0);
    text += "\n";
    std::ofstream f(o.json);
    f << text;
    f.close();
    if (!f) {
      std::fprintf(stderr, "gin-bench: cannot write %s\n", o.json.c_str());
      return 1;
    }
    std::printf("results written to %s\n", o.json.c_str());
  }
  return 0;
}
