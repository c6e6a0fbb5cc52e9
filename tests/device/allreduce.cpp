// Tests of the ring AllReduce (gin/device/allreduce.hpp, gin/host/allreduce.hpp)
// on CPU ranks: float, half, bfloat16, double, int32 and int64 with sum, prod,
// min and max; counts 0, 1, primes and sizes that are multiples of nothing;
// 1..8 ranks; in place and out of place; tiny chunks so the pipeline wraps
// its slots many times, several blocks, the one-way and the bidirectional
// AllGather; results against a host reference with a tolerance per type,
// bitwise identical on every rank, poison around the buffers intact. The
// auto-tuning table and the environment overrides (good and bad values) too.
// Over lsa the "auto" tuning takes the one-shot LL16 path for the small
// counts (the other tunings keep the ring); LL calls back to back without
// barriers check its flags and buffer halves.
// Registered twice: as is (lsa) and with GIN_TRANSPORT=proxy. The p2p
// baseline (examples/allreduce/ring_allreduce.hpp) keeps one small test.
#include <algorithm>
#include <atomic>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>

#include "../../examples/allreduce/ring_allreduce.hpp"
#include "../common/allreduce_ref.hpp"
#include "../common/ranks.hpp"

using namespace gin;
using gintest::expect;
using gintest::runRanks;
using namespace gintest::arref;

namespace {

struct Bufs {
  Window send, recv;
  size_t bytes;  // each window
};

// One AllReduce on every rank (in place when `inPlace`), checked.
template <class T, class Op>
void oneCase(Comm& comm, const coll::RingWorkspace& ws, const Bufs& b, size_t count, const coll::RingTuning& tune,
             bool inPlace, uint64_t seed, std::vector<std::vector<uint8_t>>& results, const std::string& what) {
  const int me = comm.rank();
  auto* sb = static_cast<uint8_t*>(comm.localPointer(b.send));
  auto* rb = static_cast<uint8_t*>(comm.localPointer(b.recv));
  std::memset(sb, kPoison, b.bytes);
  std::memset(rb, kPoison, b.bytes);
  T* in = reinterpret_cast<T*>(sb + kHead);
  for (size_t i = 0; i < count; ++i) in[i] = input<T, Op>(seed, me, i);
  const Window rw = inPlace ? b.send : b.recv;
  const coll::RingPlan plan = coll::planRingAllReduce(comm, ws, count, sizeof(T), tune);  // LL only over lsa
  comm.bootstrap().barrier();
  coll::runRingAllReduce<T, Op>(comm, ws, plan, b.send, kHead, rw, kHead);
  uint8_t* ob = inPlace ? sb : rb;
  const T* out = reinterpret_cast<const T*>(ob + kHead);
  bool poison = true;
  for (size_t i = 0; i < kHead; ++i) poison &= ob[i] == kPoison;
  for (size_t i = kHead + count * sizeof(T); i < b.bytes; ++i) poison &= ob[i] == kPoison;
  expect(poison, what + ": wrote outside the output (" + coll::describe(plan) + ")");
  if (!inPlace) {
    bool same = true;  // the input is not modified out of place
    for (size_t i = 0; i < count; ++i) {
      const T ref = input<T, Op>(seed, me, i);
      same &= std::memcmp(&in[i], &ref, sizeof(T)) == 0;
    }
    expect(same, what + ": the input changed (out of place)");
  }
  check<T, Op>(out, comm.nRanks(), count, seed, what + " (" + coll::describe(plan) + ")");
  results[size_t(me)].assign(ob + kHead, ob + kHead + count * sizeof(T));
  comm.bootstrap().barrier();
  for (int r = 0; r < comm.nRanks(); ++r)
    expect(results[size_t(r)] == results[size_t(me)],
           what + ": ranks " + std::to_string(r) + " and " + std::to_string(me) + " disagree bitwise");
  comm.bootstrap().barrier();
}

template <class T>
void allOps(Comm& comm, const coll::RingWorkspace& ws, const Bufs& b, const std::vector<size_t>& counts,
            const coll::RingTuning& tune, bool inPlace, std::vector<std::vector<uint8_t>>& results, const char* type,
            const std::string& how) {
  for (size_t count : counts) {
    const std::string at = std::string(type) + " count " + std::to_string(count) + " n " +
                           std::to_string(comm.nRanks()) + (inPlace ? " in place " : " ") + how;
    oneCase<T, coll::Sum>(comm, ws, b, count, tune, inPlace, count * 4 + 1, results, "sum " + at);
    oneCase<T, coll::Prod>(comm, ws, b, count, tune, inPlace, count * 4 + 2, results, "prod " + at);
    oneCase<T, coll::Min>(comm, ws, b, count, tune, inPlace, count * 4 + 3, results, "min " + at);
    oneCase<T, coll::Max>(comm, ws, b, count, tune, inPlace, count * 4 + 4, results, "max " + at);
  }
}

// Tunings that exercise the pipeline: tiny chunks (slots wrap many times),
// several blocks, bidirectional and one-way AllGather.
struct Tuned {
  const char* name;
  coll::RingTuning t;
};
// `tinyBytes`: the smallest chunk (16 B wraps the slots most often; larger
// ones keep big counts quick, notably through the proxy's descriptor round trips).
std::vector<Tuned> tunings(uint64_t tinyBytes = 16) {
  std::vector<Tuned> v;
  v.push_back({"auto", {}});
  coll::RingTuning a;
  a.llMaxBytes = 0;      // the ring for small counts too ("auto" takes LL16 up to 1 MiB / n over lsa,
  a.directMaxBytes = 0;  // then one-shot, then the two-shot direct path)
  a.shotMaxBytes = 0;
  a.chunkBytes = tinyBytes;
  a.blocks = 3;
  a.bidirAgMaxBytes = -1;
  v.push_back({"tiny chunks, 3 blocks, bidirectional", a});
  coll::RingTuning b;
  b.llMaxBytes = 0;
  b.shotMaxBytes = 0;
  b.directMaxBytes = 0;
  b.chunkBytes = 56;  // not a multiple of 16: rounded up to 64
  b.blocks = 2;
  b.bidirAgMaxBytes = 0;
  v.push_back({"56 B chunks, 2 blocks, one-way", b});
  coll::RingTuning d;
  d.llMaxBytes = 0;  // over lsa: every count two-shot direct (through the proxy: the ring)
  d.shotMaxBytes = 0;
  d.directBlocks = 3;
  v.push_back({"two-shot direct, 3 blocks", d});
  coll::RingTuning o;
  o.llMaxBytes = 0;  // over lsa: one-shot up to the workspace's slots, then direct (through the proxy: the ring)
  o.shotMaxBytes = 1 << 20;  // any rank count (auto: 2 ranks only)
  o.shotBlocks = 3;          // more where the slots need them
  v.push_back({"one-shot, 3 blocks", o});
  return v;
}

// `calls` float-sum AllReduces on every rank, back to back with no barrier
// between them (the path's own flags must keep calls apart): sizes change
// every call (1 element to maxCount), every fifth call is in place; every
// rank checks every result and the guard past the output. `tuning(call)` is
// the call's tuning; `tookPath` says whether a plan is the path under test.
void backToBack(Comm& comm, const coll::RingWorkspaceConfig& wc, size_t maxCount, int calls,
                const std::function<coll::RingTuning(int)>& tuning,
                const std::function<bool(const coll::RingPlan&)>& tookPath, const std::string& what) {
  const coll::RingWorkspace ws = coll::createRingWorkspace(comm, wc);
  Window send = comm.allocWindow(maxCount * 4 + 64), recv = comm.allocWindow(maxCount * 4 + 64);
  float* in = static_cast<float*>(comm.localPointer(send));
  float* out = static_cast<float*>(comm.localPointer(recv));
  for (int call = 0; call < calls; ++call) {
    const size_t count = call % 7 == 6 ? maxCount : size_t(1 + (call * 389) % maxCount);
    const bool inPlace = call % 5 == 4;
    for (size_t i = 0; i < count; ++i) in[i] = input<float, coll::Sum>(uint64_t(call), comm.rank(), i);
    out[count] = -7.0f;  // guard
    const coll::RingPlan plan = coll::planRingAllReduce(comm, ws, count, 4, tuning(call));
    const std::string at = what + " call " + std::to_string(call);
    expect(tookPath(plan), at + " did not take the path under test: " + coll::describe(plan));
    coll::runRingAllReduce<float, coll::Sum>(comm, ws, plan, send, 0, inPlace ? send : recv, 0);
    check<float, coll::Sum>(inPlace ? in : out, comm.nRanks(), count, uint64_t(call), at);
    expect(out[count] == -7.0f, at + " wrote past the output");
  }
  comm.check();
  comm.bootstrap().barrier();
  comm.deregisterWindow(send);
  comm.deregisterWindow(recv);
  coll::destroyRingWorkspace(comm, ws);
}

// The direct and one-shot back-to-back cases: 2 to 8 ranks, each with the
// block count `blocks` its body uses, on a workspace without LL slots and
// with `shotMaxBytes` of one-shot slots.
void overRanksAndBlocks(uint64_t shotMaxBytes,
                        const std::function<void(Comm&, const coll::RingWorkspaceConfig&, int)>& body) {
  for (auto [n, blocks] : {std::pair{2, 1}, std::pair{3, 2}, std::pair{4, 5}, std::pair{5, 32}, std::pair{8, 3}}) {
    CAPTURE(n, blocks);
    coll::RingWorkspaceConfig wc;
    wc.tmpBytes = 4096;
    wc.maxBlocks = 2;
    wc.llMaxBytes = 0;
    wc.shotMaxBytes = shotMaxBytes;
    REQUIRE_NOTHROW(runRanks(n, [&](Comm& comm) { body(comm, wc, blocks); }));
  }
}

void allTypes(int n, const std::vector<size_t>& counts, CommConfig cfg, bool everyType = true,
              uint64_t tinyBytes = 16) {
  size_t maxCount = 0;
  for (size_t c : counts) maxCount = std::max(maxCount, c);
  std::vector<std::vector<uint8_t>> results(size_t(n), std::vector<uint8_t>{});
  REQUIRE_NOTHROW(runRanks(
      n,
      [&](Comm& comm) {
        coll::RingWorkspaceConfig wc;
        wc.tmpBytes = 4096;  // small: large counts take many units and the slots wrap
        wc.maxBlocks = 4;
        wc.signalBase = 8;
        wc.shotMaxBytes = 8192;  // one-shot slots of 256 B: 1001 floats need 16 blocks, 1001 doubles 32
        const coll::RingWorkspace ws = coll::createRingWorkspace(comm, wc);
        Bufs b;
        b.bytes = kHead + maxCount * 8 + kTail;
        b.send = comm.allocWindow(b.bytes);
        b.recv = comm.allocWindow(b.bytes);
        for (const Tuned& tu : tunings(tinyBytes)) {
          allOps<float>(comm, ws, b, counts, tu.t, false, results, "float", tu.name);
          allOps<int32_t>(comm, ws, b, counts, tu.t, true, results, "int32", tu.name);
          if (!everyType) continue;
          allOps<coll::Half>(comm, ws, b, counts, tu.t, false, results, "half", tu.name);
          allOps<coll::BFloat16>(comm, ws, b, counts, tu.t, true, results, "bfloat16", tu.name);
          allOps<double>(comm, ws, b, counts, tu.t, true, results, "double", tu.name);
          allOps<int64_t>(comm, ws, b, counts, tu.t, false, results, "int64", tu.name);
        }
        comm.check();
        comm.bootstrap().barrier();
        comm.deregisterWindow(b.send);
        comm.deregisterWindow(b.recv);
        coll::destroyRingWorkspace(comm, ws);
      },
      cfg));
}

}  // namespace

TEST_CASE("ring AllReduce: every type and op, counts 0, 1, primes, 1..8 ranks, three tunings", "[allreduce]") {
  const std::vector<size_t> counts = {0, 1, 2, 7, 13, 97, 1001};
  for (int n : {1, 2, 3, 4, 5, 8}) {
    CAPTURE(n);
    allTypes(n, counts, gintest::cpuConfig());
  }
  for (int n : {6, 7}) {
    CAPTURE(n);
    allTypes(n, {0, 1, 5, 331}, gintest::cpuConfig(), false);
  }
}

TEST_CASE("ring AllReduce: 40961 elements on 4 ranks (many units through a 4 KiB workspace)", "[allreduce]") {
  allTypes(4, {40961}, gintest::cpuConfig(), false, 512);
}

TEST_CASE("ring AllReduce: the Hopper auto-tuning table", "[allreduce][plan]") {
  coll::RingWorkspace ws{};
  ws.tmpBytes = 32ull << 20;
  ws.maxBlocks = 16;
  coll::RingTuning t{};
  t.wideBlocks = 0;      // the table as written
  t.directMaxBytes = 0;  // (mid sizes would take the two-shot direct path)
  auto plan = [&](int n, uint64_t bytes) { return coll::planRingAllReduce(n, ws, bytes / 4, 4, t); };
  // 4 KiB on 8 ranks: 512 B per rank -> depth 1, 8 chunks of 512 B, 1 x 384, bidirectional.
  coll::RingPlan p = plan(8, 4 << 10);
  CHECK(p.depth == 1);
  CHECK(p.numChunks == 8);
  CHECK(p.chunkBytes == 512);
  CHECK((p.nBlocks == 1 && p.blockSize == 384));
  CHECK(p.bidir == 1);
  CHECK(p.nUnits == 1);
  // 2 MiB on 8 ranks: 256 KiB per rank -> depth 2, 16 chunks of 128 KiB, 2 x 512.
  p = plan(8, 2 << 20);
  CHECK(p.depth == 2);
  CHECK(p.numChunks == 16);
  CHECK(p.chunkBytes == (128 << 10));
  CHECK((p.nBlocks == 2 && p.blockSize == 512));
  // 16 MiB on 8 ranks: 2 MiB per rank -> depth 4, 32 chunks of 512 KiB, 4 x 512, one-way (> 4 MiB).
  p = plan(8, 16 << 20);
  CHECK(p.depth == 4);
  CHECK(p.chunkBytes == (512 << 10));
  CHECK((p.nBlocks == 4 && p.blockSize == 512));
  CHECK(p.bidir == 0);
  // 48 MiB on 8 ranks: 6 MiB per rank -> depth 2; 16 chunks of 3 MiB > BDP 32 MiB -> 2 MiB.
  p = plan(8, 48 << 20);
  CHECK(p.depth == 2);
  CHECK(p.chunkBytes == (2 << 20));
  // 1 GiB on 8 ranks: depth 1, 8 chunks of 16 MiB > BDP -> 4 MiB; 4 blocks of an 8 MiB region: 2 slots.
  p = plan(8, 1ull << 30);
  CHECK(p.depth == 1);
  CHECK(p.chunkBytes == (4 << 20));
  CHECK((p.nBlocks == 4 && p.slots == 2));
  CHECK(p.nUnits == (1ull << 30) / (32ull << 20));
  // 64 KiB on 2 ranks: 32 KiB per rank -> depth 2, 4 chunks of 16 KiB: 1 x 512.
  p = plan(2, 64 << 10);
  CHECK(p.depth == 2);
  CHECK(p.chunkBytes == (16 << 10));
  CHECK((p.nBlocks == 1 && p.blockSize == 512));
  // Tiny: the minimum shard size (16 B).
  p = plan(8, 32);
  CHECK(p.chunkBytes == 16);
  // gin's default from 512 KiB: 16 blocks, chunk = bytes / (n x 16) in [16 KiB, 512 KiB].
  t = coll::RingTuning{};
  t.directMaxBytes = 0;
  p = plan(2, 1ull << 30);
  CHECK((p.nBlocks == 16 && p.chunkBytes == (512 << 10) && p.slots == 4));
  p = plan(8, 48 << 20);
  CHECK((p.nBlocks == 16 && p.chunkBytes == (384 << 10)));  // 16 units of 8 x 384 KiB
  p = plan(2, 2 << 20);
  CHECK((p.nBlocks == 16 && p.chunkBytes == (64 << 10)));
  p = plan(2, 1 << 20);
  CHECK((p.nBlocks == 16 && p.chunkBytes == (32 << 10)));
  p = plan(2, 512 << 10);
  CHECK((p.nBlocks == 16 && p.chunkBytes == (16 << 10)));
  p = plan(8, 1 << 20);  // 16 KiB chunks at least: 8 units, 8 blocks
  CHECK((p.nBlocks == 8 && p.chunkBytes == (16 << 10)));
  p = plan(2, 256 << 10);  // below 512 KiB: the table
  CHECK((p.nBlocks == 1 && p.chunkBytes == (64 << 10)));
  ws.maxBlocks = 32;  // from 64 MiB: 32 blocks of the wide chunk, when the workspace and the units allow
  CHECK((plan(2, 1ull << 30).nBlocks == 32 && plan(2, 1ull << 30).chunkBytes == (512 << 10)));
  CHECK((plan(4, 64 << 20).nBlocks == 32 && plan(4, 64 << 20).chunkBytes == (512 << 10)));
  CHECK(plan(8, 64 << 20).nBlocks == 16);           // 16 units of 8 x 512 KiB
  CHECK(plan(4, (64 << 20) - 1024).nBlocks == 16);  // below 64 MiB: 16
  ws.maxBlocks = 16;
  t.blocks = 6;
  CHECK(plan(2, 1ull << 30).nBlocks == 6);  // an exact block count still wins
}

TEST_CASE("ring AllReduce: environment overrides", "[allreduce][env]") {
  coll::RingWorkspace ws{};
  ws.tmpBytes = 32ull << 20;
  ws.maxBlocks = 16;
  {
    gintest::EnvVar a("GIN_ALLREDUCE_RING_CHUNK_SIZE", "64K"), b("GIN_ALLREDUCE_RING_MAX_BLOCKS", "1"),
        c("GIN_ALLREDUCE_RING_BLOCK_SIZE", "256"), d("GIN_ALLREDUCE_RING_BIDIR_AG_MAX_SIZE", "-1");
    const coll::RingPlan p = coll::planRingAllReduce(8, ws, 64 << 20, 4, coll::ringTuningFromEnv());
    CHECK(p.chunkBytes == (64 << 10));
    CHECK(p.nBlocks == 1);
    CHECK(p.blockSize == 256);
    CHECK(p.bidir == 1);
  }
  {
    gintest::EnvVar a("GIN_ALLREDUCE_RING_NUM_CHUNKS", "4"), b("GIN_ALLREDUCE_RING_MAX_BDP", "1M"),
        c("GIN_ALLREDUCE_RING_BIDIR_AG_MAX_SIZE", "0"), d("GIN_ALLREDUCE_RING_NUM_BLOCKS", "12");
    const coll::RingPlan p = coll::planRingAllReduce(8, ws, 64 << 20, 4, coll::ringTuningFromEnv());
    CHECK(p.nBlocks == 12);
    CHECK(p.numChunks == 4);
    CHECK(p.chunkBytes == (256 << 10));
    CHECK(p.bidir == 0);
  }
  {
    gintest::EnvVar a("GIN_ALLREDUCE_RING_MIN_SHARD_SIZE", "1K"), b("GIN_ALLREDUCE_RING_BIDIR_AG_MAX_SIZE", "1K");
    const coll::RingPlan p = coll::planRingAllReduce(8, ws, 64, 4, coll::ringTuningFromEnv());
    CHECK(p.chunkBytes == 1024);
    CHECK(p.bidir == 1);
    CHECK(coll::planRingAllReduce(8, ws, 4096, 4, coll::ringTuningFromEnv()).bidir == 0);
  }
}

TEST_CASE("ring AllReduce: bad environment values are errors that say what is allowed", "[allreduce][env]") {
  const struct {
    const char *name, *value;
  } bad[] = {
      {"GIN_ALLREDUCE_RING_CHUNK_SIZE", "0"},        {"GIN_ALLREDUCE_RING_CHUNK_SIZE", "abc"},
      {"GIN_ALLREDUCE_RING_CHUNK_SIZE", "32M"},      {"GIN_ALLREDUCE_RING_NUM_CHUNKS", "-3"},
      {"GIN_ALLREDUCE_RING_NUM_CHUNKS", "1.5"},      {"GIN_ALLREDUCE_RING_MAX_BDP", "8"},
      {"GIN_ALLREDUCE_RING_MIN_SHARD_SIZE", "0"},    {"GIN_ALLREDUCE_RING_BIDIR_AG_MAX_SIZE", "-2"},
      {"GIN_ALLREDUCE_RING_BIDIR_AG_MAX_SIZE", "x"}, {"GIN_ALLREDUCE_RING_MAX_BLOCKS", "0"},
      {"GIN_ALLREDUCE_RING_MAX_BLOCKS", "4Q"},       {"GIN_ALLREDUCE_RING_BLOCK_SIZE", "100"},
      {"GIN_ALLREDUCE_RING_BLOCK_SIZE", "2048"},     {"GIN_ALLREDUCE_RING_NUM_BLOCKS", "0"},
  };
  for (const auto& b : bad) {
    CAPTURE(b.name, b.value);
    gintest::EnvVar e(b.name, b.value);
    try {
      (void)coll::ringTuningFromEnv();
      FAIL("no error for " << b.name << "=" << b.value);
    } catch (const gin::Error& err) {
      const std::string msg = err.what();
      CHECK_THAT(msg, Catch::Matchers::ContainsSubstring(std::string(b.name) + "=\"" + b.value + "\""));
      CHECK_THAT(msg, Catch::Matchers::ContainsSubstring("expected"));
    }
  }
  // The LL block count belongs to the workspace: createRingWorkspace reads it.
  for (const char* v : {"0", "33", "two"}) {
    CAPTURE(v);
    gintest::EnvVar e("GIN_ALLREDUCE_LL_BLOCKS", v);
    CHECK_THROWS_WITH(runRanks(1, [](Comm& comm) { (void)coll::createRingWorkspace(comm); }),
                      Catch::Matchers::ContainsSubstring(std::string("GIN_ALLREDUCE_LL_BLOCKS=\"") + v + "\"") &&
                          Catch::Matchers::ContainsSubstring("from 1 to 32"));
  }
  {
    gintest::EnvVar e("GIN_ALLREDUCE_LL_BLOCKS", "5");
    CHECK_NOTHROW(runRanks(1, [](Comm& comm) {
      const coll::RingWorkspace ws = coll::createRingWorkspace(comm);
      expect(ws.llBlocks == 5, "GIN_ALLREDUCE_LL_BLOCKS=5 gave " + std::to_string(ws.llBlocks));
      coll::destroyRingWorkspace(comm, ws);
    }));
  }
  coll::RingWorkspaceConfig tooMany;
  tooMany.llBlocks = 33;
  CHECK_THROWS_WITH(runRanks(1, [&](Comm& comm) { (void)coll::createRingWorkspace(comm, tooMany); }),
                    Catch::Matchers::ContainsSubstring("llBlocks must be from 1 to 32"));
}

TEST_CASE("ring AllReduce: called again and again with changing plans on one workspace", "[allreduce]") {
  std::vector<std::vector<uint8_t>> results(3, std::vector<uint8_t>{});
  REQUIRE_NOTHROW(runRanks(3, [&](Comm& comm) {
    coll::RingWorkspaceConfig wc;
    wc.tmpBytes = 2048;
    wc.maxBlocks = 4;
    const coll::RingWorkspace ws = coll::createRingWorkspace(comm, wc);
    Bufs b;
    b.bytes = kHead + 3000 * 8 + kTail;
    b.send = comm.allocWindow(b.bytes);
    b.recv = comm.allocWindow(b.bytes);
    for (int i = 0; i < 40; ++i) {
      coll::RingTuning t;
      t.chunkBytes = 16u << (i % 5);
      t.blocks = 1 + uint32_t(i % 4);
      t.bidirAgMaxBytes = i % 2 ? -1 : 0;
      if (i % 4 != 1) t.llMaxBytes = 0;           // every fourth call one-shot LL16,
      if (i % 4 != 3) t.directMaxBytes = 0;       // every fourth two-shot direct, every eighth
      t.shotMaxBytes = i % 8 == 2 ? 1 << 20 : 0;  // one-shot stores, between ring calls
      t.directBlocks = 1 + uint32_t(i % 5);
      t.shotBlocks = 1 + uint32_t(i % 7);
      const size_t count = size_t(1 + (i * 397) % 3000);
      oneCase<float, coll::Sum>(comm, ws, b, count, t, i % 3 == 0, uint64_t(i), results, "call " + std::to_string(i));
    }
    comm.check();
    comm.bootstrap().barrier();
    comm.deregisterWindow(b.send);
    comm.deregisterWindow(b.recv);
    coll::destroyRingWorkspace(comm, ws);
  }));
}

TEST_CASE(
    "LL AllReduce: the plan takes LL16 for small messages over lsa only (LL, one-shot and direct refused over "
    "the proxy)",
    "[allreduce][plan][ll]") {
  coll::RingWorkspace ws{};
  ws.tmpBytes = 32ull << 20;
  ws.maxBlocks = 16;
  ws.llMaxBytes = 64 << 10;
  const coll::RingTuning t{};
  auto plan = [&](int n, uint64_t bytes) { return coll::planRingAllReduce(n, ws, bytes / 4, 4, t); };
  coll::RingPlan p = plan(8, 4 << 10);
  CHECK(p.ll == 1);
  CHECK((p.nBlocks == 1 && p.blockSize == 512));
  CHECK(plan(8, 64).blockSize == 64);
  CHECK(plan(8, 64 << 10).ll == 1);
  CHECK(plan(8, (64 << 10) + 4).ll == 0);  // past the threshold: the ring
  CHECK(plan(1, 4 << 10).ll == 0);         // one rank: a copy
  CHECK(plan(4, 0).ll == 0);
  ws.llMaxBytes = 1 << 10;  // the workspace caps the tuning
  CHECK(plan(8, 2 << 10).ll == 0);
  CHECK(plan(8, 1 << 10).ll == 1);
  {
    gintest::EnvVar e("GIN_ALLREDUCE_LL_MAX_SIZE", "0");
    CHECK(coll::planRingAllReduce(8, ws, 16, 4, coll::ringTuningFromEnv()).ll == 0);
  }
  {
    gintest::EnvVar e("GIN_ALLREDUCE_LL_MAX_SIZE", "512");
    CHECK(coll::planRingAllReduce(8, ws, 128, 4, coll::ringTuningFromEnv()).ll == 1);
    CHECK(coll::planRingAllReduce(8, ws, 129, 4, coll::ringTuningFromEnv()).ll == 0);
  }
  for (const char* bad : {"-1", "2G", "x"}) {
    gintest::EnvVar e("GIN_ALLREDUCE_LL_MAX_SIZE", bad);
    CHECK_THROWS_WITH(coll::ringTuningFromEnv(), Catch::Matchers::ContainsSubstring("GIN_ALLREDUCE_LL_MAX_SIZE=") &&
                                                     Catch::Matchers::ContainsSubstring("expected"));
  }
  // Several LL blocks: each takes its share of the packets.
  ws.llMaxBytes = 64 << 10;
  ws.llBlocks = 4;
  CHECK((plan(8, 4 << 10).nBlocks == 4 && plan(8, 4 << 10).blockSize == 128));
  CHECK((plan(2, 64 << 10).nBlocks == 4 && plan(2, 64 << 10).blockSize == 512));
  CHECK((plan(2, 4).nBlocks == 4 && plan(2, 4).blockSize == 64));  // one packet: three blocks have none
  ws.llBlocks = 1;
  // A communicator with a forced network transport plans neither LL nor
  // direct, and refuses such a plan made without the Comm before anything runs.
  if (const char* tr = std::getenv("GIN_TRANSPORT"); tr && std::string(tr) != "proxy") return;
  CommConfig cfg = gintest::cpuConfig();
  cfg.transport = TransportChoice::Proxy;
  REQUIRE_NOTHROW(runRanks(
      2,
      [&](Comm& comm) {
        const coll::RingWorkspace w = coll::createRingWorkspace(comm);
        expect(coll::planRingAllReduce(comm, w, 16, 4).ll == 0, "LL planned over the proxy");
        expect(coll::planRingAllReduce(comm, w, 1 << 20, 4).direct == 0, "direct planned over the proxy");
        expect(coll::planRingAllReduce(comm, w, 1 << 18, 4).shot == 0, "one-shot planned over the proxy");
        coll::RingTuning shot, direct;
        shot.llMaxBytes = direct.llMaxBytes = direct.shotMaxBytes = 0;
        expect(w.shotMaxBytes == 0, "a one-shot window over the proxy");
        coll::RingWorkspace slots = w;  // for the generic planner only: the plan must be refused before it runs
        slots.shotMaxBytes = 1 << 20;
        for (const auto& [tune, path] : {std::pair{coll::RingTuning{}, "LL16"}, std::pair{shot, "one-shot"},
                                         std::pair{direct, "two-shot direct"}}) {
          const coll::RingPlan p = coll::planRingAllReduce(2, slots, 16, 4, tune);
          expect(p.ll + p.shot + p.direct == 1, std::string("the generic planner did not take the ") + path + " path");
          try {
            coll::runRingAllReduce<float, coll::Sum>(comm, w, p, w.tmp, 0, w.tmp, 0);
            expect(false, std::string("a ") + path + " plan ran over the proxy");
          } catch (const gin::Error& e) {
            expect(std::string(e.what()).find(std::string("the ") + path +
                                              " path, which needs every peer reached by lsa") != std::string::npos,
                   e.what());
          }
        }
        comm.bootstrap().barrier();
        coll::destroyRingWorkspace(comm, w);
      },
      cfg));
}

TEST_CASE("LL AllReduce: back to back without barriers, both buffer halves, every rank checks every call",
          "[allreduce][ll]") {
  if (const char* t = std::getenv("GIN_TRANSPORT"); t && std::string(t) != "lsa") SKIP("LL runs over lsa only");
  // 1, 3, 8 and 32 blocks per call (3, 8 and 32: shares of different sizes,
  // and blocks with no packet at all for the smallest counts).
  for (auto [n, llBlocks] : {std::pair{2, 1}, std::pair{3, 1}, std::pair{5, 1}, std::pair{2, 3}, std::pair{3, 8},
                             std::pair{2, 32}, std::pair{4, 3}}) {
    CAPTURE(n, llBlocks);
    coll::RingWorkspaceConfig wc;
    wc.tmpBytes = 4096;
    wc.maxBlocks = 2;
    wc.llMaxBytes = 8 << 10;  // 2048 floats: the largest count
    wc.llBlocks = uint32_t(llBlocks);
    REQUIRE_NOTHROW(runRanks(n, [&](Comm& comm) {
      backToBack(
          comm, wc, 2048, 60, [](int) { return coll::RingTuning{}; },
          [&](const coll::RingPlan& p) { return p.ll == 1 && p.nBlocks == uint32_t(llBlocks); }, "LL");
    }));
  }
}

TEST_CASE("direct AllReduce: the plan takes the two-shot path above the LL limit, over lsa only, up to 8 ranks",
          "[allreduce][plan][direct]") {
  coll::RingWorkspace ws{};
  ws.tmpBytes = 32ull << 20;
  ws.maxBlocks = 16;
  ws.llMaxBytes = 64 << 10;
  coll::RingTuning t{};
  t.llMaxBytes = 64 << 10;
  t.directMaxBytes = 8 << 20;
  auto plan = [&](int n, uint64_t bytes) { return coll::planRingAllReduce(n, ws, bytes / 4, 4, t); };
  CHECK((plan(4, 64 << 10).ll == 1 && plan(4, 64 << 10).direct == 0));  // LL first
  coll::RingPlan p = plan(4, (64 << 10) + 4);
  CHECK((p.direct == 1 && p.ll == 0 && p.nBlocks == 4 && p.blockSize == 512));  // one block per 16 KiB
  CHECK(plan(4, 256 << 10).nBlocks == 16);
  CHECK(plan(4, 8 << 20).nBlocks == coll::kLlMaxBlocks);  // at most 32
  CHECK(plan(4, (8 << 20) + 4).direct == 0);              // past the limit: the ring
  CHECK(plan(8, 1 << 20).direct == 1);
  CHECK(plan(9, 1 << 20).direct == 0);  // more ranks than pointers in registers: the ring
  CHECK(plan(1, 1 << 20).direct == 0);  // one rank: a copy
  t.directBlocks = 3;
  CHECK(plan(2, 1 << 20).nBlocks == 3);
  {
    gintest::EnvVar a("GIN_ALLREDUCE_DIRECT_MAX_SIZE", "0");
    CHECK(coll::planRingAllReduce(4, ws, 1 << 18, 4, coll::ringTuningFromEnv()).direct == 0);
  }
  {
    gintest::EnvVar a("GIN_ALLREDUCE_DIRECT_MAX_SIZE", "2M"), b("GIN_ALLREDUCE_DIRECT_BLOCKS", "7");
    const coll::RingPlan q = coll::planRingAllReduce(4, ws, 1 << 19, 4, coll::ringTuningFromEnv());
    CHECK((q.direct == 1 && q.nBlocks == 7));
    CHECK(coll::planRingAllReduce(4, ws, (1 << 19) + 1, 4, coll::ringTuningFromEnv()).direct == 0);
  }
  // A hand-made plan with both paths set is checked as LL (what runs): with
  // the wrong block count it is refused (badArgument) and moves nothing.
  if (const char* tr = std::getenv("GIN_TRANSPORT"); !tr || std::string(tr) == "lsa") {
    CHECK_THROWS_WITH(runRanks(2,
                               [](Comm& comm) {
                                 coll::RingWorkspaceConfig wc;
                                 wc.llMaxBytes = 4096;
                                 wc.llBlocks = 2;
                                 const coll::RingWorkspace w = coll::createRingWorkspace(comm, wc);
                                 coll::RingPlan both = coll::planRingAllReduce(comm, w, 64, 4);
                                 both.direct = 1;
                                 both.nBlocks = 3;
                                 coll::runRingAllReduce<float, coll::Sum>(comm, w, both, w.tmp, 0, w.tmp, 0);
                               }),
                      Catch::Matchers::ContainsSubstring("badArgument"));
  }
  for (const char* bad : {"0", "33", "x"}) {
    gintest::EnvVar e("GIN_ALLREDUCE_DIRECT_BLOCKS", bad);
    CHECK_THROWS_WITH(coll::ringTuningFromEnv(), Catch::Matchers::ContainsSubstring("GIN_ALLREDUCE_DIRECT_BLOCKS=") &&
                                                     Catch::Matchers::ContainsSubstring("from 1 to 32"));
  }
}

TEST_CASE("direct AllReduce: back to back without barriers, 1 to 32 blocks, in place and not, every rank checks",
          "[allreduce][direct]") {
  if (const char* t = std::getenv("GIN_TRANSPORT"); t && std::string(t) != "lsa") SKIP("direct runs over lsa only");
  overRanksAndBlocks(0, [](Comm& comm, const coll::RingWorkspaceConfig& wc, int blocks) {
    backToBack(
        comm, wc, 5000, 40,
        [&](int call) {
          coll::RingTuning t;
          t.directBlocks = uint32_t(call % 3 == 2 ? 1 : blocks);  // the block count changes too
          return t;
        },
        [](const coll::RingPlan& p) { return p.direct == 1; }, "direct");
  });
}

TEST_CASE("one-shot AllReduce: the plan takes it between LL16 and direct, over lsa only, blocks for the slots",
          "[allreduce][plan][shot]") {
  coll::RingWorkspace ws{};
  ws.tmpBytes = 32ull << 20;
  ws.maxBlocks = 16;
  ws.llMaxBytes = 64 << 10;
  ws.shotMaxBytes = 1 << 20;  // slots of 32 KiB
  coll::RingTuning t{};
  t.llMaxBytes = 64 << 10;
  t.shotMaxBytes = 512 << 10;
  t.directMaxBytes = 8 << 20;
  auto plan = [&](int n, uint64_t bytes) { return coll::planRingAllReduce(n, ws, bytes / 4, 4, t); };
  CHECK((plan(4, 64 << 10).ll == 1 && plan(4, 64 << 10).shot == 0));  // LL first
  coll::RingPlan p = plan(4, (64 << 10) + 4);
  CHECK((p.shot == 1 && p.ll == 0 && p.direct == 0 && p.nBlocks == 4 && p.blockSize == 512));  // one per 16 KiB
  CHECK(plan(4, 512 << 10).shot == 1);
  CHECK(plan(4, 512 << 10).nBlocks == 32);
  CHECK((plan(4, (512 << 10) + 4).shot == 0 && plan(4, (512 << 10) + 4).direct == 1));  // past the limit: direct
  CHECK(plan(8, 256 << 10).shot == 1);
  CHECK(plan(9, 256 << 10).shot == 0);  // more ranks than pointers in registers
  CHECK(plan(1, 256 << 10).shot == 0);  // one rank: a copy
  t.shotBlocks = 3;
  CHECK(plan(2, 80 << 10).nBlocks == 3);
  CHECK(plan(2, 160 << 10).nBlocks == 5);  // three 53 KiB shares would not fit 32 KiB slots
  t.shotBlocks = 0;
  t.shotMaxBytes = 4 << 20;  // the workspace caps the tuning
  CHECK((plan(2, 2 << 20).shot == 0 && plan(2, 1 << 20).shot == 1));
  t.shotMaxBytes = coll::RingTuning::kAuto;  // 1 MiB on 2 and 3 ranks, 512 KiB on 4, off on more (not measured)
  CHECK((plan(2, 1 << 20).shot == 1 && plan(2, (1 << 20) + 4).shot == 0));
  CHECK((plan(3, 1 << 20).shot == 1 && plan(4, 512 << 10).shot == 1 && plan(4, (512 << 10) + 4).direct == 1));
  CHECK((plan(5, 256 << 10).shot == 0 && plan(5, 256 << 10).direct == 1));
  CHECK((coll::RingTuning::llAutoBytes(4) == 128 << 10 && coll::RingTuning::llAutoBytes(2) == 512 << 10));
  {  // a hand-made window: slots of whole 16-byte vectors, at most 32 of them
    coll::RingTuning u = t;
    u.llMaxBytes = 0;
    u.shotMaxBytes = 1 << 20;
    coll::RingWorkspace odd = ws;
    odd.shotMaxBytes = 1000;  // slots of 31 B: never
    CHECK(coll::planRingAllReduce(2, odd, 4, 4, u).shot == 0);
    odd.shotMaxBytes = 1040;  // slots of 32 B: up to 1024 B
    const coll::RingPlan fits = coll::planRingAllReduce(2, odd, 256, 4, u);
    CHECK((fits.shot == 1 && fits.nBlocks == 32));
    CHECK(coll::planRingAllReduce(2, odd, 257, 4, u).shot == 0);
  }
  ws.shotMaxBytes = 0;  // a workspace without slots: never
  CHECK(plan(2, 128 << 10).shot == 0);
  ws.shotMaxBytes = 1 << 20;
  {
    gintest::EnvVar a("GIN_ALLREDUCE_SHOT_MAX_SIZE", "0");
    CHECK(coll::planRingAllReduce(4, ws, 1 << 17, 4, coll::ringTuningFromEnv()).shot == 0);
  }
  {
    gintest::EnvVar a("GIN_ALLREDUCE_SHOT_MAX_SIZE", "256K"), b("GIN_ALLREDUCE_SHOT_BLOCKS", "9");
    const coll::RingPlan q = coll::planRingAllReduce(4, ws, 1 << 16, 4, coll::ringTuningFromEnv());
    CHECK((q.shot == 1 && q.nBlocks == 9));
    CHECK(coll::planRingAllReduce(4, ws, (1 << 16) + 1, 4, coll::ringTuningFromEnv()).shot == 0);
  }
  for (const char* bad : {"0", "33", "x"}) {
    gintest::EnvVar e("GIN_ALLREDUCE_SHOT_BLOCKS", bad);
    CHECK_THROWS_WITH(coll::ringTuningFromEnv(), Catch::Matchers::ContainsSubstring("GIN_ALLREDUCE_SHOT_BLOCKS=") &&
                                                     Catch::Matchers::ContainsSubstring("from 1 to 32"));
  }
  if (const char* tr = std::getenv("GIN_TRANSPORT"); tr && std::string(tr) != "lsa") return;
  // A hand-made plan whose shares do not fit the slots is refused
  // (badArgument) and moves nothing; the environment grows the window.
  CHECK_THROWS_WITH(runRanks(2,
                             [](Comm& comm) {
                               coll::RingWorkspaceConfig wc;
                               wc.shotMaxBytes = 16 << 10;  // slots of 512 B
                               const coll::RingWorkspace w = coll::createRingWorkspace(comm, wc);
                               coll::RingTuning noLl;
                               noLl.llMaxBytes = 0;
                               coll::RingPlan big = coll::planRingAllReduce(comm, w, 1024, 4, noLl);
                               expect(big.shot == 1 && big.nBlocks == 8, coll::describe(big));
                               big.nBlocks = 7;  // 148 floats (147 rounded to 16-byte vectors) = 592 B a block
                               coll::runRingAllReduce<float, coll::Sum>(comm, w, big, w.tmp, 0, w.tmp, 0);
                             }),
                    Catch::Matchers::ContainsSubstring("badArgument"));
  // The default workspace's window: none on 5 ranks (auto), unless the
  // environment asks for one, which it also grows on 2.
  auto shotWindow = [](int n) {
    std::atomic<uint64_t> bytes{~0ull};
    runRanks(n, [&](Comm& comm) {
      const coll::RingWorkspace w = coll::createRingWorkspace(comm);
      if (comm.rank() == 0) bytes = w.shotMaxBytes;
      comm.bootstrap().barrier();
      coll::destroyRingWorkspace(comm, w);
    });
    return bytes.load();
  };
  CHECK(shotWindow(2) == 1 << 20);
  CHECK(shotWindow(4) == 512 << 10);
  CHECK(shotWindow(5) == 0);
  gintest::EnvVar grow("GIN_ALLREDUCE_SHOT_MAX_SIZE", "3M");
  CHECK(shotWindow(2) == 3 << 20);
  CHECK(shotWindow(5) == 3 << 20);
}

TEST_CASE("one-shot AllReduce: back to back without barriers, block counts changing, direct calls between",
          "[allreduce][shot]") {
  if (const char* t = std::getenv("GIN_TRANSPORT"); t && std::string(t) != "lsa") SKIP("one-shot runs over lsa only");
  // Slots of 1 KiB: 5000 floats need 20 blocks.
  overRanksAndBlocks(32 << 10, [](Comm& comm, const coll::RingWorkspaceConfig& wc, int blocks) {
    int shots = 0;
    backToBack(
        comm, wc, 5000, 48,
        [&](int call) {
          coll::RingTuning t;
          t.shotBlocks = uint32_t(call % 3 == 2 ? 1 : blocks);  // the block count changes (and the slots raise it)
          t.shotMaxBytes = call % 4 == 3 ? 0 : 1 << 20;         // else two-shot direct, on the same call counts
          t.directBlocks = uint32_t(1 + call % 6);
          return t;
        },
        [&](const coll::RingPlan& p) {
          shots += p.shot;
          return p.shot + p.direct == 1;
        },
        "one-shot");
    expect(shots == 36, "one-shot calls: " + std::to_string(shots));
  });
}

TEST_CASE("ringAllReduceBlock with Paths: runs the paths compiled in, refuses a plan of another (badArgument)",
          "[allreduce][paths]") {
  if (const char* t = std::getenv("GIN_TRANSPORT"); t && std::string(t) != "lsa") SKIP("LL16 runs over lsa only");
  // Blocks that compiled in the ring alone, given the auto plan (LL16) or a
  // ring plan: the LL plan is refused alike on every rank and moves nothing;
  // the ring plan gives the sum.
  for (const bool llPlan : {true, false}) {
    CAPTURE(llPlan);
    runRanks(3, [llPlan](Comm& comm) {
      const coll::RingWorkspace ws = coll::createRingWorkspace(comm);
      const uint64_t count = 1000;
      const Window send = comm.allocWindow(count * 4), recv = comm.allocWindow(count * 4);
      float* in = static_cast<float*>(comm.localPointer(send));
      for (uint64_t i = 0; i < count; ++i) in[i] = input<float, coll::Sum>(7, comm.rank(), i);
      std::memset(comm.localPointer(recv), 0xa5, count * 4);
      coll::RingTuning ring;
      ring.llMaxBytes = ring.shotMaxBytes = ring.directMaxBytes = 0;
      const coll::RingPlan plan =
          llPlan ? coll::planRingAllReduce(comm, ws, count, 4) : coll::planRingAllReduce(comm, ws, count, 4, ring);
      expect(coll::planPath(plan) == (llPlan ? coll::kPathLl : coll::kPathRing), coll::describe(plan));
      comm.bootstrap().barrier();
      bool ok = true;
      for (uint32_t b = 0; b < plan.nBlocks; ++b)
        ok = coll::ringAllReduceBlock<float, coll::Sum, true, kBackendAll, coll::kPathRing>(
                 CoopThread{}, comm.devComm(), ws, plan, send, 0, recv, 0, b) &&
             ok;
      if (!llPlan) {
        comm.check();
        expect(ok, "the ring plan failed in a ring-only block");
        check<float, coll::Sum>(static_cast<const float*>(comm.localPointer(recv)), comm.nRanks(), count, 7,
                                "ring-only block");
        comm.bootstrap().barrier();
        return;
      }
      expect(!ok, "the LL plan ran in a ring-only block");
      const auto* o = static_cast<const uint8_t*>(comm.localPointer(recv));
      expect(std::all_of(o, o + count * 4, [](uint8_t v) { return v == 0xa5; }), "the refused call wrote its output");
      try {
        comm.check();
        expect(false, "no error recorded for the refused plan");
      } catch (const Error& e) {
        expect(std::string(e.what()).find("badArgument") != std::string::npos, e.what());
      }
    });
  }
}

TEST_CASE("ring AllReduce over the ibgda soft NIC", "[allreduce][ibgda]") {
  if (const char* t = std::getenv("GIN_TRANSPORT"); t && std::string(t) != "ibgda") SKIP("another transport forced");
  CommConfig cfg = gintest::cpuConfig();
  cfg.transport = TransportChoice::Ibgda;
  cfg.ibgda.device = IbgdaConfig::Device::Soft;
  allTypes(3, {0, 1, 97, 1001}, cfg, false);
}

// ---- the p2p baseline (examples/allreduce/ring_allreduce.hpp) ----

TEST_CASE("ring AllReduce baseline over p2p: float sum, 3 ranks", "[allreduce][baseline]") {
  REQUIRE_NOTHROW(runRanks(3, [&](Comm& comm) {
    p2p::Config pc;
    pc.chunkBytes = 256;
    pc.nSlots = 4;
    p2p::Fifo fifo = p2p::create(comm, pc);
    const size_t count = 4099;
    Window w = comm.allocWindow(count * sizeof(float));
    float* d = static_cast<float*>(comm.localPointer(w));
    for (size_t i = 0; i < count; ++i) d[i] = float(int((comm.rank() * 7 + i * 13) % 41) - 20);
    std::vector<float> tmp(37);
    comm.bootstrap().barrier();
    p2p::Endpoint ep(Net(comm.devComm(), 0), fifo);
    expect(ginex::ringAllReduce(CoopThread{}, ep, w, 0, count, tmp.data(), tmp.size(), ginex::Sum{}), "gave up");
    for (size_t i = 0; i < count; ++i) {
      float ref = 0;
      for (int r = 0; r < 3; ++r) ref += float(int((r * 7 + i * 13) % 41) - 20);
      expect(d[i] == ref, "baseline: element " + std::to_string(i));
    }
    comm.bootstrap().barrier();
    comm.deregisterWindow(w);
    p2p::destroy(comm, fifo);
  }));
}
