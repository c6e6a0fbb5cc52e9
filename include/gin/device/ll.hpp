// gin/device/ll.hpp — LL8 / LL16 packets: flag-in-data for small messages
// (the LL protocol of NCCL, MSCCL++ putPackets/getPackets). A writer stores
// payload and a per-round flag together; the reader polls a packet until it
// holds the round's flag. LL8: {payload u32, flag u32}; LL16: two such halves
// stored with one 16-byte store (each half carries the flag, since no
// architecture promises a 16-byte store is seen whole). Why this layout:
// docs/design/p2p-ll.md.
//
// Contract:
//  - A read that returns true returned exactly the bytes written with that
//    flag, never a mix of rounds. Nothing else is ordered (LL packets publish
//    no other memory: use a put with a signal for that).
//  - Flags change every round (flagForRound(r)), are never 0, and differ from
//    what the buffer held before; the writer overwrites a packet only once its
//    reader has read it (alternate two buffers, or synchronize).
//  - Reads are bounded: past the timeout the error record gets {op llWait,
//    peer, id = packet index, expected = flag, observed = the flag seen}, the
//    abort flag rises, and the read returns false.
#pragma once

#include <cstring>

#include "gin/core/atomic.hpp"
#include "gin/core/coop.hpp"
#include "gin/device/comm.hpp"
#include "gin/device/window.hpp"

namespace gin::ll {

// Payload in bits 0..31, flag in bits 32..63.
struct alignas(8) Packet8 {
  uint64_t word;
};
// Each half: payload in bits 0..31, flag in bits 32..63 (the same flag twice).
struct alignas(16) Packet16 {
  uint64_t lo, hi;
};
static_assert(sizeof(Packet8) == 8 && sizeof(Packet16) == 16);

template <class P>
struct PacketTraits;
template <>
struct PacketTraits<Packet8> {
  using Payload = uint32_t;
  static constexpr size_t kPayloadBytes = 4;
};
template <>
struct PacketTraits<Packet16> {
  using Payload = uint64_t;  // half lo's payload in bits 0..31, hi's in 32..63
  static constexpr size_t kPayloadBytes = 8;
};
template <class P>
using PayloadOf = typename PacketTraits<P>::Payload;
template <class P>
inline constexpr size_t kPayloadBytes = PacketTraits<P>::kPayloadBytes;

// Packets needed for `bytes` of payload, and the buffer they fill.
template <class P>
GIN_HD constexpr size_t packetCount(size_t bytes) {
  return (bytes + kPayloadBytes<P> - 1) / kPayloadBytes<P>;
}
template <class P>
GIN_HD constexpr size_t bufferBytes(size_t bytes) {
  return packetCount<P>(bytes) * sizeof(P);
}

// A nonzero flag for round `round` (0, 1, 2, ...): round + 1, skipping 0 when
// the 32-bit flag wraps after 2^32 - 1 rounds.
GIN_HD constexpr uint32_t flagForRound(uint64_t round) { return uint32_t(round % 0xFFFFFFFFull) + 1u; }

// What one load of a packet saw: `valid` when every half carries the same flag.
template <class P>
struct Seen {
  PayloadOf<P> payload;
  uint32_t flag;
  bool valid;
};

namespace detail {
GIN_HD constexpr uint64_t half(uint32_t payload, uint32_t flag) { return uint64_t(payload) | (uint64_t(flag) << 32); }

// Bytes [0, n) of `s` (n <= sizeof(U)) as the low bytes of a U, zero padded.
// Little-endian packing on every target gin runs on (x86-64, aarch64, GPUs).
template <class U>
GIN_HD GIN_INLINE U loadBytes(const unsigned char* s, size_t n) {
  if (n == sizeof(U) && uintptr_t(s) % alignof(U) == 0) {
#if GIN_DEVICE_CODE
    return *reinterpret_cast<const U*>(s);
#else
    U v;
    std::memcpy(&v, s, sizeof(U));
    return v;
#endif
  }
  U v = 0;
  for (size_t k = 0; k < n; ++k) v |= U(s[k]) << (8 * k);
  return v;
}
template <class U>
GIN_HD GIN_INLINE void storeBytes(unsigned char* d, U v, size_t n) {
  if (n == sizeof(U) && uintptr_t(d) % alignof(U) == 0) {
#if GIN_DEVICE_CODE
    *reinterpret_cast<U*>(d) = v;
#else
    std::memcpy(d, &v, sizeof(U));
#endif
    return;
  }
  for (size_t k = 0; k < n; ++k) d[k] = static_cast<unsigned char>(v >> (8 * k));
}
}  // namespace detail

// ---- one packet ----

// Store payload+flag. LL8: one 8-byte store. LL16: one 16-byte vector store on
// a GPU (each 8-byte element single-copy atomic), two 8-byte atomic stores on
// the host. Relaxed at system scope: the packet orders nothing but itself.
GIN_HD GIN_INLINE void store(Packet8* p, uint32_t payload, uint32_t flag) {
  atomicStore<Scope::System>(&p->word, detail::half(payload, flag), MemoryOrder::Relaxed);
}
GIN_HD GIN_INLINE void store(Packet16* p, uint64_t payload, uint32_t flag) {
  const uint64_t lo = detail::half(uint32_t(payload), flag), hi = detail::half(uint32_t(payload >> 32), flag);
#if GIN_DEVICE_CODE
  asm volatile("st.relaxed.sys.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
#else
  // The halves may land in either order: each is validated on its own.
  atomicStore<Scope::System>(&p->lo, lo, MemoryOrder::Relaxed);
  atomicStore<Scope::System>(&p->hi, hi, MemoryOrder::Relaxed);
#endif
}

// One load of a packet (never blocks).
GIN_HD GIN_INLINE Seen<Packet8> load(const Packet8* p) {
  const uint64_t w = atomicLoad<Scope::System>(&p->word, MemoryOrder::Relaxed);
  return Seen<Packet8>{uint32_t(w), uint32_t(w >> 32), true};
}
GIN_HD GIN_INLINE Seen<Packet16> load(const Packet16* p) {
  uint64_t lo, hi;
#if GIN_DEVICE_CODE
  asm volatile("ld.relaxed.sys.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(p) : "memory");
#else
  lo = atomicLoad<Scope::System>(&p->lo, MemoryOrder::Relaxed);
  hi = atomicLoad<Scope::System>(&p->hi, MemoryOrder::Relaxed);
#endif
  const uint32_t flagLo = uint32_t(lo >> 32), flagHi = uint32_t(hi >> 32);
  return Seen<Packet16>{(lo & 0xFFFFFFFFull) | (hi << 32), flagLo, flagLo == flagHi};
}

// True (and *payload set) when the packet holds `flag` in every half.
template <class P>
GIN_HD GIN_INLINE bool tryRead(const P* p, uint32_t flag, PayloadOf<P>* payload) {
  const Seen<P> s = load(p);
  if (!s.valid || s.flag != flag) return false;
  *payload = s.payload;
  return true;
}

// Poll one packet until it holds `flag` (bounded; see the header comment for
// what a timeout records). `index` and `peer` only label the error record.
template <class P>
GIN_HD bool waitRead(const DevComm& c, const P* p, uint32_t flag, PayloadOf<P>* payload, uint64_t index = 0,
                     int peer = -1) {
  Seen<P> s{};
  if (!gin::detail::boundedPoll(
          c,
          [&] {
            s = load(p);
            return uint64_t(s.flag);
          },
          [&](uint64_t f) { return s.valid && f == flag; }, gin::detail::WaitWhat{Op::LlWait, peer, -1, index, flag}))
    return false;
  *payload = s.payload;
  return true;
}

// ---- many packets, split over a coop ----

// Write `bytes` from src (any alignment) as packetCount<P>(bytes) packets at
// dst with `flag`; the last packet is zero padded. Thread i of the coop writes
// packets i, i + size, ... No sync: the packets are independent.
template <class P, class Coop>
GIN_HD void putPackets(Coop coop, P* dst, const void* src, size_t bytes, uint32_t flag) {
  constexpr size_t kB = kPayloadBytes<P>;
  const unsigned char* s = static_cast<const unsigned char*>(src);
  const size_t n = packetCount<P>(bytes);
  for (size_t i = size_t(coop.rank()); i < n; i += size_t(coop.size())) {
    const size_t off = i * kB, len = bytes - off < kB ? bytes - off : kB;
    store(dst + i, detail::loadBytes<PayloadOf<P>>(s + off, len), flag);
  }
}

// Read `bytes` into dst (any alignment) from the packets at src, waiting for
// each to hold `flag`. Returns false on every thread of the coop if any wait
// gave up (then dst is partly written). Ends with a coop sync: dst is complete
// for every thread of the coop on return.
template <class P, class Coop>
GIN_HD bool getPackets(Coop coop, const DevComm& c, void* dst, const P* src, size_t bytes, uint32_t flag,
                       int peer = -1) {
  constexpr size_t kB = kPayloadBytes<P>;
  unsigned char* d = static_cast<unsigned char*>(dst);
  const size_t n = packetCount<P>(bytes);
  bool ok = true;
  for (size_t i = size_t(coop.rank()); i < n; i += size_t(coop.size())) {
    PayloadOf<P> v;
    if (!waitRead(c, src + i, flag, &v, i, peer)) {
      ok = false;
      break;
    }
    const size_t off = i * kB, len = bytes - off < kB ? bytes - off : kB;
    detail::storeBytes(d + off, v, len);
  }
  return coop.syncAll(ok);
}

// ---- windows: packets straight into an lsa peer's window ----

namespace detail {
// Offset aligned to the packet and [offset, offset + packet bytes) inside the window.
template <class P>
GIN_HD bool checkPacketRange(const DevComm& c, Window w, size_t offset, size_t bytes) {
  const uint64_t size = w.dev ? loadConst(&w.dev->bytes) : 0;
  const size_t need = bufferBytes<P>(bytes);
  if (w.dev && offset % sizeof(P) == 0 && offset <= size && need <= size - offset) return true;
  recordError(c, Op::BadArgument, -1, -1, w.dev ? loadConst(&w.dev->id) : ~uint64_t(0),
              offset % sizeof(P) != 0 ? uint64_t(offset) : uint64_t(offset + need),
              offset % sizeof(P) != 0 ? uint64_t(sizeof(P)) : size);
  return false;
}
}  // namespace detail

// Write `bytes` from src as packets into `peer`'s (an index in `team`) window
// dstWin at dstOffset (a multiple of sizeof(P); the packets fill
// bufferBytes<P>(bytes)). The peer must be lsa-reachable: otherwise the error
// record gets noTransport and nothing is written. A bad range or alignment is
// a badArgument. Returns false (on every thread of the coop) on either error.
template <class P, class Coop>
GIN_HD bool putPacketsToPeer(Coop coop, const DevComm& c, Team team, int peer, Window dstWin, size_t dstOffset,
                             const void* src, size_t bytes, uint32_t flag) {
  if (!detail::checkPacketRange<P>(c, dstWin, dstOffset, bytes)) return false;
  P* dst = static_cast<P*>(peerPointer(c, team, peer, dstWin, dstOffset));
  if (dst == nullptr) {
    recordError(c, Op::NoTransport, teamToWorld(c, team, peer), -1, 0, 0, 0);
    return false;
  }
  putPackets(coop, dst, src, bytes, flag);
  return true;
}

// Read `bytes` of packets with `flag` from this rank's window srcWin at
// srcOffset into dst. `peer` (world rank of the writer, or -1) labels a timeout.
template <class P, class Coop>
GIN_HD bool getPacketsFromWindow(Coop coop, const DevComm& c, void* dst, Window srcWin, size_t srcOffset, size_t bytes,
                                 uint32_t flag, int peer = -1) {
  if (!detail::checkPacketRange<P>(c, srcWin, srcOffset, bytes)) return coop.syncAll(false);
  return getPackets(coop, c, dst, static_cast<const P*>(localPointer(srcWin, srcOffset)), bytes, flag, peer);
}

}  // namespace gin::ll
