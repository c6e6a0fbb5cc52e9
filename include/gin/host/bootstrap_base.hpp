// gin/host/bootstrap_base.hpp — the abstract Bootstrap (allGather, broadcast,
// barrier among the ranks of a job, before there is a communicator), its
// BootstrapConfig, and the helpers its implementations share: every call is
// collective and bounded by the timeout; a failure names the rank and the call.
#pragma once

#include "gin/core/error.hpp"
#include "gin/host/env.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gin {

struct BootstrapConfig {
  uint64_t timeoutNs = 60'000'000'000ull;  // env GIN_BOOTSTRAP_TIMEOUT_MS overrides (milliseconds)
};

namespace detail {

// Longer than any job waits for a rendezvous; keeps deadline arithmetic far from overflow.
inline constexpr uint64_t kMaxTimeoutNs = 365ull * 24 * 3600 * 1'000'000'000ull;
inline constexpr int kMaxRanks = int(env::kMaxRanks);
static_assert(uint64_t(env::kMaxTimeoutMs) * 1'000'000ull == kMaxTimeoutNs);

inline uint64_t bootstrapTimeoutNs(const BootstrapConfig& cfg) {
  if (auto ms = env::integer("GIN_BOOTSTRAP_TIMEOUT_MS")) return static_cast<uint64_t>(*ms) * 1'000'000ull;
  if (cfg.timeoutNs == 0)
    throw Error(
        "BootstrapConfig::timeoutNs is 0; every bootstrap wait needs a positive deadline "
        "(default 60 s, or set GIN_BOOTSTRAP_TIMEOUT_MS)");
  return std::min(cfg.timeoutNs, kMaxTimeoutNs);
}

// "rank 2" / "ranks 2,3,7"; long lists are cut so a 4096-rank failure stays readable.
inline std::string rankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  const size_t shown = std::min<size_t>(ranks.size(), 16);
  for (size_t i = 0; i < shown; ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  if (shown < ranks.size()) s += ",... (" + std::to_string(ranks.size() - shown) + " more)";
  return s;
}

enum FrameOp : uint32_t { kHello = 1, kWelcome, kAllGather, kBroadcast, kBarrier, kAbort, kShmCheck };

inline std::string opText(uint32_t op) {
  switch (op) {
    case kHello: return "hello";
    case kWelcome: return "welcome";
    case kAllGather: return "allGather";
    case kBroadcast: return "broadcast";
    case kBarrier: return "barrier";
    case kAbort: return "abort";
    case kShmCheck: return "shared-memory check";
  }
  return "op " + std::to_string(op);
}

// One collective call, as it is named in messages: "broadcast #4 (bytes 16, root 1)".
inline std::string callText(uint32_t op, uint64_t seq, uint64_t size, int root) {
  std::string s = opText(op) + " #" + std::to_string(seq);
  if (op == kAllGather) s += " (bytesPerRank " + std::to_string(size) + ")";
  if (op == kBroadcast) s += " (bytes " + std::to_string(size) + ", root " + std::to_string(root) + ")";
  return s;
}

inline void checkBuffer(const void* data, size_t bytes, const char* what) {
  if (data == nullptr && bytes != 0)
    throw Error(std::string(what) + ": data is null but " + std::to_string(bytes) +
                " bytes were requested; pass a buffer of that size");
}

inline size_t gatherBytes(size_t bytesPerRank, int nRanks) {
  if (bytesPerRank != 0 && static_cast<size_t>(nRanks) > SIZE_MAX / bytesPerRank)
    throw Error("allGather: bytesPerRank " + std::to_string(bytesPerRank) + " times " + std::to_string(nRanks) +
                " ranks overflows size_t");
  return bytesPerRank * static_cast<size_t>(nRanks);
}

}  // namespace detail

class Bootstrap {  // abstract; one object per rank; not thread-safe per object
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int nRanks() const = 0;
  // Collective. `data` holds nRanks slots of `bytesPerRank`; this rank's slot
  // (data + rank*bytesPerRank) is its input; on return every slot is filled.
  virtual void allGather(void* data, size_t bytesPerRank) = 0;
  // Collective. Copies root's `bytes` at data to every rank's data.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Same-process ranks share one address space (InProcess); TCP ranks may or may not.
  virtual bool sameProcessGroup() const = 0;  // true for InProcessBootstrap
  // The IPv4 address of this process on the path to the other ranks, for
  // network wires to advertise; empty when the bootstrap does not know one.
  virtual std::string localAddress() const { return {}; }
};

}  // namespace gin
