// gin/host/bootstrap_shm.hpp — the shared memory TcpBootstrap's ranks meet in
// when they are all on one host (bootstrap_tcp.hpp decides, at the rendezvous).
//
// One segment per job: a header with a failure record, one arrival word per
// rank, and two slots per rank (call number parity) of a call description and
// up to kSlotBytes of payload. A rank writes its slot for call `seq`, then
// stores `seq` into its arrival word (release); a rank that has loaded
// arrival >= seq for every rank (acquire) may read every slot of `seq`. Words
// only grow, so there is no sense to reset. Two slots are enough: a rank
// writes its slot of seq + 2 only after every rank arrived at seq + 1, that
// is, after every rank finished reading seq.
#pragma once

#include "gin/core/atomic.hpp"
#include "gin/core/error.hpp"
#include "gin/host/shm_segment.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <string>

namespace gin {
namespace detail {

// One rank's description of its call, as the TCP frame carries it.
struct ShmCall {
  uint32_t op;
  int32_t root;
  uint64_t seq;
  uint64_t size;
};

class BootstrapShm {
 public:
  // Per rank and call: allGather's bytesPerRank or broadcast's bytes up to
  // this go through the segment; larger calls take the TCP path.
  static constexpr size_t kSlotBytes = 64 * 1024;
  static constexpr size_t kFailureTextBytes = 4096;

  BootstrapShm() = default;

  // Rank 0: a fresh segment for nRanks, every page reserved (a full /dev/shm
  // is an Error here, which the caller takes as "use TCP").
  static BootstrapShm create(int nRanks, int port) {
    BootstrapShm s;
    s.seg_ = ShmSegment::create(bytesFor(nRanks), "bootstrap." + std::to_string(port) + ".", /*reserve*/ true);
    s.nRanks_ = nRanks;
    Header* h = new (s.seg_.data()) Header{};
    h->magic = kMagic;
    h->nRanks = static_cast<uint32_t>(nRanks);
    std::snprintf(h->name, sizeof h->name, "%s", s.seg_.name().c_str());
    return s;
  }

  // The other ranks: rank 0's segment, checked to be the one it described.
  static BootstrapShm open(const std::string& name, int nRanks) {
    BootstrapShm s;
    s.seg_ = ShmSegment::open(name, bytesFor(nRanks));
    s.nRanks_ = nRanks;
    const Header* h = s.header();
    if (h->magic != kMagic || h->nRanks != static_cast<uint32_t>(nRanks) || name != h->name)
      throw Error("shared memory segment " + name + " is not the bootstrap segment rank 0 made for " +
                  std::to_string(nRanks) + " ranks");
    return s;
  }

  explicit operator bool() const { return seg_.data() != nullptr; }
  const std::string& name() const { return seg_.name(); }
  void unlink() { seg_.unlink(); }
  void reset() { *this = BootstrapShm(); }

  // Publish this rank's call `c` (c.seq) with `len` payload bytes.
  void arrive(int rank, const ShmCall& c, const void* payload, size_t len) {
    Slot& s = slot(rank, c.seq);
    s.call = c;
    if (len > 0) std::memcpy(s.payload, payload, len);
    tsanPublishToPeers();  // what ThreadSanitizer cannot see across processes (gin/core/atomic.hpp)
    arrival(rank).store(c.seq, std::memory_order_release);
  }

  // The first rank from `from` on that has not arrived at `seq`; nRanks when all have.
  int firstMissing(uint64_t seq, int from) const {
    for (; from < nRanks_; ++from)
      if (arrival(from).load(std::memory_order_acquire) < seq) return from;
    tsanHeardFromPeers();
    return from;
  }

  // A rank's call and payload of `seq`: valid once firstMissing(seq, 0) == nRanks,
  // until this rank arrives at seq + 1.
  const ShmCall& call(int rank, uint64_t seq) const { return slot(rank, seq).call; }
  const void* payload(int rank, uint64_t seq) const { return slot(rank, seq).payload; }

  // A rank gave up in call `seq` (the first failure recorded wins; later
  // ones keep their own message).
  struct Failure {
    uint64_t seq;
    std::string text;
  };
  void markFailed(uint64_t seq, const std::string& text) {
    Header* h = header();
    uint32_t free = 0;
    if (!h->failClaim.compare_exchange_strong(free, 1, std::memory_order_acq_rel)) return;
    h->failSeq = seq;
    std::snprintf(h->failText, sizeof h->failText, "%s", text.c_str());
    h->failPublished.store(1, std::memory_order_release);
  }
  std::optional<Failure> failure() const {
    const Header* h = header();
    if (h->failPublished.load(std::memory_order_acquire) == 0) return std::nullopt;
    return Failure{h->failSeq, h->failText};
  }

 private:
  static constexpr uint64_t kMagic = 0x4d48534e49470001ull;  // "GINSHM" v1
  static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
                "the segment's words must be lock-free to be shared between processes");

  struct Header {
    uint64_t magic;
    uint32_t nRanks;
    char name[116];
    alignas(64) std::atomic<uint32_t> failClaim;
    std::atomic<uint32_t> failPublished;
    uint64_t failSeq;
    char failText[kFailureTextBytes];
  };
  struct alignas(64) Arrival {
    std::atomic<uint64_t> seq;  // the last call this rank arrived at
  };
  struct alignas(64) Slot {
    ShmCall call;
    alignas(64) unsigned char payload[kSlotBytes];
  };
  static constexpr size_t kArrivalsAt = (sizeof(Header) + 63) / 64 * 64;

  static size_t bytesFor(int nRanks) {
    return kArrivalsAt + static_cast<size_t>(nRanks) * (sizeof(Arrival) + 2 * sizeof(Slot));
  }
  char* base() const { return static_cast<char*>(seg_.data()); }
  Header* header() const { return reinterpret_cast<Header*>(base()); }
  std::atomic<uint64_t>& arrival(int rank) const { return reinterpret_cast<Arrival*>(base() + kArrivalsAt)[rank].seq; }
  Slot& slot(int rank, uint64_t seq) const {
    Slot* slots = reinterpret_cast<Slot*>(base() + kArrivalsAt + static_cast<size_t>(nRanks_) * sizeof(Arrival));
    return slots[2 * static_cast<size_t>(rank) + (seq & 1)];
  }

  ShmSegment seg_;
  int nRanks_ = 0;
};

}  // namespace detail
}  // namespace gin
