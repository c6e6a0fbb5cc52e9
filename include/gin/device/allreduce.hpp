// gin/device/allreduce.hpp — AllReduce as device code: a ring (ReduceScatter
// then AllGather, every byte a gin put with a signal, so every transport Net
// reaches), and on lsa-only communicators a one-shot LL16 path for small
// messages and a two-shot direct path (load/store) for mid-size ones. Runs on
// GPUs and CPU ranks. Design: docs/design/allreduce.md.
//
//   gin::coll::RingWorkspace ws = gin::coll::createRingWorkspace(comm);          // host, once (gin/host/allreduce.hpp)
//   gin::coll::RingPlan plan = gin::coll::planRingAllReduce(comm, ws, count, sizeof(float));  // host, per size
//   // kernel, one CTA per block of the plan (plan.nBlocks x plan.blockSize):
//   gin::coll::ringAllReduceBlock<float, gin::coll::Sum, true>(gin::CoopBlock{}, devComm, ws, plan,
//                                                              sendWin, sendOff, recvWin, recvOff, blockIdx.x);
//
// Contract:
//  - Every rank calls with the same plan, count and offsets; recvWin +
//    recvOffset names the same place on every rank; sendWin may equal recvWin
//    at the same offset (in place). Inputs and outputs are registered windows.
//  - Calls follow each other with no reset: counts live in signal shadows and
//    the workspace. LL16, one-shot and direct calls must be separate kernels
//    in stream order (or be separated by a grid-wide sync): no two calls on
//    one workspace may run at once (other streams, graph branches, PDL).
//  - Every rank gets the same bits (contributions reduced in rank order).
//  - Waits are bounded: allReduceSend (waiting for a free slot) or
//    allReduceRecv (waiting for data, or for a direct-path flag) with the
//    neighbour's or late rank in the error record; every thread of the coop
//    then gets false.
#pragma once

#include <cstring>
#include <type_traits>

#include "gin/device/ll.hpp"
#include "gin/device/net.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace gin::coll {

// ---- element types ----

// 16-bit floating point with no CUDA headers needed: the bits of an IEEE
// binary16 / bfloat16 (layout-compatible with __half / __nv_bfloat16).
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

namespace detail {
GIN_HD GIN_INLINE uint32_t floatBits(float f) {
#if GIN_DEVICE_CODE
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
GIN_HD GIN_INLINE float bitsFloat(uint32_t u) {
#if GIN_DEVICE_CODE
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
}  // namespace detail

GIN_HD GIN_INLINE float toFloat(Half h) {
#if GIN_DEVICE_CODE
  return __half2float(__ushort_as_half(h.bits));
#else
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16, exp = (h.bits >> 10) & 0x1fu, mant = h.bits & 0x3ffu;
  if (exp == 0) {
    const float v = float(mant) * 5.9604644775390625e-8f;  // mant x 2^-24 (subnormal or zero)
    return sign ? -v : v;
  }
  if (exp == 31) return detail::bitsFloat(sign | 0x7f800000u | (mant << 13));
  return detail::bitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
#endif
}
// Round to nearest even (overflow to infinity), as __float2half_rn.
GIN_HD GIN_INLINE Half toHalf(float f) {
#if GIN_DEVICE_CODE
  return Half{__half_as_ushort(__float2half_rn(f))};
#else
  uint32_t x = detail::floatBits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x47800000u)  // >= 65536 (or inf, nan)
    return Half{uint16_t(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u))};
  if (x < 0x38800000u) {  // below the smallest normal half: the FPU rounds into the subnormal
    const float t = detail::bitsFloat(x) + 0.5f;
    return Half{uint16_t(sign | (detail::floatBits(t) - 0x3f000000u))};
  }
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000fffu + odd;  // rebias exponent (-112 << 23) and round to nearest even
  return Half{uint16_t(sign | (x >> 13))};
#endif
}
GIN_HD GIN_INLINE float toFloat(BFloat16 b) { return detail::bitsFloat(uint32_t(b.bits) << 16); }
GIN_HD GIN_INLINE BFloat16 toBFloat16(float f) {
#if GIN_DEVICE_CODE
  return BFloat16{__bfloat16_as_ushort(__float2bfloat16_rn(f))};
#else
  const uint32_t x = detail::floatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return BFloat16{uint16_t((x >> 16) | 0x40u)};  // quiet nan
  return BFloat16{uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
#endif
}

// How an element is reduced: in `Compute` (float for the 16-bit types), one
// rounding back to T per step.
template <class T>
struct EltTraits {
  using Compute = T;
  GIN_HD static GIN_INLINE Compute load(T v) { return v; }
  GIN_HD static GIN_INLINE T store(Compute c) { return c; }
};
template <>
struct EltTraits<Half> {
  using Compute = float;
  GIN_HD static GIN_INLINE float load(Half v) { return toFloat(v); }
  GIN_HD static GIN_INLINE Half store(float c) { return toHalf(c); }
};
template <>
struct EltTraits<BFloat16> {
  using Compute = float;
  GIN_HD static GIN_INLINE float load(BFloat16 v) { return toFloat(v); }
  GIN_HD static GIN_INLINE BFloat16 store(float c) { return toBFloat16(c); }
};

// ---- reduction operators (on EltTraits<T>::Compute) ----
struct Sum {
  template <class C>
  GIN_HD GIN_INLINE C operator()(C a, C b) const {
    return a + b;
  }
};
struct Prod {
  template <class C>
  GIN_HD GIN_INLINE C operator()(C a, C b) const {
    return a * b;
  }
};
struct Min {
  template <class C>
  GIN_HD GIN_INLINE C operator()(C a, C b) const {
    return b < a ? b : a;
  }
};
struct Max {
  template <class C>
  GIN_HD GIN_INLINE C operator()(C a, C b) const {
    return a < b ? b : a;
  }
};

// ---- what the host hands the kernel ----

// Temporary slots and signal ids of one communicator (gin/host/allreduce.hpp
// creates it). Trivially copyable: pass it to kernels by value.
struct RingWorkspace {
  Window tmp;           // per rank: tmpBytes of receive slots, split evenly among a call's blocks
  uint64_t tmpBytes;    // per rank
  uint32_t signalBase;  // ids [signalBase, signalBase + 4 * maxBlocks) belong to the AllReduce
  uint32_t maxBlocks;   // blocks a plan may use
  int32_t nRanks;
  uint32_t llBlocks;      // blocks of every LL call, 1 .. kLlMaxBlocks (0 reads as 1)
  Window ll;              // per rank (nRanks > 1): LL and direct call counts (a word per block each), the direct
                          // path's flags (kLlMaxBlocks x nRanks words), then 2 x nRanks LL16 slots (llSlotOffset)
  uint64_t llMaxBytes;    // the largest message the LL path carries (0: no LL slots)
  Window shot;            // per rank (nRanks > 1, shotMaxBytes > 0): the one-shot path's slots (shotOffset)
  uint64_t shotMaxBytes;  // the largest message the one-shot path carries (0: none); a multiple of 16 x kLlMaxBlocks
};
// The LL buffer's first kLlHeaderBytes hold one LL call count per block, then
// one direct call count per block (kDirectCallsOffset), then the direct
// flags (directFlagOffset).
inline constexpr uint32_t kLlMaxBlocks = 32;
inline constexpr uint64_t kLlHeaderBytes = 8ull * kLlMaxBlocks;
inline constexpr uint64_t kDirectCallsOffset = kLlHeaderBytes;
// The direct path keeps a pointer per rank in registers: lsa teams up to 8.
inline constexpr int kDirectMaxRanks = 8;
// Threads per block of the GPU kernel, at most: its launch bounds, so the
// compiler may give each thread 128 registers (with 1024 the kernel spilled;
// 16 blocks of 1024 threads were no faster than 512 on 2 H200s).
inline constexpr uint32_t kRingMaxThreads = 512;
static_assert(std::is_trivially_copyable_v<RingWorkspace>);

// The LL buffer: bytes of one slot (a message of llMaxBytes as LL16 packets),
// and where half `parity`'s slot for source rank `src` starts.
GIN_HD GIN_INLINE uint64_t llSlotBytes(const RingWorkspace& w) { return ll::bufferBytes<ll::Packet16>(w.llMaxBytes); }
// The direct path's flag word of block b written by rank src.
GIN_HD GIN_INLINE uint64_t directFlagOffset(const RingWorkspace& w, uint32_t b, int src) {
  return kDirectCallsOffset + 8ull * kLlMaxBlocks + 8ull * (uint64_t(b) * uint64_t(w.nRanks) + uint64_t(src));
}
GIN_HD GIN_INLINE uint64_t llSlotOffset(const RingWorkspace& w, uint64_t parity, int src) {
  return directFlagOffset(w, kLlMaxBlocks, 0) + (parity * uint64_t(w.nRanks) + uint64_t(src)) * llSlotBytes(w);
}
GIN_HD GIN_INLINE uint64_t llBufferBytes(const RingWorkspace& w) { return llSlotOffset(w, 2, 0); }
// Blocks of an LL call on workspace w.
GIN_HD GIN_INLINE uint32_t llBlocks(const RingWorkspace& w) { return w.llBlocks ? w.llBlocks : 1u; }
// The one-shot window: per call parity, source rank and block, a fixed slot
// of shotMaxBytes / kLlMaxBlocks bytes that only that block of every rank
// touches (block b's share of a call must fit it).
GIN_HD GIN_INLINE uint64_t shotSlotBytes(const RingWorkspace& w) { return w.shotMaxBytes / kLlMaxBlocks; }
GIN_HD GIN_INLINE uint64_t shotOffset(const RingWorkspace& w, uint64_t parity, int src, uint32_t b) {
  return ((parity * uint64_t(w.nRanks) + uint64_t(src)) * kLlMaxBlocks + b) * shotSlotBytes(w);
}
GIN_HD GIN_INLINE uint64_t shotBufferBytes(const RingWorkspace& w) { return shotOffset(w, 2, 0, 0); }

// One call's shape (gin/host/allreduce.hpp: planRingAllReduce). Every rank
// must use the same plan.
struct RingPlan {
  uint64_t count;        // elements
  uint64_t chunkBytes;   // one shard of a unit: a multiple of eltBytes, and of 16 when >= 16
  uint64_t numChunks;    // chunks per partition (depth x nRanks unless overridden)
  uint64_t regionBytes;  // temporary bytes per block (>= slots x chunkBytes)
  uint64_t nUnits;       // units of nRanks chunks
  uint32_t eltBytes;
  int32_t nRanks;
  uint32_t depth;      // pipeline depth (units per partition)
  uint32_t nBlocks;    // CTAs (CPU ranks: blocks run one after another)
  uint32_t blockSize;  // threads per CTA
  uint32_t slots;      // temporary slots per block
  uint32_t bidir;      // 1: bidirectional AllGather
  uint32_t ll;         // 1: one-shot LL16 (small messages, lsa peers only; llBlocks blocks)
  uint32_t direct;     // 1: two-shot over load/store (lsa peers only, nBlocks <= kLlMaxBlocks)
  uint32_t shot;       // 1: one-shot over stores into the peers' shot slots (lsa peers only, nBlocks <= kLlMaxBlocks)
};
static_assert(std::is_trivially_copyable_v<RingPlan>);

// The plan's paths, as bits: ringAllReduceBlock's `Paths` names the ones a
// caller compiles in (the host launcher gives each path a kernel of its own,
// so each is compiled and register-allocated alone). A plan whose path is not
// in Paths is refused (badArgument) like any plan that does not fit.
inline constexpr unsigned kPathRing = 1u, kPathLl = 2u, kPathDirect = 4u, kPathShot = 8u;
inline constexpr unsigned kPathAll = kPathRing | kPathLl | kPathDirect | kPathShot;
GIN_HD GIN_INLINE unsigned planPath(const RingPlan& p) {
  return p.ll ? kPathLl : p.direct ? kPathDirect : p.shot ? kPathShot : kPathRing;
}

// Signal ids of block b.
GIN_HD GIN_INLINE uint32_t rsDataSignal(const RingWorkspace& w, uint32_t b) { return w.signalBase + 4u * b; }
GIN_HD GIN_INLINE uint32_t rsCreditSignal(const RingWorkspace& w, uint32_t b) { return w.signalBase + 4u * b + 1u; }
GIN_HD GIN_INLINE uint32_t agFwdSignal(const RingWorkspace& w, uint32_t b) { return w.signalBase + 4u * b + 2u; }
GIN_HD GIN_INLINE uint32_t agRevSignal(const RingWorkspace& w, uint32_t b) { return w.signalBase + 4u * b + 3u; }

// AllGather hops forward and backward for n ranks.
GIN_HD GIN_INLINE int agForwardHops(int n, bool bidir) { return bidir ? n / 2 : n - 1; }  // ceil((n-1)/2) = n/2
GIN_HD GIN_INLINE int agReverseHops(int n, bool bidir) { return bidir ? (n - 1) / 2 : 0; }

// Elements [begin, begin + n) of shard s of unit u.
struct Piece {
  size_t begin, n;
};
GIN_HD GIN_INLINE Piece shardPiece(const RingPlan& p, uint64_t u, int s) {
  const size_t chunkElts = size_t(p.chunkBytes / p.eltBytes), unitElts = chunkElts * size_t(p.nRanks);
  const size_t base = size_t(u) * unitElts;
  const size_t len = p.count - base < unitElts ? size_t(p.count - base) : unitElts;
  size_t pe = chunkElts;
  if (len < unitElts) {  // the last unit: nRanks pieces rounded up to 16 bytes
    const size_t align = p.eltBytes < 16 ? 16 / p.eltBytes : 1;
    pe = (len + size_t(p.nRanks) - 1) / size_t(p.nRanks);
    pe = (pe + align - 1) / align * align;
  }
  const size_t b = size_t(s) * pe < len ? size_t(s) * pe : len;
  const size_t e = b + pe < len ? b + pe : len;
  return Piece{base + b, e - b};
}

// Elements per block of a one-shot call (the last block's share may be
// shorter): whole 16-byte vectors where the element is smaller.
GIN_HD GIN_INLINE uint64_t shotPiece(const RingPlan& p, uint64_t eltBytes) {
  const uint64_t kV = eltBytes < 16 ? 16 / eltBytes : 1, nb = p.nBlocks ? p.nBlocks : 1;
  return ((p.count + nb - 1) / nb + kV - 1) / kV * kV;
}

// ---- the reduction ----

namespace detail {
// dst0[i] (and dst1[i], dst2[i] where not null) = op(a[i], b[i]) for i < n,
// split over the coop. 16-byte vectors on a GPU when every address is 16-byte
// aligned; no sync.
template <class T, class Op, class Coop>
GIN_HD GIN_INLINE void reduce(Coop coop, T* dst0, T* dst1, T* dst2, const T* a, const T* b, size_t n, Op op) {
  using E = EltTraits<T>;
  size_t i0 = 0;
#if GIN_DEVICE_CODE
  constexpr size_t kV = sizeof(T) < 16 ? 16 / sizeof(T) : 1;
  const uintptr_t bits = uintptr_t(dst0) | uintptr_t(dst1) | uintptr_t(dst2) | uintptr_t(a) | uintptr_t(b);
  if (sizeof(T) <= 16 && (bits & 15) == 0) {
    const size_t nv = n / kV, stride = size_t(coop.size());
    const uint4* va = reinterpret_cast<const uint4*>(a);
    const uint4* vb = reinterpret_cast<const uint4*>(b);
    auto one = [&](uint4 x, uint4 y) {
      const T* tx = reinterpret_cast<const T*>(&x);
      const T* ty = reinterpret_cast<const T*>(&y);
      uint4 z;
      T* tz = reinterpret_cast<T*>(&z);
      GIN_UNROLL
      for (size_t k = 0; k < kV; ++k) tz[k] = E::store(op(E::load(tx[k]), E::load(ty[k])));
      return z;
    };
    constexpr int kUnroll = 2;
    size_t i = size_t(coop.rank());
    for (; i + (kUnroll - 1) * stride < nv; i += kUnroll * stride) {
      uint4 x[kUnroll], y[kUnroll];
      GIN_UNROLL
      for (int u = 0; u < kUnroll; ++u) x[u] = va[i + u * stride], y[u] = vb[i + u * stride];
      GIN_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        const uint4 z = one(x[u], y[u]);
        reinterpret_cast<uint4*>(dst0)[i + u * stride] = z;
        if (dst1) reinterpret_cast<uint4*>(dst1)[i + u * stride] = z;
        if (dst2) reinterpret_cast<uint4*>(dst2)[i + u * stride] = z;
      }
    }
    for (; i < nv; i += stride) {
      const uint4 z = one(va[i], vb[i]);
      reinterpret_cast<uint4*>(dst0)[i] = z;
      if (dst1) reinterpret_cast<uint4*>(dst1)[i] = z;
      if (dst2) reinterpret_cast<uint4*>(dst2)[i] = z;
    }
    i0 = nv * kV;
  }
#endif
  for (size_t i = i0 + size_t(coop.rank()); i < n; i += size_t(coop.size())) {
    const T z = E::store(op(E::load(a[i]), E::load(b[i])));
    dst0[i] = z;
    if (dst1) dst1[i] = z;
    if (dst2) dst2[i] = z;
  }
}
}  // namespace detail

// ---- one block's share of the collective ----

template <unsigned Backends = kBackendAll>
class RingBlock {
 public:
  GIN_HD RingBlock(const DevComm& dc, const RingWorkspace& ws, const RingPlan& plan, uint32_t block)
      : dc_(dc),
        net_(dc, dc.nContexts > 0 ? int(block % uint32_t(dc.nContexts)) : 0),
        ws_(ws),
        p_(plan),
        block_(block) {}

  // Checks that every rank would agree on; false (recorded) when the plan
  // does not fit this communicator or workspace.
  // Two slots at least: the lsa path reduces into next's slot while it holds
  // its own, and with one slot per block the ring would wait on itself.
  // `paths`: the paths this caller compiled in (kPathAll for every one).
  GIN_HD bool valid(size_t eltBytes, Window sendWin, size_t sendOffset, Window recvWin, size_t recvOffset,
                    unsigned paths = kPathAll) const {
    const uint64_t bytes = p_.count * p_.eltBytes;
    bool ok = p_.nRanks == dc_.nRanks && ws_.nRanks == dc_.nRanks && p_.eltBytes == eltBytes && p_.nBlocks >= 1 &&
              block_ < p_.nBlocks && fits(sendWin, sendOffset, bytes) && fits(recvWin, recvOffset, bytes) &&
              (planPath(p_) & paths) != 0;
    // LL16 and direct: load/store to every peer (all in the lsa team, no
    // network forced), flags in the LL window. Checked in run()'s order.
    const bool lsaPath =
        fits(ws_.ll, 0, llBufferBytes(ws_)) && dc_.lsaSize == dc_.nRanks && dc_.proxyAll == 0 && dc_.ibgdaAll == 0;
    if (p_.ll)
      ok = ok && lsaPath && p_.nBlocks == llBlocks(ws_) && llBlocks(ws_) <= kLlMaxBlocks && bytes <= ws_.llMaxBytes;
    else if (p_.direct)
      ok = ok && lsaPath && p_.nBlocks <= kLlMaxBlocks && dc_.nRanks <= kDirectMaxRanks;
    else if (p_.shot)
      ok = ok && lsaPath && p_.nBlocks <= kLlMaxBlocks && dc_.nRanks <= kDirectMaxRanks && ws_.shotMaxBytes > 0 &&
           fits(ws_.shot, 0, shotBufferBytes(ws_)) && shotPiece(p_, eltBytes) * eltBytes <= shotSlotBytes(ws_);
    else
      ok = ok && p_.nBlocks <= ws_.maxBlocks && p_.slots >= 2 && fits(ws_.tmp, 0, ws_.tmpBytes) &&
           p_.chunkBytes >= eltBytes && p_.chunkBytes % eltBytes == 0 &&
           uint64_t(p_.slots) * p_.chunkBytes <= p_.regionBytes && p_.regionBytes * p_.nBlocks <= ws_.tmpBytes &&
           uint64_t(ws_.signalBase) + 4ull * ws_.maxBlocks <= uint64_t(dc_.nSignals);
    if (!ok)
      recordError(dc_, gin::Op::BadArgument, -1, net_.context(), uint64_t(block_), uint64_t(p_.nBlocks),
                  uint64_t(ws_.maxBlocks));
    return ok;
  }

  template <class T, class Op, bool kBidir, unsigned Paths = kPathAll, class Coop>
  GIN_HD bool run(Coop coop, Window sendWin, size_t sendOffset, Window recvWin, size_t recvOffset, Op op) {
    if (!valid(sizeof(T), sendWin, sendOffset, recvWin, recvOffset, Paths)) return coop.syncAll(false);
    const T* in = static_cast<const T*>(localPointer(sendWin, sendOffset));
    T* out = static_cast<T*>(localPointer(recvWin, recvOffset));
    if (dc_.nRanks == 1) {  // nothing to reduce: a copy when out of place
      if (in != out && block_ == 0) lsa::coopCopy(coop, out, in, size_t(p_.count) * sizeof(T));
      return coop.syncAll(true);
    }
    if constexpr ((Paths & kPathLl) != 0)
      if (p_.ll) return runLL(coop, in, out, op);
    if constexpr ((Paths & kPathDirect) != 0)
      if (p_.direct) return runDirect<T>(coop, sendWin, sendOffset, recvWin, recvOffset, op);
    if constexpr ((Paths & kPathShot) != 0)
      if (p_.shot) return runShot<T>(coop, in, out, op);
    if constexpr ((Paths & kPathRing) != 0)
      return runRing<T, Op, kBidir>(coop, sendWin, sendOffset, recvWin, recvOffset, in, out, op);
    else
      return coop.syncAll(false);  // not reached: valid() refused a path outside Paths
  }

 private:
  // The ring: ReduceScatter then AllGather, every step a put (or lsa stores)
  // with a signal to a neighbour.
  template <class T, class Op, bool kBidir, class Coop>
  GIN_HD bool runRing(Coop coop, Window sendWin, size_t sendOffset, Window recvWin, size_t recvOffset, const T* in,
                      T* out, Op op) {
    const int n = dc_.nRanks, me = dc_.rank;
    next_ = (me + 1) % n;
    prev_ = (me + n - 1) % n;
    const bool bidir = kBidir && p_.bidir != 0;
    const int nF = agForwardHops(n, bidir), nR = agReverseHops(n, bidir);
    open();
    // The slot layout (chunk size, regions) may differ from the last call's:
    // start once next has consumed everything any of our blocks sent it, so no
    // slot we write can still hold an earlier message. Thread i checks block
    // i: a shadow is either the last call's count or, when that block already
    // finished this call, this call's (then the wait is longer, never wrong).
    bool ok = true;
    for (uint32_t b = uint32_t(coop.rank()); b < ws_.maxBlocks; b += uint32_t(coop.size())) {
      const uint64_t sent = b == block_ ? sent_ : volatileLoad(net_.getSignalShadowPtr(rsCreditSignal(ws_, b)));
      uint64_t seen = sent - 1;
      ok = waitAtLeast(rsCreditSignal(ws_, b), sent, &seen, gin::Op::AllReduceSend, next_) && ok;
      if (b == block_) creditSeen_ = seen;
    }
    ok = coop.syncAll(ok);
    sent0_ = sent_;
    recv0_ = recvd_;
    const size_t regionOff = size_t(block_) * size_t(p_.regionBytes);
    T* tmpLocal = static_cast<T*>(localPointer(ws_.tmp, regionOff));
    // Peer pointers when the peer is reached by load/store (nullptr otherwise).
    T* nextTmp = static_cast<T*>(direct(next_, ws_.tmp, regionOff));
    T* nextOut = static_cast<T*>(direct(next_, recvWin, recvOffset));
    T* prevOut = static_cast<T*>(direct(prev_, recvWin, recvOffset));
    const Team world = teamWorld(dc_);

    for (uint64_t u = block_; ok && u < p_.nUnits; u += p_.nBlocks) {
      // ---- ReduceScatter ----
      {
        const Piece pc = shardPiece(p_, u, (me + n - 1) % n);
        ok = sendSlot(coop, sendWin, sendOffset + pc.begin * sizeof(T), pc.n * sizeof(T), world);
      }
      for (int j = 0; ok && j < n - 1; ++j) {
        const int s = ((me - 2 - j) % n + n) % n;
        const Piece pc = shardPiece(p_, u, s);
        const T* slot = tmpLocal + size_t((recvd_ - recv0_) % p_.slots) * size_t(p_.chunkBytes / sizeof(T));
        if (coop.rank() == 0)
          ok = waitAtLeast(rsDataSignal(ws_, block_), recvd_ + 1, &dataSeen_, gin::Op::AllReduceRecv, prev_);
        if (!coop.syncAll(ok)) break;
        ++recvd_;
        if (j < n - 2) {
          // Partial sum to next: straight into its slot over lsa, else staged in our output.
          if (nextTmp != nullptr) {
            if (!waitSlot(coop)) {
              ok = false;
              break;
            }
            T* dst = nextTmp + size_t((sent_ - sent0_) % p_.slots) * size_t(p_.chunkBytes / sizeof(T));
            detail::reduce(coop, dst, (T*)nullptr, (T*)nullptr, slot, in + pc.begin, pc.n, op);
            // One fence publishes the sum in next's slot and ends our reads of
            // ours; both signals then go relaxed.
            releaseAll(coop);
            net_.signal(world, next_, SignalAdd{rsDataSignal(ws_, block_), 1}, coop, Scope::System);
            ++sent_;
            credit(coop, world, Scope::System);
          } else {
            detail::reduce(coop, out + pc.begin, (T*)nullptr, (T*)nullptr, slot, in + pc.begin, pc.n, op);
            credit(coop, world, Scope::Thread);  // syncs and releases: the slot is read, the staged sum complete
            ok = sendSlot(coop, recvWin, recvOffset + pc.begin * sizeof(T), pc.n * sizeof(T), world);
          }
        } else {
          // Shard me is final: our output, and over lsa the AllGather neighbours' outputs too.
          T* d1 = nextOut != nullptr ? nextOut + pc.begin : nullptr;
          T* d2 = (nR > 0 && prevOut != nullptr) ? prevOut + pc.begin : nullptr;
          detail::reduce(coop, out + pc.begin, d1, d2, slot, in + pc.begin, pc.n, op);
          // Stored into a neighbour's output: one fence publishes those
          // stores and ends our reads of the slot; the signals go relaxed.
          const bool stored = d1 != nullptr || d2 != nullptr;
          if (stored) releaseAll(coop);
          credit(coop, world, stored ? Scope::System : Scope::Thread);
          agSend(coop, world, next_, agFwdSignal(ws_, block_), recvWin, recvOffset, pc, d1 != nullptr, Scope::System);
          if (nR > 0)
            agSend(coop, world, prev_, agRevSignal(ws_, block_), recvWin, recvOffset, pc, d2 != nullptr, Scope::System);
        }
      }
      // ---- AllGather: shard me - h arrives from prev, me + h from next ----
      const int hops = nF > nR ? nF : nR;
      for (int h = 1; ok && h <= hops; ++h) {
        if (h <= nF) {
          if (coop.rank() == 0)
            ok = waitAtLeast(agFwdSignal(ws_, block_), fwd_ + 1, &fwdSeen_, gin::Op::AllReduceRecv, prev_);
          if (!coop.syncAll(ok)) break;
          ++fwd_;
          if (h < nF)
            agSend(coop, world, next_, agFwdSignal(ws_, block_), recvWin, recvOffset,
                   shardPiece(p_, u, ((me - h) % n + n) % n), false);
        }
        if (h <= nR) {
          if (coop.rank() == 0)
            ok = waitAtLeast(agRevSignal(ws_, block_), rev_ + 1, &revSeen_, gin::Op::AllReduceRecv, next_);
          if (!coop.syncAll(ok)) break;
          ++rev_;
          if (h < nR)
            agSend(coop, world, prev_, agRevSignal(ws_, block_), recvWin, recvOffset, shardPiece(p_, u, (me + h) % n),
                   false);
        }
      }
    }
    ok = net_.flush(coop) && ok;
    close(coop);
    return coop.syncAll(ok);
  }

  // The one-shot LL16 path (docs/design/allreduce.md). A packet carries 8
  // bytes, a whole number of elements. This block's packets are [first,
  // last); thread t handles first + t, first + t + size, ... in both phases,
  // so in place it reads its input before overwriting it.
  template <class T, class Op, class Coop>
  GIN_HD bool runLL(Coop coop, const T* in, T* out, Op op) {
    using E = EltTraits<T>;
    using P = ll::Packet16;
    constexpr size_t kPer = 8 / sizeof(T);
    const int n = dc_.nRanks, me = dc_.rank;
    const size_t bytes = size_t(p_.count) * sizeof(T), packets = ll::packetCount<P>(bytes);
    const size_t nb = size_t(p_.nBlocks), first = packets * block_ / nb, last = packets * (block_ + 1) / nb;
    const size_t rangeBytes = first < last ? (last * 8 < bytes ? last * 8 : bytes) - first * 8 : 0;
    uint64_t* calls = static_cast<uint64_t*>(localPointer(ws_.ll, 8 * size_t(block_)));  // only this block touches it
    const uint64_t call = volatileLoad(calls) + 1, half = call & 1;
    const uint32_t flag = ll::flagForRound(call);
    const auto* inB = reinterpret_cast<const unsigned char*>(in);
    auto* outB = reinterpret_cast<unsigned char*>(out);
    bool ok = true;
    for (int k = 1; ok && k < n && rangeBytes > 0; ++k)
      ok = ll::putPacketsToPeer<P>(coop, dc_, teamWorld(dc_), (me + k) % n, ws_.ll,
                                   size_t(llSlotOffset(ws_, half, me)) + first * sizeof(P), inB + first * 8, rangeBytes,
                                   flag);
    const P* slot0 = static_cast<const P*>(localPointer(ws_.ll, size_t(llSlotOffset(ws_, half, 0))));
    const size_t slotPackets = size_t(llSlotBytes(ws_) / sizeof(P));
    for (size_t i = first + size_t(coop.rank()); ok && i < last; i += size_t(coop.size())) {
      const size_t off = i * 8, len = bytes - off < 8 ? bytes - off : 8, m = len / sizeof(T);
      typename E::Compute acc[kPer] = {};
      for (int j = 0; j < n; ++j) {
        uint64_t v = 0;
        if (j == me)
          v = ll::detail::loadBytes<uint64_t>(inB + off, len);
        else if (!ll::waitRead(dc_, slot0 + size_t(j) * slotPackets + i, flag, &v, i, j))
          ok = false;
        if (!ok) break;
        T e[kPer];
        __builtin_memcpy(e, &v, sizeof e);
        for (size_t t = 0; t < m; ++t) acc[t] = j == 0 ? E::load(e[t]) : op(acc[t], E::load(e[t]));
      }
      if (!ok) break;
      T r[kPer] = {};
      for (size_t t = 0; t < m; ++t) r[t] = E::store(acc[t]);
      uint64_t w = 0;
      __builtin_memcpy(&w, r, sizeof r);
      ll::detail::storeBytes(outB + off, w, len);
    }
    ok = coop.syncAll(ok);
    if (coop.rank() == 0) volatileStore(calls, call);
    coop.sync();
    return ok;
  }

  // The two-shot path (docs/design/allreduce.md). Shards and pieces are whole
  // 16-byte vectors where the message allows, so every block streams 16-byte
  // loads and stores when the windows are 16-byte aligned.
  template <class T, class Op, class Coop>
  GIN_HD bool runDirect(Coop coop, Window sendWin, size_t sendOffset, Window recvWin, size_t recvOffset, Op op) {
    const int n = dc_.nRanks, me = dc_.rank;
    const Team world = teamWorld(dc_);
    constexpr uint64_t kV = sizeof(T) < 16 ? 16 / sizeof(T) : 1;
    const uint64_t count = p_.count, nb = p_.nBlocks;
    const uint64_t shard = ((count + uint64_t(n) - 1) / uint64_t(n) + kV - 1) / kV * kV;
    const uint64_t piece = ((shard + nb - 1) / nb + kV - 1) / kV * kV;
    const uint64_t sEnd = shard * uint64_t(me + 1) < count ? shard * uint64_t(me + 1) : count;
    uint64_t begin = shard * uint64_t(me) + piece * block_, end = begin + piece < sEnd ? begin + piece : sEnd;
    if (begin > end) begin = end;
    // Every rank's input and output at this block's piece.
    const T* src[kDirectMaxRanks] = {};
    T* dst[kDirectMaxRanks] = {};
    GIN_UNROLL
    for (int j = 0; j < kDirectMaxRanks; ++j)
      if (j < n) {
        src[j] = static_cast<const T*>(peerPointer(dc_, world, j, sendWin, sendOffset)) + begin;
        dst[j] = static_cast<T*>(peerPointer(dc_, world, j, recvWin, recvOffset)) + begin;
      }

    uint64_t* calls = static_cast<uint64_t*>(localPointer(ws_.ll, size_t(kDirectCallsOffset + 8 * block_)));
    const uint64_t call = volatileLoad(calls) + 1;
    bool ok = directBarrier(coop, 2 * call - 1);
    if (ok) reduceInto<T>(coop, src, n, dst, n, end - begin, op);
    ok = ok && directBarrier(coop, 2 * call);
    ok = coop.syncAll(ok);
    if (coop.rank() == 0) volatileStore(calls, call);
    coop.sync();
    return ok;
  }
  // The one-shot path (docs/design/allreduce.md): block b stores its share
  // of the message into its slot at every peer (parity = this block's call
  // count), one barrier publishes the stores, then it sums the n shares in
  // rank order into its own output. No barrier out: nobody reads this rank's
  // input or output, and a peer overwrites our slot of this parity only two
  // calls on, after the next call's barrier, which this block reaches after
  // it is done reading it (the same block of the next call runs later).
  template <class T, class Op, class Coop>
  GIN_HD bool runShot(Coop coop, const T* in, T* out, Op op) {
    const int n = dc_.nRanks, me = dc_.rank;
    const Team world = teamWorld(dc_);
    const uint64_t piece = shotPiece(p_, sizeof(T)), count = p_.count;
    const uint64_t begin = piece * block_ < count ? piece * block_ : count;
    const uint64_t end = begin + piece < count ? begin + piece : count;
    uint64_t* calls = static_cast<uint64_t*>(localPointer(ws_.ll, size_t(kDirectCallsOffset + 8 * block_)));
    const uint64_t call = volatileLoad(calls) + 1, parity = call & 1;
    for (int k = 1; k < n; ++k) {
      const int peer = (me + k) % n;
      lsa::coopCopy(coop, peerPointer(dc_, world, peer, ws_.shot, size_t(shotOffset(ws_, parity, me, block_))),
                    in + begin, size_t(end - begin) * sizeof(T));
    }
    bool ok = directBarrier(coop, 2 * call);  // publishes the stores above; a direct call's exit value
#if defined(GIN_ALLREDUCE_TEST_READ_DELAY_NS) && GIN_DEVICE_CODE
    // Tests only: one rank per call reads late, so a peer that overwrote a
    // slot too early (no second parity, no barrier) would be caught.
    if (uint64_t(me) == call % uint64_t(n)) __nanosleep(GIN_ALLREDUCE_TEST_READ_DELAY_NS);
#endif
    if (ok) {
      const T* from[kDirectMaxRanks] = {};
      GIN_UNROLL
      for (int j = 0; j < kDirectMaxRanks; ++j)
        if (j < n)
          from[j] = j == me ? in + begin
                            : static_cast<const T*>(localPointer(ws_.shot, size_t(shotOffset(ws_, parity, j, block_))));
      T* dst[kDirectMaxRanks] = {out + begin};
      reduceInto<T>(coop, from, n, dst, 1, end - begin, op);
    }
    ok = coop.syncAll(ok);
    if (coop.rank() == 0) volatileStore(calls, call);
    coop.sync();
    return ok;
  }

  // dst[d][i] = from[0][i] op from[1][i] ... op from[n - 1][i] for d < nd and
  // i < len, split over the coop (no sync). On a GPU 16-byte vectors where
  // every address is 16-byte aligned, two per thread per round (2n loads in
  // flight before the first sum), loaded past the L1 (peers write them).
  template <class T, class Op, class Coop>
  GIN_HD static void reduceInto(Coop coop, const T* const* from, int n, T* const* dst, int nd, uint64_t len, Op op) {
    using E = EltTraits<T>;
    uint64_t i = 0;
#if GIN_DEVICE_CODE
    constexpr uint64_t kV = sizeof(T) < 16 ? 16 / sizeof(T) : 1;
    uintptr_t bits = 0;
    for (int j = 0; j < n; ++j) bits |= uintptr_t(from[j]);
    for (int d = 0; d < nd; ++d) bits |= uintptr_t(dst[d]);
    if (sizeof(T) <= 16 && (bits & 15) == 0) {
      const uint64_t nv = len / kV, stride = uint64_t(coop.size());
      auto sum = [&](const uint4* x) {
        typename E::Compute acc[kV];
        const T* t0 = reinterpret_cast<const T*>(&x[0]);
        GIN_UNROLL
        for (uint64_t k = 0; k < kV; ++k) acc[k] = E::load(t0[k]);
        GIN_UNROLL
        for (int j = 1; j < kDirectMaxRanks; ++j)
          if (j < n) {
            const T* tj = reinterpret_cast<const T*>(&x[j]);
            GIN_UNROLL
            for (uint64_t k = 0; k < kV; ++k) acc[k] = op(acc[k], E::load(tj[k]));
          }
        uint4 z;
        T* tz = reinterpret_cast<T*>(&z);
        GIN_UNROLL
        for (uint64_t k = 0; k < kV; ++k) tz[k] = E::store(acc[k]);
        return z;
      };
      auto storeAll = [&](uint64_t e, uint4 z) {
        GIN_UNROLL
        for (int d = 0; d < kDirectMaxRanks; ++d)
          if (d < nd) *reinterpret_cast<uint4*>(dst[d] + e) = z;
      };
      uint64_t v = uint64_t(coop.rank());
      for (; v + stride < nv; v += 2 * stride) {
        const uint64_t e0 = v * kV, e1 = e0 + stride * kV;
        uint4 x0[kDirectMaxRanks], x1[kDirectMaxRanks];
        GIN_UNROLL
        for (int j = 0; j < kDirectMaxRanks; ++j)
          if (j < n) x0[j] = directLoad(from[j] + e0), x1[j] = directLoad(from[j] + e1);
        storeAll(e0, sum(x0));
        storeAll(e1, sum(x1));
      }
      if (v < nv) {
        const uint64_t e0 = v * kV;
        uint4 x0[kDirectMaxRanks];
        GIN_UNROLL
        for (int j = 0; j < kDirectMaxRanks; ++j)
          if (j < n) x0[j] = directLoad(from[j] + e0);
        storeAll(e0, sum(x0));
      }
      i = nv * kV;
    }
#endif
    // The tail (or unaligned windows): element loads, ordered after the
    // barrier's acquire by the coop sync.
    for (i += uint64_t(coop.rank()); i < len; i += uint64_t(coop.size())) {
      typename E::Compute acc = E::load(from[0][i]);
      for (int j = 1; j < n; ++j) acc = op(acc, E::load(from[j][i]));
      const T z = E::store(acc);
      for (int d = 0; d < nd; ++d) dst[d][i] = z;
    }
  }

#if GIN_DEVICE_CODE
  // A 16-byte load that bypasses the (incoherent) L1: the data is a peer's.
  GIN_DEVICE GIN_INLINE static uint4 directLoad(const void* p) {
    uint4 v;
    asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
  }
#endif
  // Block block_ of every rank reaches `value`: after a coop sync, thread j
  // writes our flag word into rank j's window with a system-scope release
  // (publishing the coop's earlier loads and stores), waits for rank j's word
  // in ours with an acquire, and the coop agrees.
  template <class Coop>
  GIN_HD bool directBarrier(Coop coop, uint64_t value) {
    const int n = dc_.nRanks, me = dc_.rank;
    coop.sync();
    for (int j = coop.rank(); j < n; j += coop.size())
      if (j != me) {
        auto* f = static_cast<uint64_t*>(
            peerPointer(dc_, teamWorld(dc_), j, ws_.ll, size_t(directFlagOffset(ws_, block_, me))));
        atomicStore<Scope::System>(f, value, MemoryOrder::Release);
      }
    bool ok = true;
    for (int j = coop.rank(); j < n; j += coop.size())
      if (j != me) {
        const auto* f = static_cast<const uint64_t*>(localPointer(ws_.ll, size_t(directFlagOffset(ws_, block_, j))));
        ok = gin::detail::boundedWait(
                 dc_, f, MemoryOrder::Acquire, [&](uint64_t v) { return rollingLessEqual(value, v); },
                 gin::detail::WaitWhat{gin::Op::AllReduceRecv, j, net_.context(), block_, value}) &&
             ok;
      }
    return coop.syncAll(ok);
  }

  const DevComm& dc_;
  Net<Backends> net_;
  RingWorkspace ws_;
  RingPlan p_;
  uint32_t block_;
  int next_ = 0, prev_ = 0;
  // Running counts (kept across calls in the signal shadows) and, on rank 0
  // of the coop, the last signal values acquired.
  uint64_t sent_ = 0, recvd_ = 0, fwd_ = 0, rev_ = 0, sent0_ = 0, recv0_ = 0;
  uint64_t creditSeen_ = 0, dataSeen_ = 0, fwdSeen_ = 0, revSeen_ = 0;

  GIN_HD static bool fits(Window w, size_t offset, uint64_t bytes) {
    const uint64_t size = w.dev ? loadConst(&w.dev->bytes) : 0;
    return w.dev && offset <= size && bytes <= size - offset;
  }

  // Every thread reads the counts; close() stores them back (one thread).
  GIN_HD void open() {
    sent_ = volatileLoad(net_.getSignalShadowPtr(rsCreditSignal(ws_, block_)));
    recvd_ = volatileLoad(net_.getSignalShadowPtr(rsDataSignal(ws_, block_)));
    fwd_ = volatileLoad(net_.getSignalShadowPtr(agFwdSignal(ws_, block_)));
    rev_ = volatileLoad(net_.getSignalShadowPtr(agRevSignal(ws_, block_)));
    creditSeen_ = sent_ - 1;  // "nothing acquired yet": one below what the first wait asks
    dataSeen_ = recvd_;
    fwdSeen_ = fwd_;
    revSeen_ = rev_;
  }
  template <class Coop>
  GIN_HD void close(Coop coop) {
    coop.sync();
    if (coop.rank() == 0) {
      volatileStore(net_.getSignalShadowPtr(rsCreditSignal(ws_, block_)), sent_);
      volatileStore(net_.getSignalShadowPtr(rsDataSignal(ws_, block_)), recvd_);
      volatileStore(net_.getSignalShadowPtr(agFwdSignal(ws_, block_)), fwd_);
      volatileStore(net_.getSignalShadowPtr(agRevSignal(ws_, block_)), rev_);
    }
    coop.sync();
  }

  // The peer's copy of w + offset when it is reached by load/store with the
  // lsa transport (what Net::put would use), else nullptr.
  GIN_HD void* direct(int peer, Window w, size_t offset) const {
    if constexpr ((Backends & kBackendLsa) == 0) {
      (void)peer, (void)w, (void)offset;
      return nullptr;
    } else {
      if constexpr ((Backends & kBackendProxy) != 0)
        if (dc_.proxyAll != 0) return nullptr;
      if constexpr ((Backends & kBackendIbgda) != 0)
        if (dc_.ibgdaAll != 0) return nullptr;
      return peerPointer(dc_, teamWorld(dc_), peer, w, offset);
    }
  }

  // Rank 0 of the coop: wait until signal `id` reaches `least` (rolling),
  // polling relaxed and acquiring once it does; *seen skips later polls.
  GIN_HD bool waitAtLeast(uint32_t id, uint64_t least, uint64_t* seen, Op op, int peer) const {
    if (rollingLessEqual(least, *seen)) return true;
    const bool ok = gin::detail::boundedPoll(
        dc_, [&] { return net_.readSignal(id, 64, MemoryOrder::Relaxed); },
        [&](uint64_t v) { return rollingLessEqual(least, v); },
        gin::detail::WaitWhat{op, peer, net_.context(), id, least});
    if (ok) *seen = net_.readSignal(id, 64, MemoryOrder::Acquire);
    return ok;
  }

  // Wait for a free slot at next (message sent_).
  template <class Coop>
  GIN_HD bool waitSlot(Coop coop) {
    bool ok = true;
    if (coop.rank() == 0 && sent_ + 1 - sent0_ > p_.slots)
      ok = waitAtLeast(rsCreditSignal(ws_, block_), sent_ + 1 - p_.slots, &creditSeen_, gin::Op::AllReduceSend, next_);
    return coop.syncAll(ok);
  }

  // Put `bytes` from srcWin + srcOffset into next's next free slot (signal only when empty).
  template <class Coop>
  GIN_HD bool sendSlot(Coop coop, Window srcWin, size_t srcOffset, size_t bytes, Team world) {
    if (!waitSlot(coop)) return false;
    const size_t dst =
        size_t(block_) * size_t(p_.regionBytes) + size_t((sent_ - sent0_) % p_.slots) * size_t(p_.chunkBytes);
    if (bytes > 0)
      net_.put(world, next_, ws_.tmp, dst, srcWin, srcOffset, bytes, SignalAdd{rsDataSignal(ws_, block_), 1}, None{},
               coop);
    else
      net_.signal(world, next_, SignalAdd{rsDataSignal(ws_, block_), 1}, coop);
    ++sent_;
    return true;
  }

  // Every thread's earlier loads and stores ordered before what rank 0 does
  // next (Net's `alreadyReleased = Scope::System` promise).
  template <class Coop>
  GIN_HD void releaseAll(Coop coop) {
    coop.sync();
    if (coop.rank() == 0) fence<Scope::System>();
  }

  // Hand the slot just consumed back to prev (syncs the coop and releases first).
  template <class Coop>
  GIN_HD void credit(Coop coop, Team world, Scope alreadyReleased) {
    net_.signal(world, prev_, SignalAdd{rsCreditSignal(ws_, block_), 1}, coop, alreadyReleased);
  }

  // An AllGather chunk to `peer`'s output at the same place: already stored
  // there by the caller (`stored`: signal only, released as `alreadyReleased`
  // says), else a put from our output.
  template <class Coop>
  GIN_HD void agSend(Coop coop, Team world, int peer, uint32_t sig, Window recvWin, size_t recvOffset, Piece pc,
                     bool stored, Scope alreadyReleased = Scope::Thread) {
    const size_t off = recvOffset + pc.begin * p_.eltBytes, bytes = pc.n * p_.eltBytes;
    if (stored || bytes == 0)
      net_.signal(world, peer, SignalAdd{sig, 1}, coop, stored ? alreadyReleased : Scope::Thread);
    else
      net_.put(world, peer, recvWin, off, recvWin, off, bytes, SignalAdd{sig, 1}, None{}, coop);
  }
};

// One block's share of an AllReduce of plan.count elements of T from sendWin +
// sendOffset into recvWin + recvOffset (the header comment has the rules).
// Every block 0 .. plan.nBlocks - 1 of every rank must run, each by
// one coop (a CTA on a GPU; CPU ranks may run them one after another).
// kBidir = false compiles the reverse AllGather out (fewer registers); the
// plan's bidir flag then is ignored. Paths (kPath* bits) compiles in only
// the paths named; a plan taking another is refused. Returns false on every
// thread of the coop if a wait gave up or the plan does not fit (badArgument).
template <class T, class Op, bool kBidir = true, unsigned Backends = kBackendAll, unsigned Paths = kPathAll, class Coop>
GIN_HD bool ringAllReduceBlock(Coop coop, const DevComm& dc, const RingWorkspace& ws, const RingPlan& plan,
                               Window sendWin, size_t sendOffset, Window recvWin, size_t recvOffset, uint32_t block,
                               Op op = Op{}) {
  RingBlock<Backends> rb(dc, ws, plan, block);
  return rb.template run<T, Op, kBidir, Paths>(coop, sendWin, sendOffset, recvWin, recvOffset, op);
}

}  // namespace gin::coll
