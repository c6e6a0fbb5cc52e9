// gin/host/bootstrap_frame.hpp — TcpBootstrap's messages (bootstrap_tcp.hpp): the
// 40-byte FrameHeader, its magic, a readable dump, and sending a frame or reading
// an abort's text under a deadline.
#pragma once

#include "gin/host/bootstrap_base.hpp"
#include "gin/host/deadline.hpp"
#include "gin/host/socket.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

namespace gin {
namespace detail {

// Every message on the wire. Host byte order: the ranks of one job share an
// architecture, and a foreign one shows up as a magic mismatch, not as garbage.
struct FrameHeader {
  uint32_t magic;
  uint32_t op;
  uint64_t seq;     // collective number, 1-based, the same on every rank
  uint64_t length;  // payload bytes that follow
  uint64_t size;    // the call's size argument (bytesPerRank, bytes, or nRanks for hello)
  int32_t sender;
  int32_t root;  // broadcast root; -1 otherwise
};
static_assert(sizeof(FrameHeader) == 40);
inline constexpr uint32_t kFrameMagic = 0x424e4947;  // "GINB" in memory on little-endian hosts
inline constexpr uint64_t kMaxAbortText = 64 * 1024;

inline std::string hexText(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

inline std::string frameText(const FrameHeader& h) {
  return "{magic " + hexText(h.magic) + ", op " + opText(h.op) + ", seq " + std::to_string(h.seq) + ", length " +
         std::to_string(h.length) + ", size " + std::to_string(h.size) + ", sender " + std::to_string(h.sender) +
         ", root " + std::to_string(h.root) + "}";
}

// The header, then its h.length payload bytes.
inline IoResult sendFrame(int fd, const FrameHeader& h, const void* payload, Clock::time_point deadline) {
  auto r = sendAll(fd, &h, sizeof h, deadline);
  if (r.kind == Io::Ok && h.length > 0) r = sendAll(fd, payload, h.length, deadline);
  return r;
}

// An abort's text (`length` bytes after its header), or a note that it was too long or cut short.
inline std::string readAbortText(int fd, uint64_t length, Clock::time_point deadline) {
  if (length > kMaxAbortText) return "(abort message of " + std::to_string(length) + " bytes, not read)";
  std::string text(length, '\0');
  if (recvAll(fd, text.data(), length, deadline).kind != Io::Ok) return "(abort message cut short)";
  return text;
}

// When rank 0 gives up it sends its reason and exits; our next send may then
// hit a reset connection before we read that reason, which is still queued.
inline std::string abortReasonIfAny(int fd, uint64_t timeoutNs) {
  FrameHeader h{};
  const auto deadline = deadlineAfter(std::min<uint64_t>(timeoutNs, 200'000'000ull));
  if (recvAll(fd, &h, sizeof h, deadline).kind != Io::Ok) return {};
  if (h.magic != kFrameMagic || h.op != kAbort) return {};
  return readAbortText(fd, h.length, deadline);
}

}  // namespace detail
}  // namespace gin
