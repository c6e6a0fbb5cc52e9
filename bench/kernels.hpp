// bench/kernels.hpp — the bodies the timed ops run (GIN_HD: a GPU block and a
// CPU rank run the same code) and, under __CUDACC__, the kernels that wrap them.
#pragma once

#include "common.hpp"

namespace bench {

using gin::Window;

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

// The context of msg-rate producer thread t: every lane of a warp on its
// warp's context (how a kernel that owns its QPs posts: warp w on QP w % contexts).
GIN_HD inline int postContext(int t, int nContexts) { return (t / 32) % nContexts; }

// msg-rate over ibgda: one producer thread posts `count` SignalAdd WQEs
// (fetch-add; nothing to publish) to `peer` on context `ctx`, then flushes:
// it returns once the NIC completed them. batch > 0: through a PostBatch,
// opened by the warp's lanes together (one per warp), of that many slots or
// as many as the warp posts if fewer (batchSlots).
GIN_HD inline uint32_t batchSlots(int batch, int lanes, int count) {
  return uint32_t(std::min<int64_t>(batch, int64_t(lanes) * count));
}
GIN_HD inline bool postBurst(const gin::DevComm& dc, int ctx, int peer, int count, int batch) {
  gin::Net<gin::kBackendIbgda> net(dc, ctx);
  bool ok = true;
  if (batch > 0) {
#if GIN_DEVICE_CODE
    const int lanes = __popc(__activemask());
#else
    const int lanes = 1;
#endif
    gin::PostBatch<gin::kBackendIbgda> b(net, gin::teamWorld(dc), peer, batchSlots(batch, lanes, count));
    for (int i = 0; i < count; ++i) b.signal(gin::SignalAdd{kSigMsg, 1});
    ok = b.close();
  } else {
    for (int i = 0; i < count; ++i)
      net.signal(gin::teamWorld(dc), peer, gin::SignalAdd{kSigMsg, 1}, gin::CoopThread{}, gin::Scope::System);
  }
  return net.flush(gin::CoopThread{}) && ok;
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

// msg-rate's baseline: every thread stores `count` 64-byte records (a WQE's
// size) with plain stores into a ring of kStoreRingSlots, neighbouring lanes
// into neighbouring slots (as a warp's posts fill a send queue).
inline constexpr unsigned kStoreRingSlots = 1u << 14;
__global__ void storeWqesKernel(unsigned long long* ring, int count) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x, all = gridDim.x * blockDim.x;
  for (int i = 0; i < count; ++i) {
    unsigned long long* s = ring + ((unsigned(i) * all + t) & (kStoreRingSlots - 1)) * 8;
    GIN_UNROLL
    for (int k = 0; k < 8; ++k) s[k] = (unsigned long long)(t ^ unsigned(i)) + unsigned(k);
  }
}

// Every thread of the launch is a producer, on context (global warp index) % nContexts.
__global__ void postBurstKernel(gin::DevComm dc, int peer, int count, int batch, unsigned long long* failed) {
  const int t = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (!postBurst(dc, postContext(t, dc.nContexts), peer, count, batch)) atomicAdd(failed, 1ull);
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

}  // namespace bench
