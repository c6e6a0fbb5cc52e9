// gin/host/tcp_frame.hpp — the tcp wire's frame format (version 1): the 72-byte
// TcpFrame header, its limits, sealing (magic, version, XXH64 checksums) and a
// readable dump, and why a receiver rejects a frame (WireFault). The checks it
// applies are in TcpReceiver (tcp_receiver.hpp).
#pragma once

#include "gin/core/xxh64.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace gin {

// ---- wire format, version 1 ----------------------------------------------------
//
// Every message is a 72-byte header, then `length` payload bytes (Data only).
// Host byte order: the ranks of a job share an architecture, and a foreign one
// shows up as a bad magic. Checksums are XXH64 (the published xxHash 64-bit
// algorithm, seed 0): ~10 GB/s per core in portable C++, so checking every
// payload costs less than the copy out of the staging buffer, and it catches
// what TCP's 16-bit sum misses (corruption in buffers, middleboxes, bugs).
enum class TcpFrameType : uint8_t { Hello = 1, Data = 2, Signal = 3, Fence = 4, Bye = 5 };

inline constexpr uint32_t kTcpFrameMagic = 0x574e4947;  // "GINW" in memory on little-endian hosts
inline constexpr uint16_t kTcpWireVersion = 1;
// Puts are cut into frames of at most this many payload bytes; a receiver
// stages one frame per peer, so this bounds its memory (and rejects a length
// field that would make it allocate more).
inline constexpr uint64_t kTcpMaxPayload = 1ull << 20;

struct TcpFrame {
  uint32_t magic;    // kTcpFrameMagic
  uint16_t version;  // kTcpWireVersion
  uint8_t type;      // TcpFrameType
  uint8_t action;    // ProxyAction applied after the payload (Data, Signal); None otherwise
  int32_t sender;    // world rank of the sender
  uint32_t window;   // Data: destination window id. Hello: the receiver's rank
  uint64_t offset;   // Data: destination offset. Hello: nRanks
  uint64_t length;   // payload bytes after the header (Data: 1..kTcpMaxPayload; others 0)
  uint64_t value;    // signal value (Add/Set). Fence: fence number. Hello: communicator token
  uint32_t signalId;
  uint32_t reserved;    // 0
  uint64_t seq;         // 1, 2, 3, ... per connection and direction (Hello: 0)
  uint64_t payloadSum;  // XXH64 of the payload (0 when there is none)
  uint64_t headerSum;   // XXH64 of the 64 bytes before this field
};
static_assert(sizeof(TcpFrame) == 72 && offsetof(TcpFrame, headerSum) == 64);

// Fill magic, version and both checksums of a frame whose other fields are set.
inline void sealTcpFrame(TcpFrame& h, const void* payload) {
  h.magic = kTcpFrameMagic;
  h.version = kTcpWireVersion;
  h.payloadSum = h.length ? xxh64(payload, size_t(h.length)) : 0;
  h.headerSum = xxh64(&h, offsetof(TcpFrame, headerSum));
}

// Why the tcp wire rejected a frame (DeviceErrorRecord::objectId for Op::WireFrame).
enum class WireFault : uint32_t {
  None = 0,
  BadMagic,         // not a gin wire frame: corrupt stream or another program
  BadVersion,       // the peer speaks another wire version (another gin release)
  HeaderChecksum,   // the header's checksum does not match its bytes
  BadType,          // unknown frame type
  BadSender,        // sender rank field differs from the connection's peer
  Sequence,         // frame sequence number skipped or repeated
  Reserved,         // a reserved field is not zero
  Oversized,        // payload length above the wire's maximum frame payload
  BadLength,        // payload length not allowed for the frame type
  BadAction,        // unknown signal action, or one the frame type cannot carry
  BadSignal,        // signal id past the receiver's signal words
  UnknownWindow,    // no window with that id on the receiver
  OutOfBounds,      // offset + length past the end of the window
  PayloadChecksum,  // the payload's checksum does not match its bytes
  BadFence,         // fence number out of order
};

inline const char* wireFaultName(WireFault f) {
  switch (f) {
    case WireFault::None: return "none";
    case WireFault::BadMagic: return "bad magic";
    case WireFault::BadVersion: return "unsupported wire version";
    case WireFault::HeaderChecksum: return "header checksum mismatch";
    case WireFault::BadType: return "unknown frame type";
    case WireFault::BadSender: return "sender rank does not match the connection";
    case WireFault::Sequence: return "sequence number out of order";
    case WireFault::Reserved: return "reserved field not zero";
    case WireFault::Oversized: return "oversized payload";
    case WireFault::BadLength: return "payload length not allowed for the frame type";
    case WireFault::BadAction: return "bad signal action";
    case WireFault::BadSignal: return "signal id out of range";
    case WireFault::UnknownWindow: return "unknown window";
    case WireFault::OutOfBounds: return "range past the end of the window";
    case WireFault::PayloadChecksum: return "payload checksum mismatch";
    case WireFault::BadFence: return "fence out of order";
  }
  return "unknown fault";
}

inline std::string tcpFrameText(const TcpFrame& h) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "{magic 0x%08x, version %u, type %u, action %u, sender %d, window %u, offset %llu, length %llu, "
                "value %llu, signal %u, reserved %u, seq %llu}",
                h.magic, unsigned(h.version), unsigned(h.type), unsigned(h.action), h.sender, h.window,
                (unsigned long long)h.offset, (unsigned long long)h.length, (unsigned long long)h.value, h.signalId,
                h.reserved, (unsigned long long)h.seq);
  return buf;
}

}  // namespace gin
