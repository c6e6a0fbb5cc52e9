// examples/moe/moe.hpp — a DeepEP-style expert-parallel layer on gin: each
// rank holds tokens (hidden size H, bf16) with top-k expert choices over E
// experts spread evenly across the ranks; dispatch sends each token once to
// every rank that hosts one of its experts, the experts run, and combine sends
// the expert outputs back, reduced with the routing weights.
//
// Normal mode (throughput): counts are exchanged first (putValue + SignalAdd);
// then every channel (a CTA on a GPU) of every rank streams its tokens into a
// per-(source, channel) circular buffer of S slots at each destination. The
// buffer's tail (slots filled) is a gin signal at the destination, advanced by
// the put that fills the slot (SignalAdd after the payload), or after every
// Shape::batch slots; its head (slots freed) is a gin signal at the source,
// advanced by the destination after it copied slots out. Both are reset at
// the start of a layer, read with readSignal and advanced with SignalAdd, as
// in the NVSHMEM-to-GIN migration of DeepEP. Combine puts each token's partial sum straight into the source's
// combine buffer at (token, slot), with a SignalInc the source waits for.
//
// Low-latency mode (<= 128 tokens per rank): fixed-size per-expert buffers,
// [local expert][source rank][token], one put per (token, expert) pair and a
// count per (expert, source) sent with putValue + SignalAdd; combine returns
// each (token, k) expert output, and the source reduces with the weights.
//
// The bodies are GIN_HD: a CPU rank runs them as well as a GPU. Progress is
// made by non-blocking steps (try to send one token, try to receive one), so
// one CPU thread can drive every channel of a rank without deadlock; a GPU
// CTA loops over the same steps.
#pragma once

#include <cstdint>
#include <cstring>

#include "gin/device.hpp"

namespace moe {

inline constexpr int kMaxTopk = 16;

struct Shape {
  int ranks = 1;
  int experts = 8;    // E, a multiple of ranks
  int tokens = 0;     // T per rank
  int hidden = 7168;  // H (bf16 elements)
  int topk = 8;       // K <= E
  int channels = 4;   // C
  int slots = 8;      // S per (source, channel) ring
  // Normal mode: ring slots per tail/head signal. 1: every token's put
  // carries its tail SignalAdd and every copy-out frees its slot at once.
  // B > 1: the sender advances a tail by up to B tokens at a time and the
  // receiver frees up to B slots at a time (DeepEP's chunked tail/head
  // updates); neither holds back a signal while it waits (see sendStep).
  int batch = 1;
  GIN_HD int localExperts() const { return experts / ranks; }
  // Destinations per token are at most min(K, ranks).
  GIN_HD int maxDests() const { return topk < ranks ? topk : ranks; }
  // One ring slot: metadata, then the token's H bf16 values, 16-byte aligned.
  GIN_HD size_t metaBytes() const { return (16 + 8 * size_t(topk) + 15) / 16 * 16; }
  GIN_HD size_t tokenBytes() const { return (size_t(hidden) * 2 + 15) / 16 * 16; }
  GIN_HD size_t slotBytes() const { return metaBytes() + tokenBytes(); }
};

// The metadata that travels with a token (normal mode): who sent it, where
// its combined result goes back to, and the experts of the destination rank
// it chose, with their weights.
struct TokenMeta {
  uint32_t srcToken;
  uint32_t combineSlot;  // j: the token's j-th destination rank
  uint32_t nLocal;       // entries used below
  uint32_t pad;
  struct {
    int32_t localExpert;
    float weight;
  } pick[kMaxTopk];  // [topk] of them travel (metaBytes())
};

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

// Signal ids of one layer, from `base`.
struct Signals {
  uint32_t base;
  int ranks, channels;
  GIN_HD uint32_t count() const { return base; }
  GIN_HD uint32_t combine() const { return base + 1; }
  GIN_HD uint32_t tail(int src, int c) const { return base + 2 + uint32_t(src * channels + c); }
  GIN_HD uint32_t head(int dst, int c) const { return base + 2 + uint32_t((ranks + dst) * channels + c); }
  GIN_HD uint32_t end() const { return base + 2 + uint32_t(2 * ranks * channels); }
  // Low-latency mode: one count signal per (local expert, source).
  GIN_HD uint32_t llCount(int localExpert, int src) const { return base + 2 + uint32_t(localExpert * ranks + src); }
};

// Everything a rank's bodies need (trivially copyable, passed to kernels).
struct Layer {
  gin::DevComm dc;
  Shape shape;
  Signals sig;
  gin::Window x;           // [T][tokenBytes] this rank's tokens (bf16)
  gin::Window meta;        // [T][maxDests][metaBytes] prepared metadata (normal)
  gin::Window ring;        // [R][C][S][slotBytes] incoming rings (normal); [L][R][T][tokenBytes] (LL)
  gin::Window counts;      // [R][C] uint64 tokens each source sends on each channel (normal); [L][R] (LL)
  gin::Window combine;     // [T][maxDests][H] float partials (normal); [T][K][H] float (LL)
  gin::Window partial;     // [maxRecv][H] float: this rank's expert outputs, the source of combine puts
  const int32_t* topkIdx;  // [T][K]
  const float* topkW;      // [T][K]
};

// ---- normal mode ------------------------------------------------------------

// Does token t go to rank d? Its index among the token's destinations is its
// combine slot (destinations in increasing rank order).
GIN_HD inline int destSlot(const Layer& l, int t, int d) {
  const int L = l.shape.localExperts();
  bool hit = false;
  int below = 0;
  for (int r = 0; r <= d; ++r) {
    bool any = false;
    for (int k = 0; k < l.shape.topk; ++k) any = any || l.topkIdx[size_t(t) * l.shape.topk + k] / L == r;
    if (r == d)
      hit = any;
    else
      below += any ? 1 : 0;
  }
  return hit ? below : -1;
}

// A channel's sender: its tokens are t = c, c + C, ... in order; each goes
// to its destinations in rank order. State lives in the caller (so a CPU
// rank can interleave channels); on a GPU every thread of the coop holds its
// own copy and all copies move in step.
struct SendState {
  int token = 0;             // next token of this channel (index into the channel's list)
  int dest = 0;              // next destination rank to consider for it
  uint64_t sent[64];         // per destination: tokens put so far on this channel
  uint64_t unsignalled[64];  // per destination: of those, tokens its tail does not count yet
  GIN_HD void reset() {
    token = dest = 0;
    for (int d = 0; d < 64; ++d) sent[d] = unsignalled[d] = 0;
  }
};

// Advance every destination's tail over the tokens already in its ring
// (batch > 1). Same context and peer as the puts, so each SignalAdd reaches
// the destination after those payloads.
template <class Coop>
GIN_HD void signalTails(const Layer& l, int c, SendState& s, Coop coop) {
  gin::Net<> net(l.dc, c % l.dc.nContexts);
  for (int d = 0; d < l.shape.ranks; ++d)
    if (s.unsignalled[d] != 0) {
      net.signal(gin::teamWorld(l.dc), d, gin::SignalAdd{l.sig.tail(l.dc.rank, c), s.unsignalled[d]}, coop);
      s.unsignalled[d] = 0;
    }
}

// One step: put the next (token, dest) pair if its ring slot is free.
// Returns 1 if it did something, 0 if it must wait, -1 when the channel is done.
// With batch > 1, the tails are advanced before returning 0 or -1, so a
// destination never waits for tokens that are already in its ring.
template <class Coop>
GIN_HD int sendStep(const Layer& l, int c, SendState& s, Coop coop) {
  const Shape& sh = l.shape;
  const gin::Team world = gin::teamWorld(l.dc);
  gin::Net<> net(l.dc, c % l.dc.nContexts);
  for (;;) {
    const int t = c + s.token * sh.channels;
    if (t >= sh.tokens) {
      signalTails(l, c, s, coop);
      return -1;
    }
    if (s.dest >= sh.ranks) {
      s.token += 1;
      s.dest = 0;
      continue;
    }
    const int d = s.dest;
    const int j = destSlot(l, t, d);
    if (j < 0) {
      s.dest += 1;
      continue;
    }
    // Flow control: fewer than S of our slots on d's ring are still unread.
    // One thread reads the head and the coop takes its verdict, so every
    // thread keeps the same state (each thread has its own copy of `s`).
    const bool room =
        coop.syncAll(coop.rank() != 0 || s.sent[d] - net.readSignal(l.sig.head(d, c)) < uint64_t(sh.slots));
    if (!room) {
      signalTails(l, c, s, coop);
      return 0;
    }
    const size_t slot = (size_t(l.dc.rank) * sh.channels + c) * sh.slots + size_t(s.sent[d] % uint64_t(sh.slots));
    const size_t at = slot * sh.slotBytes();
    // Metadata, then the payload with the tail signal: the signal is ordered
    // after both (same context, same peer).
    net.put(world, d, l.ring, at, l.meta, (size_t(t) * sh.maxDests() + size_t(j)) * sh.metaBytes(), sh.metaBytes(),
            gin::None{}, gin::None{}, coop);
    if (sh.batch <= 1) {
      net.put(world, d, l.ring, at + sh.metaBytes(), l.x, size_t(t) * sh.tokenBytes(), sh.tokenBytes(),
              gin::SignalAdd{l.sig.tail(l.dc.rank, c), 1}, gin::None{}, coop);
    } else {
      net.put(world, d, l.ring, at + sh.metaBytes(), l.x, size_t(t) * sh.tokenBytes(), sh.tokenBytes(), gin::None{},
              gin::None{}, coop);
      if (++s.unsignalled[d] >= uint64_t(sh.batch)) {
        net.signal(world, d, gin::SignalAdd{l.sig.tail(l.dc.rank, c), s.unsignalled[d]}, coop);
        s.unsignalled[d] = 0;
      }
    }
    s.sent[d] += 1;
    s.dest += 1;
    return 1;
  }
}

// A (source, channel) receiver: copies filled slots out in order into the
// rank's receive list and frees them.
struct RecvState {
  uint64_t got = 0;
  uint64_t expect = 0;    // from the count exchange
  uint64_t base = 0;      // first receive-list position of this (source, channel)
  uint64_t unfreed = 0;   // slots copied out that the source's head does not count yet (batch > 1)
};

// Free the slots copied out so far (batch > 1). signal() syncs the coop
// first and releases: every thread's reads of them are done before the
// source may overwrite them.
template <class Coop>
GIN_HD void freeSlots(const Layer& l, int src, int c, RecvState& s, Coop coop) {
  if (s.unfreed == 0) return;
  gin::Net<> net(l.dc, c % l.dc.nContexts);
  net.signal(gin::teamWorld(l.dc), src, gin::SignalAdd{l.sig.head(l.dc.rank, c), s.unfreed}, coop);
  s.unfreed = 0;
}

// recvX: [maxRecv][H] bf16, recvMeta: [maxRecv][metaBytes], where this rank
// keeps what it received. Returns 1/0/-1 as sendStep; with batch > 1 the
// slots copied out are freed before returning 0 or -1.
template <class Coop>
GIN_HD int recvStep(const Layer& l, int src, int c, RecvState& s, uint16_t* recvX, char* recvMeta, Coop coop) {
  const Shape& sh = l.shape;
  if (s.got == s.expect) {
    freeSlots(l, src, c, s, coop);
    return -1;
  }
  gin::Net<> net(l.dc, c % l.dc.nContexts);
  // One thread's acquire of the tail, then the coop's barrier: every thread
  // sees the slot's bytes.
  if (!coop.syncAll(coop.rank() != 0 || net.readSignal(l.sig.tail(src, c)) > s.got)) {
    freeSlots(l, src, c, s, coop);
    return 0;
  }
  const size_t slot = (size_t(src) * sh.channels + c) * sh.slots + size_t(s.got % uint64_t(sh.slots));
  const char* p = static_cast<const char*>(gin::localPointer(l.ring, slot * sh.slotBytes()));
  const size_t pos = size_t(s.base + s.got);
  for (size_t i = size_t(coop.rank()); i < sh.metaBytes(); i += size_t(coop.size()))
    recvMeta[pos * sh.metaBytes() + i] = p[i];
  const uint16_t* tok = reinterpret_cast<const uint16_t*>(p + sh.metaBytes());
  for (size_t i = size_t(coop.rank()); i < size_t(sh.hidden); i += size_t(coop.size()))
    recvX[pos * size_t(sh.hidden) + i] = tok[i];
  s.got += 1;
  if (sh.batch <= 1) {
    coop.sync();  // every thread's reads of the slot are done before it is freed
    // Release: our reads of the slot happen before the source may overwrite it.
    net.signal(gin::teamWorld(l.dc), src, gin::SignalAdd{l.sig.head(l.dc.rank, c), 1}, coop);
  } else if (++s.unfreed >= uint64_t(sh.batch)) {
    freeSlots(l, src, c, s, coop);
  }
  return 1;
}

// The experts of this rank on received token `pos`: partial = sum over the
// token's local experts of weight * expert(x).
template <class Coop>
GIN_HD void expertStep(const Layer& l, size_t pos, const uint16_t* recvX, const char* recvMeta, float* partial,
                       Coop coop) {
  const Shape& sh = l.shape;
  const TokenMeta* m = reinterpret_cast<const TokenMeta*>(recvMeta + pos * sh.metaBytes());
  const int firstExpert = l.dc.rank * sh.localExperts();
  for (size_t i = size_t(coop.rank()); i < size_t(sh.hidden); i += size_t(coop.size())) {
    const float x = bf16ToFloat(recvX[pos * size_t(sh.hidden) + i]);
    float acc = 0;
    for (uint32_t k = 0; k < m->nLocal; ++k)
      acc += m->pick[k].weight * (x * expertScale(firstExpert + m->pick[k].localExpert));
    partial[pos * size_t(sh.hidden) + i] = acc;
  }
}

// Send received token `pos`'s partial back to its source, (token, slot).
template <class Coop>
GIN_HD void combineSend(const Layer& l, size_t pos, int src, const char* recvMeta, Coop coop) {
  const Shape& sh = l.shape;
  const TokenMeta* m = reinterpret_cast<const TokenMeta*>(recvMeta + pos * sh.metaBytes());
  gin::Net<> net(l.dc, int(pos % size_t(l.dc.nContexts)));
  const size_t rowBytes = size_t(sh.hidden) * 4;
  net.put(gin::teamWorld(l.dc), src, l.combine, (size_t(m->srcToken) * sh.maxDests() + m->combineSlot) * rowBytes,
          l.partial, pos * rowBytes, rowBytes, gin::SignalInc{l.sig.combine()}, gin::None{}, coop);
}

// ---- low-latency mode -------------------------------------------------------
//
// Token t's k-th choice e (on rank d = e / L) is packed at position p (the
// running count of this rank's tokens for e) of d's buffer [e % L][me][.]:
// 16 bytes {t, k}, then the token. All of expert e's traffic uses context
// e % nContexts, so the count that follows (putValue into d's counts[e % L][me],
// then SignalAdd on llCount(e % L, me)) is ordered after the payloads.
GIN_HD inline size_t llSlotBytes(const Shape& sh) { return 16 + sh.tokenBytes(); }
GIN_HD inline size_t llSlot(const Shape& sh, int localExpert, int src, size_t p) {
  return ((size_t(localExpert) * sh.ranks + size_t(src)) * sh.tokens + p) * llSlotBytes(sh);
}

// This rank's dispatch for expert e: `meta` holds, per (t, k), the 16-byte
// {t, k} record at [t][k] (prepared on the host).
template <class Coop>
GIN_HD void llDispatchExpert(const Layer& l, int e, Coop coop) {
  const Shape& sh = l.shape;
  const int L = sh.localExperts(), d = e / L;
  gin::Net<> net(l.dc, e % l.dc.nContexts);
  const gin::Team world = gin::teamWorld(l.dc);
  size_t p = 0;
  for (int t = 0; t < sh.tokens; ++t)
    for (int k = 0; k < sh.topk; ++k) {
      if (l.topkIdx[size_t(t) * sh.topk + k] != e) continue;
      const size_t at = llSlot(sh, e % L, l.dc.rank, p++);
      net.put(world, d, l.ring, at, l.meta, (size_t(t) * sh.topk + size_t(k)) * 16, 16, gin::None{}, gin::None{}, coop);
      net.put(world, d, l.ring, at + 16, l.x, size_t(t) * sh.tokenBytes(), sh.tokenBytes(), gin::None{}, gin::None{},
              coop);
    }
  const size_t countAt = (size_t(e % L) * sh.ranks + size_t(l.dc.rank)) * 8;
  net.putValue(world, d, l.counts, countAt, uint64_t(p), gin::SignalAdd{l.sig.llCount(e % L, l.dc.rank), 1}, coop);
}

// Low-latency mode: wait until every (local expert, source) count arrived,
// i.e. every token dispatched to this rank is here (each count follows its
// payloads on one context). llExpertAndCombine waits for the same signals
// itself; this lets a caller (gin-bench moe) end a timed dispatch phase at
// the moment the dispatch is complete, before any expert runs.
template <class Coop>
GIN_HD bool llWaitDispatch(const Layer& l, Coop coop) {
  const int L = l.shape.localExperts(), R = l.shape.ranks;
  gin::Net<> net(l.dc, 0);
  bool ok = true;
  for (int i = coop.rank(); i < L * R && ok; i += coop.size())
    ok = net.waitSignal(gin::CoopThread{}, l.sig.llCount(i / R, i % R), 1);
  return coop.syncAll(ok);
}

// The receiving side for (local expert el, source src), once its count
// signal arrived: run the expert on each token and send the output back to
// the source's combine[t][k], with a SignalInc there.
template <class Coop>
GIN_HD bool llExpertAndCombine(const Layer& l, int el, int src, Coop coop) {
  const Shape& sh = l.shape;
  gin::Net<> net(l.dc, (l.dc.rank * sh.localExperts() + el) % l.dc.nContexts);
  if (!net.waitSignal(coop, l.sig.llCount(el, src), 1)) return false;
  const uint64_t n = gin::volatileLoad(
      static_cast<const uint64_t*>(gin::localPointer(l.counts, (size_t(el) * sh.ranks + size_t(src)) * 8)));
  const float scale = expertScale(l.dc.rank * sh.localExperts() + el);
  const size_t rowBytes = size_t(sh.hidden) * 4;
  for (size_t p = 0; p < n; ++p) {
    const char* slot = static_cast<const char*>(gin::localPointer(l.ring, llSlot(sh, el, src, p)));
    const uint32_t t = gin::volatileLoad(reinterpret_cast<const uint32_t*>(slot));
    const uint32_t k = gin::volatileLoad(reinterpret_cast<const uint32_t*>(slot) + 1);
    const uint16_t* x = reinterpret_cast<const uint16_t*>(slot + 16);
    const size_t row = (size_t(el) * sh.ranks + size_t(src)) * sh.tokens + p;
    float* out = static_cast<float*>(gin::localPointer(l.partial, row * rowBytes));
    for (size_t i = size_t(coop.rank()); i < size_t(sh.hidden); i += size_t(coop.size()))
      out[i] = scale * bf16ToFloat(x[i]);
    coop.sync();
    net.put(gin::teamWorld(l.dc), src, l.combine, (size_t(t) * sh.topk + k) * rowBytes, l.partial, row * rowBytes,
            rowBytes, gin::SignalInc{l.sig.combine()}, gin::None{}, coop);
  }
  return true;
}

}  // namespace moe
