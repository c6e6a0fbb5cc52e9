// gin/host/allreduce.hpp — host side of gin::coll's AllReduce
// (gin/device/allreduce.hpp): the workspace, the plan (auto-tuned for Hopper,
// overridable through RingTuning and GIN_ALLREDUCE_* environment variables),
// running it on CPU ranks and launching it on a GPU. The tuning table, the
// paths by size and every environment variable: docs/design/allreduce.md.
//
//   gin::coll::RingWorkspace ws = gin::coll::createRingWorkspace(comm);      // collective, once
//   gin::coll::RingPlan plan = gin::coll::planRingAllReduce(comm, ws, count, sizeof(float));
//   gin::coll::launchRingAllReduce<float, gin::coll::Sum>(comm, ws, plan, sendWin, 0, recvWin, 0, stream);  // nvcc
//   gin::coll::runRingAllReduce<float, gin::coll::Sum>(comm, ws, plan, sendWin, 0, recvWin, 0);    // CPU ranks
//   gin::coll::destroyRingWorkspace(comm, ws);                                 // collective
//
// A bad environment value throws gin::Error naming the variable, the value
// and what is allowed.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <tuple>

#include "gin/device/allreduce.hpp"
#include "gin/host/comm.hpp"
#include "gin/host/env.hpp"

namespace gin::coll {

// Tuning knobs; 0 means "auto" where noted.
struct RingTuning {
  uint64_t chunkBytes = 0;              // 0: auto
  uint64_t numChunks = 0;               // 0: depth x nRanks
  uint64_t maxBdpBytes = 32ull << 20;   // chunkBytes x numChunks stays below (auto chunk size)
  uint64_t minShardBytes = 16;          // smallest chunk
  int64_t bidirAgMaxBytes = 4ll << 20;  // 0: off, -1: always, > 0: messages up to this size
  uint32_t maxBlocks = 0;               // 0: no cap beyond the auto choice
  uint32_t blockSize = 0;               // 0: auto
  uint32_t blocks = 0;                  // exact block count; 0: auto (GIN_ALLREDUCE_RING_NUM_BLOCKS)
  // Messages up to this size take the one-shot LL16 path when every peer is
  // reached by lsa (and the workspace has an LL buffer that large); 0: never;
  // kLlAuto: llAutoBytes(nRanks), kLlAutoBytes / nRanks (512 KiB on 2
  // ranks, 128 KiB on 8: every rank writes its whole message to every peer,
  // so the traffic grows with the ranks; from there the direct path was
  // faster on 2, 3 and 4 H200s), but 128 KiB on 4 (the one-shot path next).
  uint64_t llMaxBytes = kLlAuto;
  // Messages of wideMinBytes or more: wideBlocks blocks (0: keep the
  // table), chunk = bytes / (nRanks x wideBlocks) within [wideMinChunkBytes,
  // wideChunkBytes]; capped like any block count by maxBlocks, the workspace
  // and the number of units.
  uint32_t wideBlocks = 16;
  uint64_t wideChunkBytes = 512ull << 10;
  uint64_t wideMinChunkBytes = 16ull << 10;
  uint64_t wideMinBytes = 512ull << 10;
  // Messages of wideLargeMinBytes or more: wideLargeBlocks blocks with the
  // wide plan's chunk (0: keep wideBlocks). On 4 H200s 32 blocks took 1 GiB
  // in 4742 us against 16 blocks' 5147 (NCCL: 4552), on 2 in 3233 against
  // 3399 (NCCL: 3258); below 64 MiB the units capped them at 16 anyway.
  uint32_t wideLargeBlocks = 32;
  uint64_t wideLargeMinBytes = 64ull << 20;
  // Messages above the LL limit and up to this size take the two-shot direct
  // path (gin/device/allreduce.hpp) when every peer is reached by lsa and there
  // are at most kDirectMaxRanks ranks; 0: never.
  // On 2, 3 and 4 H200s it beat NCCL from 1-2 MiB to 16 MiB, tied the ring
  // at 32 MiB on 2 and 4 (and beat it by a fifth on 3), and lost from 64 MiB
  // (docs/performance.md).
  uint64_t directMaxBytes = 32ull << 20;
  // Blocks of a direct call, 1 .. kLlMaxBlocks; 0: one per directBlockBytes
  // of the message, at least 1 and at most kLlMaxBlocks (on 2 H200s every
  // doubling up to 32 blocks helped from 1 MiB; on 4 they tied from 16).
  uint32_t directBlocks = 0;
  uint64_t directBlockBytes = 16ull << 10;
  // Messages above the LL limit and up to this size (and the workspace's
  // shotMaxBytes) take the one-shot path when every peer is reached by lsa
  // and there are at most kDirectMaxRanks ranks: every rank stores its
  // message into a slot at every peer, one barrier, then sums the n copies
  // in its own memory (one barrier where the direct path has two, n - 1
  // copies of the message sent where it sends two); 0: never; kAuto:
  // shotAutoBytes(nRanks), from H200s (2026-11-28, docs/performance.md):
  // against the direct path 12.8 / 14.4 us at 1 MiB on 2 ranks, 12.6 / 14.0
  // at 512 KiB and 16.4 / 17.1 at 1 MiB on 3, 14.5 / 14.5 at 512 KiB and
  // 19.9 / 16.7 at 1 MiB on 4, and on 4 ranks 12.3 us at 256 KiB against
  // LL16's 12.9 (so LL16 stops at 128 KiB there). More ranks: not measured,
  // off (it sends n - 1 copies of the message).
  uint64_t shotMaxBytes = kAuto;
  // Blocks of a one-shot call, 1 .. kLlMaxBlocks; 0: one per shotBlockBytes
  // of the message. Never fewer than the workspace's slots need.
  uint32_t shotBlocks = 0;
  uint64_t shotBlockBytes = 16ull << 10;

  static constexpr uint64_t kLlAuto = ~uint64_t(0);
  static constexpr uint64_t kAuto = ~uint64_t(0);  // shotMaxBytes: what shotAutoBytes says
  static constexpr uint64_t kLlAutoBytes = 1ull << 20;
  // What kLlAuto means on nRanks ranks (0 for one rank, which never takes
  // LL): kLlAutoBytes / nRanks, but 128 KiB on 4 ranks, where the one-shot
  // path took 256 KiB faster (shotMaxBytes).
  static constexpr uint64_t llAutoBytes(int nRanks) {
    return nRanks == 4 ? 128ull << 10 : nRanks > 1 ? kLlAutoBytes / uint64_t(nRanks) : 0;
  }
  // What kAuto means for shotMaxBytes on nRanks ranks: 1 MiB on 2 and 3,
  // 512 KiB on 4, else 0.
  static constexpr uint64_t shotAutoBytes(int nRanks) {
    return nRanks == 2 || nRanks == 3 ? 1ull << 20 : nRanks == 4 ? 512ull << 10 : 0;
  }
};

namespace detail {
static_assert(env::find("GIN_ALLREDUCE_LL_BLOCKS")->hi == kLlMaxBlocks &&
                  env::find("GIN_ALLREDUCE_DIRECT_BLOCKS")->hi == kLlMaxBlocks &&
                  env::find("GIN_ALLREDUCE_SHOT_BLOCKS")->hi == kLlMaxBlocks &&
                  env::find("GIN_ALLREDUCE_RING_BLOCK_SIZE")->hi == kRingMaxThreads,
              "gin/host/env.hpp's rows follow the kernel's limits");
}  // namespace detail

// `base` with the GIN_ALLREDUCE_RING_* variables that are set applied.
inline RingTuning ringTuningFromEnv(RingTuning base = {}) {
  if (auto v = env::size("GIN_ALLREDUCE_RING_CHUNK_SIZE")) base.chunkBytes = uint64_t(*v);
  if (auto v = env::integer("GIN_ALLREDUCE_RING_NUM_CHUNKS")) base.numChunks = uint64_t(*v);
  if (auto v = env::size("GIN_ALLREDUCE_RING_MAX_BDP")) base.maxBdpBytes = uint64_t(*v);
  if (auto v = env::size("GIN_ALLREDUCE_RING_MIN_SHARD_SIZE")) base.minShardBytes = uint64_t(*v);
  if (auto v = env::size("GIN_ALLREDUCE_RING_BIDIR_AG_MAX_SIZE")) base.bidirAgMaxBytes = int64_t(*v);
  if (auto v = env::integer("GIN_ALLREDUCE_RING_MAX_BLOCKS")) base.maxBlocks = uint32_t(*v);
  if (auto v = env::integer("GIN_ALLREDUCE_RING_NUM_BLOCKS")) base.blocks = uint32_t(*v);
  if (auto v = env::size("GIN_ALLREDUCE_LL_MAX_SIZE")) base.llMaxBytes = uint64_t(*v);
  if (auto v = env::size("GIN_ALLREDUCE_DIRECT_MAX_SIZE")) base.directMaxBytes = uint64_t(*v);
  if (auto v = env::integer("GIN_ALLREDUCE_DIRECT_BLOCKS")) base.directBlocks = uint32_t(*v);
  if (auto v = env::size("GIN_ALLREDUCE_SHOT_MAX_SIZE")) base.shotMaxBytes = uint64_t(*v);
  if (auto v = env::integer("GIN_ALLREDUCE_SHOT_BLOCKS")) base.shotBlocks = uint32_t(*v);
  if (auto v = env::integer("GIN_ALLREDUCE_RING_BLOCK_SIZE")) base.blockSize = uint32_t(*v);
  return base;
}

// ---- workspace ----

struct RingWorkspaceConfig {
  uint64_t tmpBytes = 32ull << 20;  // temporary slots per rank (the max BDP of the default tuning)
  uint32_t maxBlocks = 32;          // blocks a plan may use: 4 signal ids each
  int64_t signalBase = -1;          // first signal id; -1: the top 4 x maxBlocks ids (p2p's default too: set
                                    // one of them explicitly when both are used)
  // Largest LL message: an LL window (nRanks > 1) of 512 + 256 x nRanks +
  // 2 x nRanks x 2 x this bytes (call counts, the direct path's flags, the
  // slots); 0: no slots; RingTuning::kLlAuto: what the default tuning takes on this many
  // ranks (llAutoBytes: 1 MiB / nRanks, so the window is 4 MiB, but 128
  // KiB on 4 ranks).
  uint64_t llMaxBytes = RingTuning::kLlAuto;
  // Blocks of every LL call, 1 .. kLlMaxBlocks (GIN_ALLREDUCE_LL_BLOCKS
  // overrides): each writes and reduces its share of the packets. On 2 H200s
  // 32 blocks took 5.3 / 6.4 / 15.3 us at 4 KiB / 128 KiB / 1 MiB, against
  // 4.9 / 7.9 / 38.7 with 8 and 7.9 / 44 / 307 with one (docs/performance.md).
  uint32_t llBlocks = kLlMaxBlocks;
  // Largest one-shot message: a window of 2 x nRanks x this bytes (nRanks >
  // 1, every peer reached by lsa), rounded down to a multiple of 16 x
  // kLlMaxBlocks; 0: none;
  // RingTuning::kAuto: what the default tuning takes (shotAutoBytes: 1 MiB
  // on 2 and 3 ranks, 512 KiB on 4, else none). GIN_ALLREDUCE_SHOT_MAX_SIZE,
  // when larger, raises it.
  uint64_t shotMaxBytes = RingTuning::kAuto;
};

// Whether every peer is reached by lsa with no network transport forced: what
// the LL path and the lsa-only kernel need.
inline bool lsaOnly(const Comm& comm) {
  bool only = comm.devComm().proxyAll == 0 && comm.devComm().ibgdaAll == 0;
  for (int r = 0; r < comm.nRanks(); ++r) only = only && comm.transportTo(r) == Transport::Lsa;
  return only;
}

// Collective: allocates the temporary window and reserves the signal ids,
// whose signals and shadows must be zero (unused) now: the AllReduce keeps
// its running counts in them.
inline RingWorkspace createRingWorkspace(Comm& comm, const RingWorkspaceConfig& cfg = {}) {
  const uint64_t llMaxBytes =
      cfg.llMaxBytes == RingTuning::kLlAuto ? RingTuning::llAutoBytes(comm.nRanks()) : cfg.llMaxBytes;
  if (llMaxBytes > (1ull << 30))
    throw Error("createRingWorkspace: llMaxBytes " + std::to_string(llMaxBytes) +
                " is larger than the 1 GiB the LL path allows; LL packets pay off for small messages only");
  uint32_t llBlocks = cfg.llBlocks;
  if (auto v = env::integer("GIN_ALLREDUCE_LL_BLOCKS")) llBlocks = uint32_t(*v);
  if (llBlocks < 1 || llBlocks > kLlMaxBlocks)
    throw Error("createRingWorkspace: llBlocks must be from 1 to " + std::to_string(kLlMaxBlocks) + " (got " +
                std::to_string(llBlocks) + ")");
  uint64_t shotMaxBytes =
      cfg.shotMaxBytes == RingTuning::kAuto ? RingTuning::shotAutoBytes(comm.nRanks()) : cfg.shotMaxBytes;
  if (auto v = env::size("GIN_ALLREDUCE_SHOT_MAX_SIZE")) shotMaxBytes = std::max(shotMaxBytes, uint64_t(*v));
  if (shotMaxBytes > (1ull << 30))
    throw Error("createRingWorkspace: shotMaxBytes " + std::to_string(shotMaxBytes) +
                " is larger than the 1 GiB the one-shot path allows (its window is 2 x nRanks x that)");
  shotMaxBytes = shotMaxBytes / (16 * kLlMaxBlocks) * (16 * kLlMaxBlocks);
  if (cfg.tmpBytes < 64 || cfg.tmpBytes % 16 != 0 || cfg.maxBlocks < 1)
    throw Error("createRingWorkspace: tmpBytes must be a multiple of 16 of at least 64 and maxBlocks at least 1 (got " +
                std::to_string(cfg.tmpBytes) + ", " + std::to_string(cfg.maxBlocks) + ")");
  const uint64_t need = 4ull * cfg.maxBlocks, have = uint64_t(comm.config().nSignals);
  const int64_t base = cfg.signalBase >= 0 ? cfg.signalBase : int64_t(have) - int64_t(need);
  if (base < 0 || uint64_t(base) + need > have)
    throw Error("createRingWorkspace: needs " + std::to_string(need) + " signal ids (4 x " +
                std::to_string(cfg.maxBlocks) + " blocks) from " + std::to_string(base) + ", but the Comm has " +
                std::to_string(have) + "; raise CommConfig::nSignals or lower maxBlocks / signalBase");
  RingWorkspace w{};
  w.tmp = comm.allocWindow(size_t(cfg.tmpBytes));
  w.tmpBytes = cfg.tmpBytes;
  w.signalBase = uint32_t(base);
  w.maxBlocks = cfg.maxBlocks;
  w.nRanks = comm.nRanks();
  w.llMaxBytes = llMaxBytes;
  w.llBlocks = llBlocks;
  w.shotMaxBytes = comm.nRanks() > 1 && lsaOnly(comm) ? shotMaxBytes : 0;  // no window where no plan can use it
  if (comm.nRanks() > 1) w.ll = comm.allocWindow(size_t(llBufferBytes(w)));
  if (w.shotMaxBytes > 0) w.shot = comm.allocWindow(size_t(shotBufferBytes(w)));
  return w;
}

// Collective: frees the workspace's windows. No AllReduce may be in flight.
inline void destroyRingWorkspace(Comm& comm, const RingWorkspace& w) {
  comm.deregisterWindow(w.tmp);
  if (w.nRanks > 1) comm.deregisterWindow(w.ll);
  if (w.shotMaxBytes > 0) comm.deregisterWindow(w.shot);
}

// ---- plan ----

inline constexpr uint32_t kRingMaxSlots = 8;

// The plan for `count` elements of `eltBytes` (1, 2, 4 or 8) on `nRanks` ranks.
inline RingPlan planRingAllReduce(int nRanks, const RingWorkspace& ws, uint64_t count, size_t eltBytes,
                                  const RingTuning& t) {
  if (nRanks < 1 || (eltBytes != 1 && eltBytes != 2 && eltBytes != 4 && eltBytes != 8))
    throw Error("planRingAllReduce: nRanks must be at least 1 and eltBytes 1, 2, 4 or 8 (got " +
                std::to_string(nRanks) + ", " + std::to_string(eltBytes) + ")");
  const uint64_t n = uint64_t(nRanks), elt = eltBytes, total = count * elt, perRank = total / n;
  auto roundChunk = [&](uint64_t c) {
    c = (c + elt - 1) / elt * elt;
    return c >= 16 ? (c + 15) / 16 * 16 : c;
  };
  RingPlan p{};
  p.count = count;
  p.eltBytes = uint32_t(elt);
  p.nRanks = nRanks;
  p.depth = perRank < (32u << 10)   ? 1
            : perRank <= (1u << 20) ? 2
            : perRank <= (4u << 20) ? 4
            : perRank <= (8u << 20) ? 2
                                    : 1;
  p.numChunks = t.numChunks ? t.numChunks : uint64_t(p.depth) * n;
  uint64_t chunk = t.chunkBytes;
  if (chunk == 0) {
    chunk = std::clamp<uint64_t>(total / p.numChunks, 1, 16ull << 20);
    if (chunk * p.numChunks > t.maxBdpBytes) chunk = std::max<uint64_t>(1, t.maxBdpBytes / p.numChunks);
  }
  chunk = roundChunk(std::max(chunk, t.minShardBytes));
  uint32_t blocks = chunk < (16u << 10) ? 1 : chunk < (128u << 10) ? 1 : chunk < (512u << 10) ? 2 : 4;
  p.blockSize = chunk < (16u << 10) ? 384 : 512;
  // Wide (gin's change to the table): from wideMinBytes on, wideBlocks
  // blocks, each with one unit while the chunk stays in [wideMinChunkBytes,
  // wideChunkBytes]. One CTA moves ~30 GB/s through gin's lsa puts (2 H200s,
  // 2026-11-23), so the table's 2-4 blocks capped the ring at ~120 GB/s busBw;
  // 16 blocks reached 283-313 GB/s from 64 MiB, 16 blocks of 64-256 KiB
  // chunks beat 2-4 blocks of 512 KiB from 2 to 8 MiB, and 16 blocks of 16-32
  // KiB chunks took 512 KiB in 18.3 us and 1 MiB in 19.8 against the table's
  // 25.2 and 8 blocks of 64 KiB's 20.6 (2026-11-25).
  // An explicit chunk size or chunk count keeps the table's shape.
  if (t.chunkBytes == 0 && t.numChunks == 0 && t.wideBlocks > 0 && total >= t.wideMinBytes) {
    const uint64_t lo = std::max<uint64_t>(t.wideMinChunkBytes, 16);
    chunk = std::clamp<uint64_t>(total / (n * t.wideBlocks), lo, std::max(t.wideChunkBytes, lo));
    chunk = std::min<uint64_t>(chunk, std::max<uint64_t>(1, t.maxBdpBytes / p.numChunks));
    chunk = roundChunk(std::max(chunk, t.minShardBytes));
    blocks = t.wideBlocks;
    if (t.wideLargeBlocks > 0 && total >= t.wideLargeMinBytes) blocks = t.wideLargeBlocks;
    p.blockSize = 512;
  }
  if (t.maxBlocks) blocks = std::min(blocks, t.maxBlocks);
  if (t.blocks) blocks = t.blocks;
  if (t.blockSize) {
    if (t.blockSize > kRingMaxThreads || t.blockSize % 32 != 0)
      throw Error("planRingAllReduce: RingTuning::blockSize " + std::to_string(t.blockSize) +
                  " is not a multiple of 32 from 32 to " + std::to_string(kRingMaxThreads) +
                  " (the kernel's launch bounds)");
    p.blockSize = t.blockSize;
  }
  blocks = std::min(blocks, ws.maxBlocks);
  auto units = [&] { return (count + chunk / elt * n - 1) / (chunk / elt * n); };
  blocks = uint32_t(std::clamp<uint64_t>(units(), 1, blocks));
  p.regionBytes = ws.tmpBytes / blocks / 16 * 16;
  if (chunk * 2 > p.regionBytes) {
    chunk = p.regionBytes / 2 / 16 * 16;
    if (chunk < elt)
      throw Error("planRingAllReduce: the workspace's " + std::to_string(ws.tmpBytes) +
                  " temporary bytes cannot hold " + "two slots per block for " + std::to_string(blocks) +
                  " blocks; create it with more tmpBytes");
  }
  p.chunkBytes = chunk;
  p.slots = uint32_t(std::min<uint64_t>(kRingMaxSlots, p.regionBytes / chunk));
  p.nUnits = units();
  p.nBlocks = blocks;
  p.bidir = t.bidirAgMaxBytes < 0 ? 1 : (t.bidirAgMaxBytes > 0 && total <= uint64_t(t.bidirAgMaxBytes)) ? 1 : 0;
  // Small messages: the workspace's llBlocks blocks write LL16 packets to
  // every peer, each its share (8 payload bytes per packet; up to 512
  // threads per block, one packet each while they last).
  const uint64_t llMax = t.llMaxBytes == RingTuning::kLlAuto ? RingTuning::llAutoBytes(nRanks) : t.llMaxBytes;
  if (n > 1 && total > 0 && total <= std::min(llMax, ws.llMaxBytes)) {
    p.ll = 1;
    p.nBlocks = llBlocks(ws);
    const uint64_t packets = ((total + 7) / 8 + p.nBlocks - 1) / p.nBlocks;
    p.blockSize = t.blockSize ? t.blockSize : uint32_t(std::clamp<uint64_t>((packets + 31) / 32 * 32, 64, 512));
  } else if (const uint64_t shotMax =
                 t.shotMaxBytes == RingTuning::kAuto ? RingTuning::shotAutoBytes(nRanks) : t.shotMaxBytes;
             n > 1 && n <= uint64_t(kDirectMaxRanks) && total > 0 && total <= std::min(shotMax, ws.shotMaxBytes) &&
             shotSlotBytes(ws) % 16 == 0 && total <= kLlMaxBlocks * shotSlotBytes(ws)) {  // (hand-made windows)
    // One barrier: each rank's message stored at every peer, then summed there.
    p.shot = 1;
    const uint64_t least = (total + shotSlotBytes(ws) - 1) / shotSlotBytes(ws);  // every block's share fits its slot
    p.nBlocks = t.shotBlocks
                    ? std::min(t.shotBlocks, kLlMaxBlocks)
                    : uint32_t(std::clamp<uint64_t>(total / std::max<uint64_t>(t.shotBlockBytes, 1), 1, kLlMaxBlocks));
    p.nBlocks = uint32_t(std::max<uint64_t>(p.nBlocks, least));
    p.blockSize = t.blockSize ? t.blockSize : 512;
  } else if (n > 1 && n <= uint64_t(kDirectMaxRanks) && total > 0 && total <= t.directMaxBytes) {
    // Mid-size messages: two-shot over load/store, one barrier in and one out.
    p.direct = 1;
    p.nBlocks =
        t.directBlocks
            ? std::min(t.directBlocks, kLlMaxBlocks)
            : uint32_t(std::clamp<uint64_t>(total / std::max<uint64_t>(t.directBlockBytes, 1), 1, kLlMaxBlocks));
    p.blockSize = t.blockSize ? t.blockSize : 512;
  }
  return p;
}

namespace detail {
// LL16, one-shot and direct plans need every peer reached by lsa: refuse them elsewhere.
inline void checkLsaOnlyPlan(const Comm& comm, const RingPlan& plan, const char* call) {
  if ((plan.ll || plan.shot || plan.direct) && !lsaOnly(comm))
    throw Error(std::string(call) + ": the plan takes the " +
                (plan.ll     ? "LL16"
                 : plan.shot ? "one-shot"
                             : "two-shot direct") +
                " path, which needs every peer reached by lsa, but this communicator uses the proxy or ibgda; make "
                "the plan with planRingAllReduce(comm, ...) or set RingTuning::" +
                (plan.ll     ? "llMaxBytes"
                 : plan.shot ? "shotMaxBytes"
                             : "directMaxBytes") +
                " = 0");
}
}  // namespace detail

// The plan for this communicator with the environment's overrides applied to
// `base`; the LL path only when every peer is reached by lsa.
inline RingPlan planRingAllReduce(const Comm& comm, const RingWorkspace& ws, uint64_t count, size_t eltBytes,
                                  const RingTuning& base = {}) {
  RingTuning t = ringTuningFromEnv(base);
  if (!lsaOnly(comm)) t.llMaxBytes = t.shotMaxBytes = t.directMaxBytes = 0;
  return planRingAllReduce(comm.nRanks(), ws, count, eltBytes, t);
}

// One line: what the plan chose.
inline std::string describe(const RingPlan& p) {
  if (p.ll)
    return std::to_string(p.count) + " x " + std::to_string(p.eltBytes) + " B on " + std::to_string(p.nRanks) +
           " ranks: one-shot LL16 packets, " + std::to_string(p.nBlocks) + " x " + std::to_string(p.blockSize) +
           " threads";
  if (p.shot)
    return std::to_string(p.count) + " x " + std::to_string(p.eltBytes) + " B on " + std::to_string(p.nRanks) +
           " ranks: one-shot stores and one barrier, " + std::to_string(p.nBlocks) + " x " +
           std::to_string(p.blockSize) + " threads";
  if (p.direct)
    return std::to_string(p.count) + " x " + std::to_string(p.eltBytes) + " B on " + std::to_string(p.nRanks) +
           " ranks: two-shot direct loads and stores, " + std::to_string(p.nBlocks) + " x " +
           std::to_string(p.blockSize) + " threads";
  return std::to_string(p.count) + " x " + std::to_string(p.eltBytes) + " B on " + std::to_string(p.nRanks) +
         " ranks: depth " + std::to_string(p.depth) + ", " + std::to_string(p.numChunks) + " chunks of " +
         std::to_string(p.chunkBytes) + " B per partition, " + std::to_string(p.nUnits) + " units, " +
         std::to_string(p.nBlocks) + " x " + std::to_string(p.blockSize) + " threads, " + std::to_string(p.slots) +
         " slots per block, " + (p.bidir ? "bidirectional" : "one-way") + " AllGather";
}

// ---- running it ----

// CPU ranks: runs every block of the plan in this thread, one after another
// (blocks never wait on each other). Throws the device error if a wait gave up.
template <class T, class Op>
void runRingAllReduce(Comm& comm, const RingWorkspace& ws, const RingPlan& plan, Window sendWin, size_t sendOffset,
                      Window recvWin, size_t recvOffset, Op op = Op{}) {
  if (comm.onGpu()) throw Error("runRingAllReduce runs on CPU ranks; on a GPU use launchRingAllReduce (nvcc)");
  detail::checkLsaOnlyPlan(comm, plan, "runRingAllReduce");
  bool ok = true;
  for (uint32_t b = 0; b < plan.nBlocks; ++b)
    ok = ringAllReduceBlock<T, Op, true>(CoopThread{}, comm.devComm(), ws, plan, sendWin, sendOffset, recvWin,
                                         recvOffset, b, op) &&
         ok;
  comm.check();
  if (!ok) throw Error("ring AllReduce: a wait gave up without a device error record");
}

#if defined(__CUDACC__)
// One CTA per block of the plan. kBidir = false: the one-way variant (no
// reverse AllGather code, fewer registers). Paths: the plan paths compiled in
// (the launcher below gives each path its own kernel).
template <class T, class Op, bool kBidir, unsigned Backends, unsigned Paths = kPathAll>
__global__ void __launch_bounds__(kRingMaxThreads)
    ringAllReduceKernel(DevComm dc, RingWorkspace ws, RingPlan plan, Window sendWin, size_t sendOffset, Window recvWin,
                        size_t recvOffset) {
  (void)ringAllReduceBlock<T, Op, kBidir, Backends, Paths>(CoopBlock{}, dc, ws, plan, sendWin, sendOffset, recvWin,
                                                           recvOffset, blockIdx.x, Op{});
}

namespace detail {
// CUDA loads a kernel at its first launch (lazy loading, its default), and
// that load may wait for the device to go idle: if it happened while a peer's
// AllReduce kernel on the same GPU waits for ours, neither would finish. So
// the first call of each T/Op on a device loads all of its path kernels.
template <class T, class Op>
void loadRingKernels(int device) {
  static std::atomic<uint64_t> loaded{0};
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;
  if (bit != 0 && (loaded.load(std::memory_order_acquire) & bit) != 0) return;
  cudaFuncAttributes a{};
  for (const void* k : {(const void*)ringAllReduceKernel<T, Op, true, kBackendAll, kPathRing>,
                        (const void*)ringAllReduceKernel<T, Op, true, kBackendLsa, kPathLl>,
                        (const void*)ringAllReduceKernel<T, Op, true, kBackendLsa, kPathDirect>,
                        (const void*)ringAllReduceKernel<T, Op, true, kBackendLsa, kPathShot>,
                        (const void*)ringAllReduceKernel<T, Op, true, kBackendLsa, kPathRing>,
                        (const void*)ringAllReduceKernel<T, Op, false, kBackendLsa, kPathRing>})
    GIN_CUDA_CHECK(cudaFuncGetAttributes(&a, k));
  loaded.fetch_or(bit, std::memory_order_release);
}
}  // namespace detail

// Launch on `stream`; errors surface through comm.check()/synchronize().
// Lsa-only communicators get a kernel with the other transports compiled out.
// One rank: nothing to reduce, so an out-of-place call is one stream-ordered
// cudaMemcpyAsync (the copy engine or the runtime's copy kernel, at device
// bandwidth) instead of a plan whose blocks would copy (bad ranges are an
// Error here rather than a device error record).
template <class T, class Op>
void launchRingAllReduce(const Comm& comm, const RingWorkspace& ws, const RingPlan& plan, Window sendWin,
                         size_t sendOffset, Window recvWin, size_t recvOffset, cudaStream_t stream) {
  if (comm.nRanks() == 1) {
    const size_t bytes = size_t(plan.count) * sizeof(T);
    if (plan.eltBytes != sizeof(T))
      throw Error("launchRingAllReduce: the plan was made for " + std::to_string(plan.eltBytes) +
                  "-byte elements, the call reduces " + std::to_string(sizeof(T)) + "-byte ones");
    for (auto [w, off, what] : {std::tuple{sendWin, sendOffset, "send"}, std::tuple{recvWin, recvOffset, "recv"}})
      if (off > comm.windowBytes(w) || bytes > comm.windowBytes(w) - off)
        throw Error(std::string("launchRingAllReduce: the ") + what + " range [" + std::to_string(off) + ", " +
                    std::to_string(off + bytes) + ") runs past its window's " + std::to_string(comm.windowBytes(w)) +
                    " bytes");
    const void* in = comm.localPointer(sendWin, sendOffset);
    void* out = comm.localPointer(recvWin, recvOffset);
    if (in != out && bytes) GIN_CUDA_CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, stream));
    (void)ws;
    return;
  }
  detail::checkLsaOnlyPlan(comm, plan, "launchRingAllReduce");
  detail::loadRingKernels<T, Op>(comm.cudaDevice());
  const DevComm& dc = comm.devComm();
  const dim3 grid(plan.nBlocks), block(plan.blockSize);
  // A kernel per path, each compiled and allocated registers alone: one
  // kernel holding every path spilled (636 bytes per thread) and its one-shot
  // calls were 5-6% slower on 4 H200s. Beside the proxy or ibgda only the
  // ring runs (detail::checkLsaOnlyPlan), with every transport compiled in.
  const auto launch = [&](auto kernel) {
    kernel<<<grid, block, 0, stream>>>(dc, ws, plan, sendWin, sendOffset, recvWin, recvOffset);
  };
  if (!lsaOnly(comm))
    launch(ringAllReduceKernel<T, Op, true, kBackendAll, kPathRing>);
  else if (plan.ll)
    launch(ringAllReduceKernel<T, Op, true, kBackendLsa, kPathLl>);
  else if (plan.direct)
    launch(ringAllReduceKernel<T, Op, true, kBackendLsa, kPathDirect>);
  else if (plan.shot)
    launch(ringAllReduceKernel<T, Op, true, kBackendLsa, kPathShot>);
  else if (plan.bidir)
    launch(ringAllReduceKernel<T, Op, true, kBackendLsa, kPathRing>);
  else
    launch(ringAllReduceKernel<T, Op, false, kBackendLsa, kPathRing>);
  GIN_CUDA_CHECK(cudaGetLastError());
}
#endif

}  // namespace gin::coll
