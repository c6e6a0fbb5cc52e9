// Tests of gin/device/barrier.hpp (LsaBarrierSession, BarrierSession) on CPU ranks.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include "../common/ranks.hpp"

using namespace gin;
using gintest::expect;
using gintest::runRanks;

namespace {
// Each round every rank writes round-tagged words into every peer's window
// through lsa pointers, syncs on barrier `index`, then checks that every
// peer's word for this round is there.
// Session is a barrier type for CoopBlock (a type, not a template: a template
// template parameter would not bind BarrierSession's defaulted second
// parameter on clang before 19).
template <class Session>
void barrierRounds(Comm& comm, int rounds, int nIndices) {
  const DevComm dc = comm.devComm();
  const int n = comm.nRanks(), me = comm.rank();
  Window w = comm.allocWindow(sizeof(uint64_t) * size_t(n) * size_t(nIndices));
  auto* mine = static_cast<uint64_t*>(comm.localPointer(w));
  for (int r = 1; r <= rounds; ++r) {
    for (int idx = 0; idx < nIndices; ++idx) {
      for (int p = 0; p < n; ++p) {
        auto* slot = static_cast<uint64_t*>(lsaPointer(w, sizeof(uint64_t) * size_t(idx * n + me), p));
        volatileStore(slot, uint64_t(r) << 32 | uint64_t(idx));
      }
      Session bar(CoopBlock{}, dc, uint32_t(idx));
      expect(bar.sync(CoopBlock{}), "barrier gave up");
      for (int p = 0; p < n; ++p)
        expect(volatileLoad(mine + idx * n + p) == (uint64_t(r) << 32 | uint64_t(idx)),
               "round " + std::to_string(r) + " index " + std::to_string(idx) + ": rank " + std::to_string(p) +
                   "'s write is not visible after the barrier");
    }
  }
  comm.check();
}
}  // namespace

TEST_CASE("LsaBarrierSession: nobody leaves before everyone's earlier writes are visible, on many indices",
          "[barrier][lsa]") {
  const int n = GENERATE(1, 2, 3, 4, 8);
  CAPTURE(n);
  REQUIRE_NOTHROW(runRanks(n, [](Comm& comm) { barrierRounds<LsaBarrierSession<CoopBlock>>(comm, 20, 8); }));
}

TEST_CASE("BarrierSession (world): same promise across all ranks", "[barrier][world]") {
  const int n = GENERATE(2, 5);
  CAPTURE(n);
  REQUIRE_NOTHROW(runRanks(n, [](Comm& comm) { barrierRounds<BarrierSession<CoopBlock>>(comm, 20, 4); }));
}

TEST_CASE("barrier indices are independent: all 132 usable, split arrive and wait", "[barrier][indices]") {
  REQUIRE_NOTHROW(runRanks(3, [](Comm& comm) {
    const DevComm dc = comm.devComm();
    expect(dc.nBarriers == 132, "default barrier count");
    // Arrive on every index first, then wait on them in reverse order.
    for (int round = 0; round < 3; ++round) {
      std::vector<std::unique_ptr<LsaBarrierSession<CoopThread>>> s;
      for (uint32_t i = 0; i < 132; ++i) {
        s.push_back(std::make_unique<LsaBarrierSession<CoopThread>>(CoopThread{}, dc, i));
        s.back()->arrive(CoopThread{});
      }
      for (int i = 131; i >= 0; --i) expect(s[size_t(i)]->wait(CoopThread{}), "wait on index " + std::to_string(i));
    }
    // World and lsa sessions on the same index do not interfere.
    {
      LsaBarrierSession<CoopThread> a(CoopThread{}, dc, 7);
      BarrierSession<CoopThread> b(CoopThread{}, dc, 7);
      a.arrive(CoopThread{});
      b.arrive(CoopThread{});
      expect(b.wait(CoopThread{}) && a.wait(CoopThread{}), "mixed sessions");
    }
    comm.check();
  }));
}
