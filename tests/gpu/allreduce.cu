// GPU suite: the ring AllReduce (gin/device/allreduce.hpp) on 1..8 GPUs driven
// by one process (one thread and one Comm per GPU): float, half, bfloat16,
// double, int32 and int64 with sum, prod, min and max; counts 0, 1, primes and
// 1 Mi + 3; in place and out of place; the auto plan, tiny chunks with
// several blocks (the slots wrap many times), the one-way kernel variant, and
// the two-shot direct path on 5 blocks for every count ("auto" takes LL16,
// then direct, over lsa);
// poisoned guards; results against the host reference
// (tests/common/allreduce_ref.hpp) and bitwise identical on every rank.
// Registered again with GIN_TRANSPORT=proxy. Skips (exit 77) without a GPU.
#include <catch2/catch_session.hpp>
#include <catch2/catch_test_macros.hpp>

#include "../common/allreduce_ref.hpp"
#include "gpu_common.cuh"

using namespace gin;
using namespace gintest::arref;
using gputest::expect;

namespace {

std::vector<int> rankCounts() {
  std::vector<int> v;
  for (int n : {1, 2, 3, 4, 8})
    if (n <= gputest::gpuCount() && n <= gputest::maxRanks()) v.push_back(n);
  return v;
}

struct Bufs {
  Window send, recv;
  size_t bytes;
};

template <class T, class Op>
void gpuCase(Comm& comm, cudaStream_t st, const coll::RingWorkspace& ws, const Bufs& b, size_t count,
             const coll::RingTuning& tune, bool inPlace, uint64_t seed, std::vector<std::vector<uint8_t>>& results,
             const std::string& what) {
  const int me = comm.rank();
  std::vector<uint8_t> h(b.bytes, kPoison);
  T* in = reinterpret_cast<T*>(h.data() + kHead);
  for (size_t i = 0; i < count; ++i) in[i] = input<T, Op>(seed, me, i);
  GPU_CHECK(cudaMemcpy(comm.localPointer(b.send), h.data(), b.bytes, cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemset(comm.localPointer(b.recv), kPoison, b.bytes));
  const Window rw = inPlace ? b.send : b.recv;
  const coll::RingPlan plan = coll::planRingAllReduce(comm, ws, count, sizeof(T), tune);  // LL only over lsa
  GPU_CHECK(cudaDeviceSynchronize());
  comm.bootstrap().barrier();
  coll::launchRingAllReduce<T, Op>(comm, ws, plan, b.send, kHead, rw, kHead, st);
  const cudaError_t e = cudaStreamSynchronize(st);
  comm.check();
  GPU_CHECK(e);
  std::vector<uint8_t> o(b.bytes);
  GPU_CHECK(cudaMemcpy(o.data(), comm.localPointer(rw), b.bytes, cudaMemcpyDeviceToHost));
  bool poison = true;
  for (size_t i = 0; i < kHead; ++i) poison &= o[i] == kPoison;
  for (size_t i = kHead + count * sizeof(T); i < b.bytes; ++i) poison &= o[i] == kPoison;
  expect(poison, what + ": wrote outside the output (" + coll::describe(plan) + ")");
  if (!inPlace) {
    std::vector<uint8_t> s(b.bytes);
    GPU_CHECK(cudaMemcpy(s.data(), comm.localPointer(b.send), b.bytes, cudaMemcpyDeviceToHost));
    expect(s == h, what + ": the input changed (out of place)");
  }
  check<T, Op>(reinterpret_cast<const T*>(o.data() + kHead), comm.nRanks(), count, seed,
               what + " (" + coll::describe(plan) + ")");
  results[size_t(me)].assign(o.begin() + kHead, o.begin() + long(kHead + count * sizeof(T)));
  comm.bootstrap().barrier();
  for (int r = 0; r < comm.nRanks(); ++r)
    expect(results[size_t(r)] == results[size_t(me)],
           what + ": ranks " + std::to_string(r) + " and " + std::to_string(me) + " disagree bitwise");
  comm.bootstrap().barrier();
}

template <class T>
void allOps(Comm& comm, cudaStream_t st, const coll::RingWorkspace& ws, const Bufs& b,
            const std::vector<size_t>& counts, const coll::RingTuning& t, bool inPlace,
            std::vector<std::vector<uint8_t>>& results, const std::string& at) {
  for (size_t count : counts) {
    const std::string w = at + " count " + std::to_string(count) + " n " + std::to_string(comm.nRanks());
    gpuCase<T, coll::Sum>(comm, st, ws, b, count, t, inPlace, count * 4 + 1, results, "sum " + w);
    gpuCase<T, coll::Prod>(comm, st, ws, b, count, t, inPlace, count * 4 + 2, results, "prod " + w);
    gpuCase<T, coll::Min>(comm, st, ws, b, count, t, inPlace, count * 4 + 3, results, "min " + w);
    gpuCase<T, coll::Max>(comm, st, ws, b, count, t, inPlace, count * 4 + 4, results, "max " + w);
  }
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
        wc.llBlocks = llBlocks;  // the "auto" tuning's LL16 calls (lsa, up to 1 MiB / n)
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
        coll::RingTuning direct;  // over lsa every count two-shot direct (with the proxy forced: the ring)
        direct.llMaxBytes = 0;
        direct.directBlocks = 5;
        const struct {
          const char* name;
          coll::RingTuning t;
        } tunings[] = {{"auto", {}},
                       {"48 B chunks, 3 blocks, bidirectional", tiny},
                       {"4 KiB chunks, 2 blocks, one-way kernel", oneWay},
                       {"two-shot direct, 5 blocks", direct}};
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

int main(int argc, char** argv) {
  if (gputest::gpuCount() == 0) return gputest::skipNoGpu("GPU ring AllReduce suite");
  std::printf("GPU ring AllReduce suite: %d GPU(s) visible, rank counts tested:", gputest::gpuCount());
  for (int n : rankCounts()) std::printf(" %d", n);
  std::printf("\n");
  return Catch::Session().run(argc, argv);
}
