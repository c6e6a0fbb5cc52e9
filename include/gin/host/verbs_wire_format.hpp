// gin/host/verbs_wire_format.hpp — what the verbs wire sends, as pure
// functions (no rdma-core needed, always compiled, tested without a NIC): how
// a put is split into RDMA WRITEs, the 16-byte signal record (explicit
// little-endian bytes) and the immediate that numbers signal messages.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "gin/device/transport/proxy.hpp"

namespace gin {
namespace verbs {

// Calls f(offset, len) for consecutive pieces of [0, bytes), each 1..maxChunk
// bytes; nothing for bytes == 0. One RDMA WRITE per piece.
template <class F>
void forEachChunk(uint64_t bytes, uint64_t maxChunk, F&& f) {
  for (uint64_t off = 0; off < bytes;) {
    const uint64_t len = std::min(maxChunk, bytes - off);
    f(off, len);
    off += len;
  }
}

// The 16-byte signal record a sender puts in a receiver's mailbox slot.
// Explicit little-endian bytes: nothing depends on either host's byte order
// (the trap RDMA atomics fall into on mlx5, see VerbsWire). Bytes 0..3: 'G',
// 's', version 1, ProxyAction; 4..7: signal id; 8..15: value.
inline constexpr size_t kSignalRecordBytes = 16;
struct SignalRecord {
  uint32_t id = 0;
  ProxyAction op = ProxyAction::None;
  uint64_t value = 0;
};
inline void encodeSignal(const SignalRecord& r, unsigned char out[kSignalRecordBytes]) {
  out[0] = 'G', out[1] = 's', out[2] = 1, out[3] = uint8_t(r.op);
  for (int i = 0; i < 4; ++i) out[4 + i] = uint8_t(r.id >> (8 * i));
  for (int i = 0; i < 8; ++i) out[8 + i] = uint8_t(r.value >> (8 * i));
}
// False (and *r untouched) for anything encodeSignal cannot have written.
inline bool decodeSignal(const unsigned char in[kSignalRecordBytes], SignalRecord* r) {
  if (in[0] != 'G' || in[1] != 's' || in[2] != 1) return false;
  if (in[3] != uint8_t(ProxyAction::Add) && in[3] != uint8_t(ProxyAction::Set)) return false;
  SignalRecord d;
  d.op = ProxyAction(in[3]);
  for (int i = 0; i < 4; ++i) d.id |= uint32_t(in[4 + i]) << (8 * i);
  for (int i = 0; i < 8; ++i) d.value |= uint64_t(in[8 + i]) << (8 * i);
  *r = d;
  return true;
}
// The immediate of a signal message: the low 32 bits of the per-(sender,
// receiver) message number, so the receiver notices a lost or repeated one.
inline uint32_t signalImmediate(uint64_t seq) { return uint32_t(seq); }
inline bool immediateMatches(uint32_t imm, uint64_t expectedSeq) { return imm == uint32_t(expectedSeq); }

}  // namespace verbs
}  // namespace gin
