// gin/ep/layer.hpp — gin::ep, a DeepEP-style expert-parallel layer on gin: each
// rank holds tokens (hidden size H, bf16) with top-k expert choices over E
// experts spread evenly across the ranks; dispatch sends each token once to
// every rank that hosts one of its experts, the experts run, and combine sends
// the expert outputs back, reduced with the routing weights.
//
// Normal mode (throughput): counts are exchanged first (putValue + SignalAdd);
// then every channel of every rank streams its tokens into a per-(source,
// channel) circular buffer of S slots at each destination, one sender lane
// per (channel, destination) (on a GPU a span of warps or one warp of the
// channel's CTA; each warp puts its own token). The buffer's tail (slots
// filled) is a gin signal at the destination, advanced after the puts of a
// step (SignalAdd after the payloads) or of Shape::batch tokens; its head
// (slots freed) is a gin signal at the source, advanced by the destination
// after it copied slots out. Both are reset at the start of a layer, read
// with readSignal (only when the slots last known free or filled run out)
// and advanced with SignalAdd, as in the NVSHMEM-to-GIN migration of DeepEP.
// Combine runs the experts and returns each token's partial sum to the
// source's combine buffer at (token, slot), stored straight there when the
// source is lsa-reachable, else put, with a SignalInc the source waits for.
//
// Low-latency mode (<= 128 tokens per rank): fixed-size per-expert buffers,
// [local expert][source rank][token], one put per (token, expert) pair and a
// count per (expert, source) sent with putValue + SignalAdd; combine returns
// each (token, k) expert output, and the source reduces with the weights.
// Both sides split an expert's tokens into shares (warps on a GPU).
//
// The bodies are GIN_HD: a CPU rank runs them as well as a GPU. Progress is
// made by non-blocking steps (try to send the next tokens, try to receive
// what has arrived), so one CPU thread can drive every lane of a rank without
// deadlock; a GPU warp or CTA loops over the same steps.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gin/device.hpp"
#include "gin/ep/shape.hpp"

namespace gin::ep {

// bf16 <-> float, round to nearest even (host and device).
GIN_HD inline float bf16ToFloat(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
GIN_HD inline uint16_t floatToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

// The stand-in expert: expert e scales its input by (1 + e/64). Exact enough
// in float that a host reference can check the result tightly.
GIN_HD inline float expertScale(int e) { return 1.0f + float(e) / 64.0f; }

// Everything a rank's bodies need (trivially copyable, passed to kernels).
struct Layer {
  gin::DevComm dc;
  Shape shape;
  Signals sig;
  gin::Window x;           // [T][tokenBytes] this rank's tokens (bf16)
  gin::Window meta;        // [T][maxDests][metaBytes] prepared metadata (normal)
  gin::Window ring;        // [R][C][S][slotBytes] incoming rings (normal); [2][L][R][T][llSlotStride] (LL)
  gin::Window counts;      // [R][C] uint64 tokens each source sends on each channel (normal); [2][L][R] (LL)
  gin::Window combine;     // [T][maxDests][H] float partials (normal); [T][K][H] float (LL)
  gin::Window partial;     // [maxRecv][H] float: this rank's expert outputs, the source of combine puts
  const int32_t* topkIdx;  // [T][K]
  const float* topkW;      // [T][K]
  // What each sender puts, prepared by plan() (DeepEP's layout step).
  // Normal mode: lane (c, d)'s tokens in order, entry k at
  // [(c * R + d) * laneCap() + k] = t | j << 24 (j: the combine slot), and
  // sendCount[c * R + d] of them. Low latency: expert e's (token, k) pairs in
  // token order, entry p at [e * T + p] = t | k << 24, sendCount[e] of them.
  const uint32_t* sendList;
  const uint64_t* sendCount;
  // Non-null: this call's bf16 tokens [T][H], read from here (the caller's
  // memory) and stored straight into the peers' rings instead of put from
  // the x window, which then holds nothing. Only where every peer is
  // lsa-reachable (a GPU driver sets it when every transport is lsa).
  const char* xDirect;
  // FP8 calls with xDirect: the tokens' scales [T][H / 128], read from here
  // (xDirect then holds their e4m3 bytes [T][H]). Null otherwise.
  const float* xScalesDirect;
  // FP8 receives (a GPU driver's normal dispatch): each row's e4m3 bytes go
  // to recvX [n][H] and its scales to [n][H / 128] here, instead of whole
  // rows (rowBytes) to recvX. Null: whole rows.
  float* recvScales;
  // Low-latency mode without resets (GpuBuffer): device words {dispatches,
  // combines} this rank has finished, then the combine rows they summed. A
  // dispatch's round r (its count of earlier dispatches, the same on every
  // rank) picks half r % 2 of the ring and counts, and its count signals
  // end at (r + 1) x llSenders. Null: round 0, signals reset before each call.
  const unsigned long long* llRounds;
  // Normal mode without resets (GpuBuffer): where each ring stands, device
  // words [C][R] for this rank's sender lanes (positions put so far), then
  // [R][C] for its (source, channel) receivers (positions received). A
  // call's lanes and receivers start there and leave their end there, so
  // the head and tail signals only grow and need no reset between calls.
  // Null: every ring starts at 0 (signals reset before each call).
  uint64_t* ringPos;
};

// This call's low-latency round (see Layer::llRounds).
GIN_HD inline uint64_t llRound(const Layer& l) { return l.llRounds ? uint64_t(l.llRounds[0]) : 0; }
// Where each low-latency count signal ends once round `round`'s counts all
// arrived: every one of the llSenders senders adds 1 per round.
GIN_HD inline uint64_t llCountsDone(const Layer& l, uint64_t round) {
  return (round + 1) * uint64_t(l.shape.llSenders);
}

// A row as it travels (Shape::rowBytes: bf16 [H], or FP8's H e4m3 bytes
// then H / 128 float scales), kept in one place (scales null) or two.
struct RowAt {
  char* data;
  char* scales;
};
struct RowFrom {
  const char* data;
  const char* scales;
};
template <class Coop>
GIN_HD void copyRow(Coop coop, const Shape& sh, RowAt to, RowFrom from) {
  if (to.scales == nullptr && from.scales == nullptr) {
    gin::lsa::coopCopy(coop, to.data, from.data, sh.rowBytes());
    return;
  }
  const size_t H = size_t(sh.hidden);
  gin::lsa::coopCopy(coop, to.data, from.data, H);
  gin::lsa::coopCopy(coop, to.scales ? to.scales : to.data + H, from.scales ? from.scales : from.data + H,
                     H / kFp8Group * 4);
}
// Token t's row where this call reads it: the x window, or the caller's
// arrays (l.xDirect, and l.xScalesDirect for FP8).
GIN_HD inline RowFrom tokenRow(const Layer& l, size_t t) {
  const size_t H = size_t(l.shape.hidden);
  if (l.xDirect == nullptr)
    return {static_cast<const char*>(gin::localPointer(l.x, t * l.shape.tokenBytes())), nullptr};
  if (l.xScalesDirect != nullptr)
    return {l.xDirect + t * H, reinterpret_cast<const char*>(l.xScalesDirect + t * (H / kFp8Group))};
  return {l.xDirect + t * l.shape.rowBytes(), nullptr};
}
// Received row `pos` in recvX (and l.recvScales).
GIN_HD inline RowAt receivedRow(const Layer& l, void* recvX, size_t pos) {
  const size_t H = size_t(l.shape.hidden);
  char* x = static_cast<char*>(recvX);
  if (l.recvScales != nullptr) return {x + pos * H, reinterpret_cast<char*>(l.recvScales + pos * (H / kFp8Group))};
  return {x + pos * l.shape.rowBytes(), nullptr};
}

// Put token t's row (rowBytes) to `peer`'s window w at `offset`: from the x
// window, or stored straight from the caller's arrays (l.xDirect: every
// peer lsa-reachable).
template <class Coop>
GIN_HD void putToken(const Layer& l, gin::Net<>& net, int peer, gin::Window w, size_t offset, size_t t, Coop coop) {
  const size_t bytes = l.shape.rowBytes();
  if (l.xDirect != nullptr)
    copyRow(coop, l.shape, {static_cast<char*>(gin::peerPointer(l.dc, gin::teamWorld(l.dc), peer, w, offset)), nullptr},
            tokenRow(l, t));
  else
    net.put(gin::teamWorld(l.dc), peer, w, offset, l.x, t * l.shape.tokenBytes(), bytes, gin::None{}, gin::None{},
            coop);
}

// ---- normal mode ------------------------------------------------------------

// Does token t go to rank d? Its index among the token's destinations is its
// combine slot (destinations in increasing rank order; ranks <= 64). A
// choice of -1 (no expert) goes nowhere.
GIN_HD inline int destSlot(const Layer& l, int t, int d) {
  const int L = l.shape.localExperts();
  uint64_t m = 0;  // bit r: token t goes to rank r
  for (int k = 0; k < l.shape.topk; ++k)
    if (const int e = l.topkIdx[size_t(t) * l.shape.topk + k]; e >= 0) m |= 1ull << (e / L);
  if (((m >> d) & 1) == 0) return -1;
  uint64_t below = m & ((1ull << d) - 1);
  int j = 0;
  for (; below != 0; below &= below - 1) ++j;
  return j;
}

// The value thread 0 of `coop` holds, on every thread of the coop (a block,
// warps of a block or a warp on a GPU; one thread on a CPU rank). Keeps the
// copies of a sender's or receiver's state equal on every thread. A block
// uses it from one coop at a time (spans: one per span id).
template <class Coop>
GIN_HD uint64_t fromFirst(Coop coop, uint64_t v) {
#if GIN_DEVICE_CODE
  if constexpr (std::is_same_v<Coop, gin::CoopBlock>) {
    __shared__ uint64_t shared;
    coop.sync();  // every thread has read the previous value
    if (coop.rank() == 0) shared = v;
    coop.sync();
    v = shared;
  } else if constexpr (std::is_same_v<Coop, gin::CoopWarpSpan>) {
    __shared__ uint64_t shared[16];  // one per span id
    coop.sync();
    if (coop.rank() == 0) shared[coop.id] = v;
    coop.sync();
    v = shared[coop.id];
  } else if constexpr (std::is_same_v<Coop, gin::CoopWarp>) {
    v = __shfl_sync(~0u, v, 0);
  } else {
    static_assert(std::is_same_v<Coop, gin::CoopThread>,
                  "moe bodies run with CoopThread, CoopWarp, CoopWarpSpan or CoopBlock");
  }
#endif
  (void)coop;
  return v;
}

// A coop as a set of warps that each take their own item (a slot, a token):
// a block or a span splits into its warps, a warp or a CPU thread is one.
template <class Coop>
struct Split {
  static constexpr bool kWarps = std::is_same_v<Coop, gin::CoopWarpSpan> || std::is_same_v<Coop, gin::CoopBlock>;
  using Sub = std::conditional_t<kWarps, gin::CoopWarp, Coop>;
  GIN_HD static int count(Coop c) { return kWarps && c.size() >= 32 ? c.size() / 32 : 1; }
  GIN_HD static int index(Coop c) { return kWarps ? c.rank() / 32 : 0; }
  GIN_HD static Sub sub(Coop c) {
    if constexpr (kWarps)
      return Sub{};
    else
      return c;
  }
};

// The sender of one (channel, destination) lane: channel c's tokens are the
// range [c x laneCap, (c + 1) x laneCap) in order (as DeepEP's channels, so
// a receiver's list by (source, channel) is in (source, token) order); the
// lane puts those that go to rank d (its list in sendList) into d's ring for
// (this rank, c). State lives in the
// caller (a CPU rank interleaves every lane; a GPU runs a span of warps or
// one warp per lane); every thread of the coop holds an equal copy.
struct SendState {
  uint64_t origin = 0;       // the ring position of this call's first token (Layer::ringPos)
  uint64_t sent = 0;         // ring positions put so far (from origin)
  uint64_t freed = 0;        // d's head signal when last read: positions it freed
  uint64_t unsignalled = 0;  // tokens put that d's tail does not count yet
};

// Advance d's tail over the tokens already in its ring. Same context and
// peer as the puts, so the SignalAdd reaches d after the payloads; signal()
// syncs the coop first and its release covers every warp's puts.
template <class Coop>
GIN_HD void signalTail(const Layer& l, int c, int d, SendState& s, Coop coop) {
  if (s.unsignalled == 0) return;
  gin::Net<> net(l.dc, c % l.dc.nContexts);
  net.signal(gin::teamWorld(l.dc), d, gin::SignalAdd{l.sig.tail(l.dc.rank, c), s.unsignalled}, coop);
  s.unsignalled = 0;
}

// One step of lane (c, d): put the next tokens for d into the free slots of
// its ring, up to one per warp of the coop (DeepEP's warps per rank), then
// advance the tail once Shape::batch tokens wait for it (batch 1: after
// every step). Returns 1 if it put any, 0 if it must wait, -1 when the lane
// is done. The tail is advanced before returning 0 or -1, so d never waits
// for tokens already in its ring. The head is read only when the slots
// known to be free run out.
template <class Coop>
GIN_HD int sendStep(const Layer& l, int c, int d, SendState& s, Coop coop) {
  const Shape& sh = l.shape;
  const gin::Team world = gin::teamWorld(l.dc);
  gin::Net<> net(l.dc, c % l.dc.nContexts);
  const size_t lane = size_t(c) * size_t(sh.ranks) + size_t(d);
  const uint64_t total = s.origin + l.sendCount[lane];
  if (s.sent == total) {
    signalTail(l, c, d, s, coop);
    return -1;
  }
  if (s.sent - s.freed >= uint64_t(sh.slots)) {
    // One thread reads (acquires) the head, the coop takes its value.
    s.freed = fromFirst(coop, coop.rank() == 0 ? net.readSignal(l.sig.head(d, c)) : 0);
    if (s.sent - s.freed >= uint64_t(sh.slots)) {
      signalTail(l, c, d, s, coop);
      return 0;
    }
  }
  uint64_t m = uint64_t(sh.slots) - (s.sent - s.freed);
  if (m > total - s.sent) m = total - s.sent;
  if (m > uint64_t(Split<Coop>::count(coop))) m = uint64_t(Split<Coop>::count(coop));
  const uint64_t i = uint64_t(Split<Coop>::index(coop));
  if (i < m) {
    const uint64_t k = s.sent + i;
    const uint32_t e = l.sendList[lane * sh.laneCap() + size_t(k - s.origin)];
    const size_t t = e & 0xffffffu, j = e >> 24;
    const size_t slot = (size_t(l.dc.rank) * sh.channels + c) * sh.slots + size_t(k % uint64_t(sh.slots));
    const size_t at = slot * sh.slotBytes();
    const auto sub = Split<Coop>::sub(coop);
    net.put(world, d, l.ring, at, l.meta, (t * sh.maxDests() + j) * sh.metaBytes(), sh.metaBytes(), gin::None{},
            gin::None{}, sub);
    putToken(l, net, d, l.ring, at + sh.metaBytes(), t, sub);
  }
  s.sent += m;
  s.unsignalled += m;
  if (s.unsignalled >= uint64_t(sh.batch)) signalTail(l, c, d, s, coop);
  return 1;
}

// A (source, channel) receiver: copies filled slots out in order into the
// rank's receive list and frees them.
struct RecvState {
  uint64_t got = 0;      // ring positions received (from origin)
  uint64_t expect = 0;   // the position this call ends at (origin + the count exchange's count)
  uint64_t base = 0;     // first receive-list position of this (source, channel)
  uint64_t tail = 0;     // the source's tail signal when last read: positions filled
  uint64_t unfreed = 0;  // slots copied out that the source's head does not count yet
  uint64_t origin = 0;   // the ring position of this call's first token (Layer::ringPos)
  uint64_t keep = ~0ull;  // rows kept: later ones are taken out of the ring, not stored (a full receive list)
};

// Free the slots copied out so far. signal() syncs the coop first and
// releases: every thread's reads of them are done before the source may
// overwrite them.
template <class Coop>
GIN_HD void freeSlots(const Layer& l, int src, int c, RecvState& s, Coop coop) {
  if (s.unfreed == 0) return;
  gin::Net<> net(l.dc, c % l.dc.nContexts);
  net.signal(gin::teamWorld(l.dc), src, gin::SignalAdd{l.sig.head(l.dc.rank, c), s.unfreed}, coop);
  s.unfreed = 0;
}

// recvX: [maxRecv][rowBytes] (bf16: [maxRecv][H] values), recvMeta:
// [maxRecv][metaBytes], where this rank keeps what it received. One step
// copies out every slot the last read of the tail showed filled (reading
// the tail again only when those run out),
// then frees them once batch slots are waiting to be freed (batch 1: at
// once). Returns 1/0/-1 as sendStep; the slots copied out are freed before
// returning 0 or -1.
template <class Coop>
GIN_HD int recvStep(const Layer& l, int src, int c, RecvState& s, void* recvX, char* recvMeta, Coop coop) {
  const Shape& sh = l.shape;
  if (s.got == s.expect) {
    freeSlots(l, src, c, s, coop);
    return -1;
  }
  if (s.tail <= s.got) {
    // One thread's acquire of the tail, then the coop takes its value (with
    // a barrier): every thread sees the slots' bytes.
    gin::Net<> net(l.dc, c % l.dc.nContexts);
    s.tail = fromFirst(coop, coop.rank() == 0 ? net.readSignal(l.sig.tail(src, c)) : 0);
    if (s.tail <= s.got) {
      freeSlots(l, src, c, s, coop);
      return 0;
    }
  }
  const uint64_t n = (s.tail < s.expect ? s.tail : s.expect) - s.got;
  // Each warp of the coop copies its own slots out (one thread on a CPU rank).
  const auto sub = Split<Coop>::sub(coop);
  for (uint64_t i = uint64_t(Split<Coop>::index(coop)); i < n; i += uint64_t(Split<Coop>::count(coop))) {
    const uint64_t k = s.got + i;
    const size_t slot = (size_t(src) * sh.channels + c) * sh.slots + size_t(k % uint64_t(sh.slots));
    const char* p = static_cast<const char*>(gin::localPointer(l.ring, slot * sh.slotBytes()));
    if (k - s.origin >= s.keep) continue;
    const size_t pos = size_t(s.base + (k - s.origin));
    gin::lsa::coopCopy(sub, recvMeta + pos * sh.metaBytes(), p, sh.metaBytes());
    copyRow(sub, sh, receivedRow(l, recvX, pos), {p + sh.metaBytes(), nullptr});
  }
  s.got += n;
  s.unfreed += n;
  if (s.unfreed >= uint64_t(sh.batch) || s.got == s.expect) freeSlots(l, src, c, s, coop);
  return 1;
}

// Lane (c, me) of a driver that receives its own tokens in place: a step
// copies the lane's next tokens (one per warp of the coop) straight into
// this rank's receive list at base + k, where the (me, c) receiver would
// have copied them out of its ring; no ring, no signal. base: the list's
// first position for (me, c); keep: the lane's rows the list has room for
// (RecvState::keep; the others are skipped). `parts` coops of the same
// shape may share the lane, each with its own SendState: coop `part` takes
// the part-th group of every step's parts x (warps) tokens. Returns 1
// while tokens remain, -1 when the lane is done.
template <class Coop>
GIN_HD int selfStep(const Layer& l, int c, uint64_t base, SendState& s, void* recvX, char* recvMeta, Coop coop,
                    uint64_t keep = ~0ull, int part = 0, int parts = 1) {
  const Shape& sh = l.shape;
  const size_t lane = size_t(c) * size_t(sh.ranks) + size_t(l.dc.rank);
  const uint64_t total = l.sendCount[lane];
  if (s.sent == total) return -1;
  const uint64_t per = uint64_t(Split<Coop>::count(coop)), step = per * uint64_t(parts);
  const uint64_t m = total - s.sent < step ? total - s.sent : step;
  const uint64_t i = uint64_t(part) * per + uint64_t(Split<Coop>::index(coop));
  if (i < m && s.sent + i < keep) {
    const uint64_t k = s.sent + i;
    const uint32_t e = l.sendList[lane * sh.laneCap() + size_t(k)];
    const size_t t = e & 0xffffffu, j = e >> 24, pos = size_t(base + k);
    const auto sub = Split<Coop>::sub(coop);
    gin::lsa::coopCopy(sub, recvMeta + pos * sh.metaBytes(),
                       gin::localPointer(l.meta, (t * sh.maxDests() + j) * sh.metaBytes()), sh.metaBytes());
    copyRow(sub, sh, receivedRow(l, recvX, pos), tokenRow(l, t));
  }
  s.sent += m;
  return 1;
}

// out[i] = coef * x[i] for i < n (x bf16): 8 values per 16-byte load where
// both rows are 16-byte aligned, several loads in flight per thread.
template <class Coop>
GIN_HD void scaleRow(Coop coop, float* __restrict__ out, const uint16_t* __restrict__ x, size_t n, float coef) {
  size_t done = 0;
#if GIN_DEVICE_CODE
  if ((uintptr_t(x) | uintptr_t(out)) % 16 == 0) {
    constexpr int kUnroll = 4;
    const size_t n8 = n / 8, stride = size_t(coop.size());
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    float4* ov = reinterpret_cast<float4*>(out);
    auto lo = [](uint32_t u) { return __uint_as_float(u << 16); };
    auto hi = [](uint32_t u) { return __uint_as_float(u & 0xffff0000u); };
    for (size_t v0 = size_t(coop.rank()); v0 < n8; v0 += kUnroll * stride) {
      uint4 u[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k)
        if (v0 + k * stride < n8) u[k] = xv[v0 + k * stride];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k)
        if (v0 + k * stride < n8) {
          const size_t v = v0 + k * stride;
          ov[2 * v] = make_float4(coef * lo(u[k].x), coef * hi(u[k].x), coef * lo(u[k].y), coef * hi(u[k].y));
          ov[2 * v + 1] = make_float4(coef * lo(u[k].z), coef * hi(u[k].z), coef * lo(u[k].w), coef * hi(u[k].w));
        }
    }
    done = n8 * 8;
  }
#endif
  for (size_t i = done + size_t(coop.rank()); i < n; i += size_t(coop.size())) out[i] = coef * bf16ToFloat(x[i]);
}

// The experts of this rank on a received token: output = sum over the
// token's local experts of weight * expert(x). The stand-in experts are
// scalings, so the sum is one scaling of x by sum(weight * scale).
GIN_HD inline float expertCoef(const Layer& l, const TokenMeta& m) {
  const int firstExpert = l.dc.rank * l.shape.localExperts();
  float coef = 0;
  for (uint32_t k = 0; k < m.nLocal; ++k) coef += m.pick[k].weight * expertScale(firstExpert + m.pick[k].localExpert);
  return coef;
}

// The experts on received token `pos`, into partial[pos].
template <class Coop>
GIN_HD void expertStep(const Layer& l, size_t pos, const uint16_t* recvX, const char* recvMeta, float* partial,
                       Coop coop) {
  const Shape& sh = l.shape;
  const TokenMeta* m = reinterpret_cast<const TokenMeta*>(recvMeta + pos * sh.metaBytes());
  scaleRow(coop, partial + pos * size_t(sh.hidden), recvX + pos * size_t(sh.hidden), size_t(sh.hidden),
           expertCoef(l, *m));
}

// Where `peer`'s window w at `offset` can be stored to from here when this
// rank's puts to it take the lsa path (a peer on NVLink, no network
// transport forced); nullptr when puts go through the proxy or ibgda. The
// combine then writes expert outputs straight into the peer's buffer
// instead of staging them in `partial` and putting them.
GIN_HD inline void* directPointer(const Layer& l, int peer, gin::Window w, size_t offset) {
  if (l.dc.proxyAll != 0 || l.dc.ibgdaAll != 0) return nullptr;
  return gin::peerPointer(l.dc, gin::teamWorld(l.dc), peer, w, offset);
}

// Run this rank's experts on received token `pos` and return the result to
// its source at (token, slot), with a SignalInc there: straight into the
// source's combine buffer when it is lsa-reachable, else through `partial`
// and a put.
template <class Coop>
GIN_HD void expertAndReturn(const Layer& l, size_t pos, int src, const uint16_t* recvX, const char* recvMeta,
                            float* partial, Coop coop) {
  const Shape& sh = l.shape;
  const TokenMeta* m = reinterpret_cast<const TokenMeta*>(recvMeta + pos * sh.metaBytes());
  const size_t rowBytes = size_t(sh.hidden) * 4;
  const size_t at = (size_t(m->srcToken) * sh.maxDests() + m->combineSlot) * rowBytes;
  if (float* out = static_cast<float*>(directPointer(l, src, l.combine, at))) {
    scaleRow(coop, out, recvX + pos * size_t(sh.hidden), size_t(sh.hidden), expertCoef(l, *m));
    // signal() syncs the coop and releases: the row is written before the signal.
    gin::Net<>(l.dc, int(pos % size_t(l.dc.nContexts)))
        .signal(gin::teamWorld(l.dc), src, gin::SignalInc{l.sig.combine()}, coop);
    return;
  }
  expertStep(l, pos, recvX, recvMeta, partial, coop);
  combineSend(l, pos, src, recvMeta, coop);
}

// Send received token `pos`'s partial back to its source, (token, slot).
// The put syncs the coop first: expertStep's writes of the row are done.
template <class Coop>
GIN_HD void combineSend(const Layer& l, size_t pos, int src, const char* recvMeta, Coop coop) {
  const Shape& sh = l.shape;
  const TokenMeta* m = reinterpret_cast<const TokenMeta*>(recvMeta + pos * sh.metaBytes());
  gin::Net<> net(l.dc, int(pos % size_t(l.dc.nContexts)));
  const size_t rowBytes = size_t(sh.hidden) * 4;
  coop.sync();  // the row is written before any thread copies it
  net.put(gin::teamWorld(l.dc), src, l.combine, (size_t(m->srcToken) * sh.maxDests() + m->combineSlot) * rowBytes,
          l.partial, pos * rowBytes, rowBytes, gin::SignalInc{l.sig.combine()}, gin::None{}, coop);
}

// ---- FP8 rows (gin/ep/fp8.hpp) ------------------------------------------------

// A token's FP8 row as it travels, H e4m3 bytes then H / 128 float scales,
// made from its two parts (joinFp8Row) or split back into them (splitFp8Row).
template <class Coop>
GIN_HD void joinFp8Row(Coop coop, char* row, const uint8_t* data, const float* scales, size_t hidden) {
  gin::lsa::coopCopy(coop, row, data, hidden);
  gin::lsa::coopCopy(coop, row + hidden, scales, hidden / kFp8Group * 4);
}
template <class Coop>
GIN_HD void splitFp8Row(Coop coop, const char* row, uint8_t* data, float* scales, size_t hidden) {
  gin::lsa::coopCopy(coop, data, row, hidden);
  gin::lsa::coopCopy(coop, scales, row + hidden, hidden / kFp8Group * 4);
}

// ---- low-latency mode -------------------------------------------------------
//
// Token t's k-th choice e (on rank d = e / L) is packed at position p (the
// running count of this rank's tokens for e) of d's buffer [h][e % L][me][.]
// (h: the round's half): 16 bytes {t, k}, then the token. All of expert e's
// traffic uses context e % nContexts, so the count that follows (putValue
// into d's counts[h][e % L][me], then SignalAdd on llCount(e % L, me)) is
// ordered after the payloads.
//
// Why two halves are enough without a barrier: a sender's dispatch of round
// r + 2 starts after its round r + 1 receive, which waits for the counts of
// every rank's round r + 1 dispatch kernel, which each rank queues after it
// unpacked round r: nobody writes half r % 2 before its reader is done.
GIN_HD inline size_t llSlotBytes(const Shape& sh) { return 16 + sh.tokenBytes(); }
// Slots lie a bf16 slot apart whatever a call sends (an FP8 call fills a
// prefix of each), so that the two halves never move with Shape::fp8:
// round r in FP8 and r + 1 in bf16 (or the reverse) stay apart.
GIN_HD inline size_t llSlotStride(const Shape& sh) { return 16 + (size_t(sh.hidden) * 2 + 15) / 16 * 16; }
GIN_HD inline size_t llSlot(const Shape& sh, uint64_t round, int localExpert, int src, size_t p) {
  const size_t pair = size_t(round & 1) * size_t(sh.localExperts()) * sh.ranks + size_t(localExpert) * sh.ranks;
  return ((pair + size_t(src)) * sh.tokens + p) * llSlotStride(sh);
}
GIN_HD inline size_t llCountAt(const Shape& sh, uint64_t round, int localExpert, int src) {
  return ((size_t(round & 1) * size_t(sh.localExperts()) + size_t(localExpert)) * sh.ranks + size_t(src)) * 8;
}
// FP8 low-latency dispatch: where scale g of a local expert's packed row
// `row` goes in the returned scales, DeepEP's [L][H / 128][R x Tmax].
GIN_HD inline size_t llScaleAt(const Shape& sh, int localExpert, size_t g, size_t row) {
  return (size_t(localExpert) * (size_t(sh.hidden) / kFp8Group) + g) * size_t(sh.ranks) * size_t(sh.tokens) + row;
}

// This rank's dispatch for expert e, share `part` of `parts`: the (token, k)
// pairs that chose e, numbered p = 0, 1, ... in token order (sendList), go
// to d's slots [e % L][me][p]; this call puts those with p % parts == part (a
// GPU gives each warp of the expert's senders a share). `meta` holds, per
// (t, k), the 16-byte {t, k} record at [t][k] (prepared on the host).
// llDispatchCount follows once every share of a sender is done.
template <class Coop>
GIN_HD void llDispatchExpert(const Layer& l, int e, int part, int parts, Coop coop) {
  const Shape& sh = l.shape;
  const int L = sh.localExperts(), d = e / L;
  gin::Net<> net(l.dc, e % l.dc.nContexts);
  const gin::Team world = gin::teamWorld(l.dc);
  const uint64_t n = l.sendCount[e], round = llRound(l);
  for (uint64_t p = uint64_t(part); p < n; p += uint64_t(parts)) {
    const uint32_t tk = l.sendList[size_t(e) * size_t(sh.tokens) + size_t(p)];
    const size_t t = tk & 0xffffffu, k = tk >> 24;
    const size_t at = llSlot(sh, round, e % L, l.dc.rank, size_t(p));
    net.put(world, d, l.ring, at, l.meta, (t * size_t(sh.topk) + k) * 16, 16, gin::None{}, gin::None{}, coop);
    putToken(l, net, d, l.ring, at + 16, t, coop);
  }
}

// After a sender's shares of expert e's dispatch (on the same context, e %
// nContexts): the count (putValue into d's counts[e % L][me]; every sender
// writes the same value) with a SignalAdd of 1 on llCount(e % L, me), ordered
// after that sender's payloads. Each of the Shape::llSenders senders calls it
// once; on a GPU a sender is a CTA whose warps pass a block barrier first,
// and the signal's system-scope release covers their stores.
template <class Coop>
GIN_HD void llDispatchCount(const Layer& l, int e, Coop coop) {
  const Shape& sh = l.shape;
  const int L = sh.localExperts(), d = e / L;
  gin::Net<> net(l.dc, e % l.dc.nContexts);
  net.putValue(gin::teamWorld(l.dc), d, l.counts, llCountAt(sh, llRound(l), e % L, l.dc.rank), l.sendCount[e],
               gin::SignalAdd{l.sig.llCount(e % L, l.dc.rank), 1}, coop);
}

// Low-latency mode: wait until every (local expert, source) count arrived
// from all llSenders senders, i.e. every token dispatched to this rank is
// here (each count follows its sender's payloads on one context).
// llExpertAndCombine waits for the same signals itself; this lets a caller
// (gin-bench moe) end a timed dispatch phase at the moment the dispatch is
// complete, before any expert runs.
template <class Coop>
GIN_HD bool llWaitDispatch(const Layer& l, Coop coop) {
  const int L = l.shape.localExperts(), R = l.shape.ranks;
  gin::Net<> net(l.dc, 0);
  const uint64_t want = llCountsDone(l, llRound(l));
  bool ok = true;
  for (int i = coop.rank(); i < L * R && ok; i += coop.size())
    ok = net.waitSignal(gin::CoopThread{}, l.sig.llCount(i / R, i % R), want);
  return coop.syncAll(ok);
}

// The receiving side for (local expert el, source src), share `part` of
// `parts`, once its count signal arrived: run the expert on tokens p with
// p % parts == part and send each output back to the source's
// combine[t][k], with a SignalInc there.
template <class Coop>
GIN_HD bool llExpertAndCombine(const Layer& l, int el, int src, int part, int parts, Coop coop) {
  const Shape& sh = l.shape;
  gin::Net<> net(l.dc, (l.dc.rank * sh.localExperts() + el) % l.dc.nContexts);
  const uint64_t round = llRound(l);
  if (!net.waitSignal(coop, l.sig.llCount(el, src), llCountsDone(l, round))) return false;
  const uint64_t n =
      gin::volatileLoad(static_cast<const uint64_t*>(gin::localPointer(l.counts, llCountAt(sh, round, el, src))));
  const float scale = expertScale(l.dc.rank * sh.localExperts() + el);
  const size_t rowBytes = size_t(sh.hidden) * 4;
  for (size_t p = size_t(part); p < n; p += size_t(parts)) {
    const char* slot = static_cast<const char*>(gin::localPointer(l.ring, llSlot(sh, round, el, src, p)));
    const uint32_t t = gin::volatileLoad(reinterpret_cast<const uint32_t*>(slot));
    const uint32_t k = gin::volatileLoad(reinterpret_cast<const uint32_t*>(slot) + 1);
    const size_t row = (size_t(el) * sh.ranks + size_t(src)) * sh.tokens + p;
    const size_t at = (size_t(t) * sh.topk + k) * rowBytes;
    const uint16_t* x = reinterpret_cast<const uint16_t*>(slot + 16);
    if (float* out = static_cast<float*>(directPointer(l, src, l.combine, at))) {
      scaleRow(coop, out, x, size_t(sh.hidden), scale);  // straight into the source's buffer
      net.signal(gin::teamWorld(l.dc), src, gin::SignalInc{l.sig.combine()}, coop);
      continue;
    }
    scaleRow(coop, static_cast<float*>(gin::localPointer(l.partial, row * rowBytes)), x, size_t(sh.hidden), scale);
    coop.sync();
    net.put(gin::teamWorld(l.dc), src, l.combine, at, l.partial, row * rowBytes, rowBytes,
            gin::SignalInc{l.sig.combine()}, gin::None{}, coop);
  }
  return true;
}

}  // namespace gin::ep
