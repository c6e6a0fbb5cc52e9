// gin/host/p2p.hpp — host setup of the send/recv step FIFOs (gin/device/p2p.hpp).
//
//   gin::p2p::Fifo fifo = gin::p2p::create(comm, {.nSlots = 8, .chunkBytes = 128 << 10});  // collective
//   kernel<<<...>>>(comm.devComm(), fifo, ...);
//   gin::p2p::destroy(comm, fifo);                                                         // collective
//
// create() allocates one FIFO window (every rank: nChannels x nRanks rings of
// nSlots x chunkBytes, then for each lsa sender nSlots LL slots of twice
// llMaxBytes) and reserves 2 x nChannels x nRanks signal ids. The
// signals and their shadows must not have been used before (they are zero
// when the Comm is built): p2p keeps its step counts in them.
#pragma once

#include <string>
#include <vector>

#include "gin/device/p2p.hpp"
#include "gin/host/agree.hpp"
#include "gin/host/comm.hpp"

namespace gin::p2p {

struct Config {
  uint32_t nSlots = 8;               // ring depth per connector (NCCL_STEPS): a power of two
  uint64_t chunkBytes = 128u << 10;  // slot size: a multiple of 16 bytes
  uint32_t nChannels = 1;            // independent connector sets (one per concurrently sending coop)
  int64_t signalBase = -1;           // first signal id p2p uses; -1: the top 2 x nChannels x nRanks ids
  // Messages of 1 .. llMaxBytes to lsa peers go as one LL16 step (flagged
  // packets, twice their size, in an LL ring of nSlots slots per lsa
  // connector); 0: never. At most 1 MiB.
  uint64_t llMaxBytes = 16u << 10;
};

// Signal ids the FIFOs of `cfg` need on a communicator of nRanks ranks.
inline uint64_t signalsNeeded(const Config& cfg, int nRanks) { return 2ull * cfg.nChannels * uint64_t(nRanks); }

// Collective: every rank passes the same config (a rank whose config is
// refused, or whose llMaxBytes differs, makes every rank throw).
inline Fifo create(Comm& comm, const Config& cfg = {}) {
  const int n = comm.nRanks();
  const uint64_t need = signalsNeeded(cfg, n), have = uint64_t(comm.config().nSignals);
  const int64_t base = cfg.signalBase >= 0 ? cfg.signalBase : int64_t(have) - int64_t(need);
  std::string problem;
  // nSlots a power of two: step % nSlots stays continuous when the 64-bit
  // step counters wrap, so step k and step k - nSlots share a slot forever.
  if (cfg.nSlots < 1 || (cfg.nSlots & (cfg.nSlots - 1)) != 0 || cfg.nChannels < 1 || cfg.chunkBytes == 0 ||
      cfg.chunkBytes % 16 != 0)
    problem = "nSlots must be a power of two, nChannels >= 1 and chunkBytes a positive multiple of 16 (got " +
              std::to_string(cfg.nSlots) + ", " + std::to_string(cfg.nChannels) + ", " +
              std::to_string(cfg.chunkBytes) + ")";
  else if (base < 0 || uint64_t(base) + need > have)
    problem = "needs " + std::to_string(need) + " signal ids (2 x " + std::to_string(cfg.nChannels) + " channels x " +
              std::to_string(n) + " ranks) from " + std::to_string(base) + ", but the Comm has " +
              std::to_string(have) + "; raise CommConfig::nSignals or lower Config::signalBase";
  else if (cfg.llMaxBytes > (1u << 20))
    problem = "llMaxBytes " + std::to_string(cfg.llMaxBytes) +
              " is above 1 MiB (LL16 packets take twice the message, in nSlots slots per connector); lower it, or "
              "0 for no LL steps";
  detail::agreeOnValue(comm.bootstrap(), "p2p::create", cfg.llMaxBytes, "llMaxBytes", "",
                       problem.empty() ? nullptr : problem.c_str(), "every rank must pass the same Config");
  // LL steps only where a message may go by load/store: lsa members with no
  // network transport forced (the same answer on every rank).
  const DevComm& dc = comm.devComm();
  const bool ll = cfg.llMaxBytes > 0 && dc.lsaSize > 0 && !lsa::Backend::forced(dc, false);
  const int llRanks = ll ? dc.lsaSize : 0;
  const uint64_t fifoBytes = uint64_t(cfg.nChannels) * uint64_t(n) * cfg.nSlots * cfg.chunkBytes;
  const uint64_t llBytes =
      ll ? uint64_t(cfg.nChannels) * uint64_t(llRanks) * cfg.nSlots * ll::bufferBytes<ll::Packet16>(cfg.llMaxBytes) : 0;
  Fifo f{};
  f.window = comm.allocWindow(size_t(fifoBytes + llBytes));
  f.chunkBytes = cfg.chunkBytes;
  f.nSlots = cfg.nSlots;
  f.nChannels = cfg.nChannels;
  f.signalBase = uint32_t(base);
  f.nRanks = n;
  f.llMaxBytes = ll ? cfg.llMaxBytes : 0;
  f.llOffset = fifoBytes;
  f.llRanks = llRanks;
  return f;
}

// Collective: frees the FIFO window. No send or recv may be in flight.
inline void destroy(Comm& comm, const Fifo& f) { comm.deregisterWindow(f.window); }

}  // namespace gin::p2p
