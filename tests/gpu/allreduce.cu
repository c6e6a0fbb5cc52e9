// GPU suite: the ring AllReduce (gin/device/allreduce.hpp) on 1..8 GPUs driven
// by one process (one thread and one Comm per GPU): float, half, bfloat16,
// double, int32 and int64 with sum, prod, min and max; counts 0, 1, primes and
// 1 Mi + 3; in place and out of place; the auto plan, tiny chunks with
// several blocks (the slots wrap many times), the one-way kernel variant, and
// the two-shot direct path on 5 blocks for every count, the one-shot path on
// 3 blocks or more ("auto" takes LL16, then one-shot, then direct, over lsa);
// one-shot calls queued back to back with direct and ring calls between;
// LL16, one-shot, direct and ring calls back to back with 2-8 ranks sharing
// the GPUs (the progress rule: lsa flags set by a kernel on the same GPU);
// poisoned guards; results against the host reference
// (tests/common/allreduce_ref.hpp) and bitwise identical on every rank.
// Registered again with GIN_TRANSPORT=proxy. Skips (exit 77) without a GPU.
// The cases are in allreduce_cases.cuh, their kernels compiled in three units
// (allreduce_types_{a,b,c}.cu, two element types each).
#include <catch2/catch_session.hpp>
#include <catch2/catch_test_macros.hpp>

#include "allreduce_cases.cuh"
#include "shared_cases.cuh"

using namespace gin;
using namespace gintest::arref;
using gputest::expect;
using gputest::ar::allOps;
using gputest::ar::Bufs;

namespace {

std::vector<int> rankCounts() {
  std::vector<int> v;
  for (int n : {1, 2, 3, 4, 8})
    if (n <= gputest::gpuCount() && n <= gputest::maxRanks()) v.push_back(n);
  return v;
}

void run(int n, const std::vector<size_t>& counts, uint64_t tmpBytes, uint32_t llBlocks = 1) {
  size_t maxCount = 0;
  for (size_t c : counts) maxCount = std::max(maxCount, c);
  std::vector<std::vector<uint8_t>> results(static_cast<size_t>(n), std::vector<uint8_t>{});
  CommConfig cfg = gputest::gpuConfig();
  gputest::runRanksOnStreams(
      n,
      [&](Comm& comm, cudaStream_t st) {
        coll::RingWorkspaceConfig wc;
        wc.tmpBytes = tmpBytes;
        wc.maxBlocks = 4;
        wc.signalBase = 8;
        wc.llBlocks = llBlocks;      // the "auto" tuning's LL16 calls (lsa, up to 1 MiB / n)
        wc.shotMaxBytes = 64 << 10;  // one-shot slots of 2 KiB
        const coll::RingWorkspace ws = coll::createRingWorkspace(comm, wc);
        Bufs b;
        b.bytes = kHead + maxCount * 8 + kTail;
        b.send = comm.allocWindow(b.bytes);
        b.recv = comm.allocWindow(b.bytes);
        coll::RingTuning tiny;
        tiny.chunkBytes = 48;  // rounded to 48: 16-byte vectors, pieces that wrap the slots many times
        tiny.blocks = 3;
        tiny.bidirAgMaxBytes = -1;
        tiny.llMaxBytes = 0;      // the ring for small counts too ("auto" takes LL16 up to 1 MiB / n over lsa,
        tiny.directMaxBytes = 0;  // then the two-shot direct path)
        coll::RingTuning oneWay;
        oneWay.chunkBytes = 4096;
        oneWay.blocks = 2;
        oneWay.bidirAgMaxBytes = 0;
        oneWay.llMaxBytes = 0;
        oneWay.directMaxBytes = 0;
        tiny.shotMaxBytes = 0;
        oneWay.shotMaxBytes = 0;
        coll::RingTuning direct;  // over lsa every count two-shot direct (with the proxy forced: the ring)
        direct.llMaxBytes = 0;
        direct.shotMaxBytes = 0;
        direct.directBlocks = 5;
        coll::RingTuning shot;  // over lsa one-shot up to the workspace's 64 KiB, then direct
        shot.llMaxBytes = 0;
        shot.shotMaxBytes = 1 << 20;  // any rank count (auto: 2 ranks only)
        shot.shotBlocks = 3;          // more where the slots need them (4099 doubles: 17)
        const struct {
          const char* name;
          coll::RingTuning t;
        } tunings[] = {{"auto", {}},
                       {"48 B chunks, 3 blocks, bidirectional", tiny},
                       {"4 KiB chunks, 2 blocks, one-way kernel", oneWay},
                       {"two-shot direct, 5 blocks", direct},
                       {"one-shot, 3 blocks", shot}};
        for (const auto& tu : tunings) {
          const bool all = tu.t.chunkBytes == 0;  // auto and direct: quick enough for the largest count
          const std::vector<size_t> small(counts.begin(), counts.end() - (all ? 0 : 1));
          allOps<float>(comm, st, ws, b, small, tu.t, false, results, std::string("float ") + tu.name);
          allOps<coll::Half>(comm, st, ws, b, small, tu.t, true, results, std::string("half ") + tu.name);
          allOps<coll::BFloat16>(comm, st, ws, b, small, tu.t, false, results, std::string("bfloat16 ") + tu.name);
          allOps<double>(comm, st, ws, b, small, tu.t, true, results, std::string("double ") + tu.name);
          allOps<int32_t>(comm, st, ws, b, small, tu.t, false, results, std::string("int32 ") + tu.name);
          allOps<int64_t>(comm, st, ws, b, small, tu.t, true, results, std::string("int64 ") + tu.name);
        }
        comm.bootstrap().barrier();
        comm.deregisterWindow(b.send);
        comm.deregisterWindow(b.recv);
        coll::destroyRingWorkspace(comm, ws);
      },
      cfg);
}

}  // namespace

TEST_CASE("GPU ring AllReduce: every type and op, counts 0, 1, 97, 4099, 1 Mi + 3, three tunings", "[gpu][allreduce]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    // The last count (1 Mi + 3) only with the auto plan: tiny chunks would take minutes.
    REQUIRE_NOTHROW(run(n, {0, 1, 97, 4099, (1u << 20) + 3}, 8u << 20));
  }
}

TEST_CASE("GPU ring AllReduce: a small workspace (many units, 2 slots per block)", "[gpu][allreduce]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    REQUIRE_NOTHROW(run(n, {5, 65537, 300001}, 64u << 10));
  }
}

TEST_CASE("GPU LL AllReduce with 4 blocks: counts from 1 to the 64 KiB LL limit", "[gpu][allreduce][ll]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    REQUIRE_NOTHROW(run(n, {1, 3, 97, 4099, 8191}, 8u << 20, 4));
  }
}

TEST_CASE("GPU LL AllReduce with 32 blocks (the default): counts around the 512 KiB LL limit of 2 ranks",
          "[gpu][allreduce][ll]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    REQUIRE_NOTHROW(run(n, {1, 3, 97, 4099, 65537, 131071}, 8u << 20, 32));
  }
}

TEST_CASE("GPU one-shot AllReduce: 40 calls queued back to back, block counts changing, direct calls between",
          "[gpu][allreduce][shot]") {
  if (const char* t = std::getenv("GIN_TRANSPORT"); t && std::string(t) != "lsa") SKIP("one-shot runs over lsa only");
  for (int n : rankCounts()) {
    if (n == 1) continue;
    CAPTURE(n);
    std::vector<std::vector<uint8_t>> results(static_cast<size_t>(n), std::vector<uint8_t>{});
    REQUIRE_NOTHROW(gputest::runRanksOnStreams(
        n,
        [&](Comm& comm, cudaStream_t st) {
          coll::RingWorkspaceConfig wc;
          wc.llMaxBytes = 0;
          wc.shotMaxBytes = 256 << 10;  // slots of 8 KiB: 60000 floats need 30 blocks
          const coll::RingWorkspace ws = coll::createRingWorkspace(comm, wc);
          const int shots = gputest::ar::backToBack(
                                comm, st, ws, 60000, 40,
                                [](int k) {
                                  coll::RingTuning t;
                                  t.shotBlocks = uint32_t(1 + k % 9);  // the slots raise it for the larger counts
                                  t.shotMaxBytes =
                                      k % 4 == 3 ? 0 : 1 << 20;  // else two-shot direct on the same call counts
                                  if (k % 10 == 9) t.directMaxBytes = 0, t.shotMaxBytes = 0;  // and the ring
                                  t.directBlocks = uint32_t(1 + k % 7);
                                  return t;
                                },
                                results)
                                .shot;
          expect(shots == 28, "one-shot calls: " + std::to_string(shots));
          comm.bootstrap().barrier();
          coll::destroyRingWorkspace(comm, ws);
        },
        gputest::gpuConfig()));
  }
}

// The progress rule with ranks sharing a GPU (round-robin, one process, one
// stream each): every lsa path spins on flags that another rank's kernel on
// the same GPU sets, so those kernels must run side by side. 40 calls queued
// with no sync, cycling LL16, one-shot, two-shot direct and the ring.
TEST_CASE("GPU AllReduce with ranks sharing GPUs: LL16, one-shot, direct and ring calls back to back",
          "[gpu][allreduce][shared]") {
  if (const char* t = std::getenv("GIN_TRANSPORT"); t && std::string(t) != "lsa")
    SKIP("LL16, one-shot and direct run over lsa only");
  const std::vector<int> counts = gputest::sharingRankCountsOrSkip();
  for (int n : counts) {
    CAPTURE(n);
    std::vector<std::vector<uint8_t>> results(static_cast<size_t>(n), std::vector<uint8_t>{});
    REQUIRE_NOTHROW(gputest::runRanksOnStreams(
        n,
        [&](Comm& comm, cudaStream_t st) {
          coll::RingWorkspaceConfig wc;
          wc.llMaxBytes = 64 << 10;
          wc.llBlocks = 4;
          wc.shotMaxBytes = 256 << 10;
          wc.maxBlocks = 4;
          const coll::RingWorkspace ws = coll::createRingWorkspace(comm, wc);
          const gputest::ar::PathCounts p = gputest::ar::backToBack(
              comm, st, ws, 60000, 40,
              [](int k) {
                coll::RingTuning t;  // k % 4: LL16 (where the count fits 64 KiB), one-shot, direct, ring
                t.llMaxBytes = k % 4 == 0 ? 1 << 20 : 0;
                t.shotMaxBytes = k % 4 <= 1 ? 1 << 20 : 0;
                t.directMaxBytes = k % 4 <= 2 ? uint64_t(1) << 30 : 0;
                t.shotBlocks = uint32_t(1 + k % 5);
                t.directBlocks = uint32_t(1 + k % 3);
                t.blocks = uint32_t(1 + k % 4);
                return t;
              },
              results);
          expect(p.ll > 0 && p.shot > 0 && p.direct > 0 && p.ring > 0,
                 "paths taken: LL16 " + std::to_string(p.ll) + ", one-shot " + std::to_string(p.shot) + ", direct " +
                     std::to_string(p.direct) + ", ring " + std::to_string(p.ring));
          comm.bootstrap().barrier();
          coll::destroyRingWorkspace(comm, ws);
        },
        gputest::gpuConfig()));
  }
}

int main(int argc, char** argv) {
  if (gputest::gpuCount() == 0) return gputest::skipNoGpu("GPU ring AllReduce suite");
  std::printf("GPU ring AllReduce suite: %d GPU(s) visible, rank counts tested:", gputest::gpuCount());
  for (int n : rankCounts()) std::printf(" %d", n);
  std::printf("\n");
  return Catch::Session().run(argc, argv);
}
