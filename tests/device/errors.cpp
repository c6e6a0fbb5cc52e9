// Tests that a device-side wait that cannot finish reports who waited for
// what (gin/device/comm.hpp boundedWait, gin::Comm::check), and that bad
// device-side arguments are recorded instead of corrupting memory.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../common/ranks.hpp"

using namespace gin;
using Catch::Matchers::ContainsSubstring;
using gintest::expect;
using gintest::runRanks;

namespace {
std::string checkMessage(Comm& comm) {
  try {
    comm.check();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a waitSignal nobody answers times out and names rank, op, context, id, expected and observed",
          "[errors][timeout]") {
  std::vector<std::string> msgs(2);
  REQUIRE_NOTHROW(runRanks(
      2,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        Net net(dc, 1);
        if (comm.rank() == 1) {
          net.signal(teamWorld(dc), 1, SignalAdd{7, 3});
          expect(!net.waitSignal(CoopThread{}, 7, 5), "wait should give up");
          // Once the abort flag is up, other waits return at once.
          expect(!net.waitSignal(CoopThread{}, 8, 1), "second wait should stop on abort");
        }
        msgs[size_t(comm.rank())] = checkMessage(comm);
      },
      gintest::cpuConfig(200'000'000ull)));
  CHECK(msgs[0].empty());
  CHECK_THAT(msgs[1], ContainsSubstring("rank 1") && ContainsSubstring("waitSignal") &&
                          ContainsSubstring("context 1") && ContainsSubstring("id 7") &&
                          ContainsSubstring("expected 5") && ContainsSubstring("observed 3"));
}

TEST_CASE("a barrier with a rank that never arrives names the missing peer", "[errors][timeout][barrier]") {
  std::vector<std::string> msgs(3);
  REQUIRE_NOTHROW(runRanks(
      3,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        if (comm.rank() != 2) {
          LsaBarrierSession<CoopThread> bar(CoopThread{}, dc, 11);
          expect(!bar.sync(CoopThread{}), "barrier should give up");
        }
        msgs[size_t(comm.rank())] = checkMessage(comm);
      },
      gintest::cpuConfig(200'000'000ull)));
  CHECK_THAT(msgs[0], ContainsSubstring("lsaBarrier") && ContainsSubstring("peer 2") && ContainsSubstring("id 11"));
  CHECK_THAT(msgs[1], ContainsSubstring("lsaBarrier") && ContainsSubstring("peer 2"));
  CHECK(msgs[2].empty());
}

TEST_CASE("waitCounter that cannot finish reports the counter", "[errors][timeout]") {
  std::string msg;
  REQUIRE_NOTHROW(runRanks(
      1,
      [&](Comm& comm) {
        Net net(comm.devComm(), 0);
        expect(!net.waitCounter(CoopThread{}, 3, 1), "should give up");
        msg = checkMessage(comm);
      },
      gintest::cpuConfig(100'000'000ull)));
  CHECK_THAT(msg, ContainsSubstring("waitCounter") && ContainsSubstring("id 3") && ContainsSubstring("expected 1"));
}

TEST_CASE("out-of-range device arguments are recorded, not executed", "[errors][arguments]") {
  std::vector<std::string> msgs;
  REQUIRE_NOTHROW(runRanks(1, [&](Comm& comm) {
    const DevComm dc = comm.devComm();
    Window w = comm.allocWindow(256);
    auto* b = static_cast<uint8_t*>(comm.localPointer(w));
    std::fill(b, b + 256, uint8_t(1));
    {
      Net net(dc, 0);
      net.put(teamWorld(dc), 0, w, 200, w, 0, 100);  // past the end
      msgs.push_back(checkMessage(comm));
    }
    for (int i = 200; i < 256; ++i) expect(b[i] == 1, "out-of-range put wrote");
  }));
  REQUIRE_NOTHROW(runRanks(1, [&](Comm& comm) {
    Net net(comm.devComm(), 99);  // context out of range
    msgs.push_back(checkMessage(comm));
  }));
  REQUIRE_NOTHROW(runRanks(1, [&](Comm& comm) {
    Net net(comm.devComm(), 0);
    (void)net.readSignal(100000);
    msgs.push_back(checkMessage(comm));
  }));
  REQUIRE_NOTHROW(runRanks(2, [&](Comm& comm) {
    Net net(comm.devComm(), 0);
    if (comm.rank() == 0) {
      net.signal(teamWorld(comm.devComm()), 5, SignalInc{0});  // no rank 5
      msgs.push_back(checkMessage(comm));
    }
  }));
  REQUIRE(msgs.size() == 4);
  for (auto& m : msgs) CHECK_THAT(m, ContainsSubstring("badArgument"));
  CHECK_THAT(msgs[0], ContainsSubstring("value 300") && ContainsSubstring("limit 256"));
  CHECK_THAT(msgs[1], ContainsSubstring("value 99") && ContainsSubstring("limit 4"));
}
