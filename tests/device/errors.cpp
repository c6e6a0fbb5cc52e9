// Tests that a device-side wait that cannot finish reports who waited for
// what (gin/device/comm.hpp boundedWait, gin::Comm::check), and that bad
// device-side arguments are recorded instead of corrupting memory.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <catch2/generators/catch_generators.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

#include "../common/processes.hpp"
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

TEST_CASE("a device failure after one the host started keeps the host's: the first failure is the one reported",
          "[errors]") {
  REQUIRE_NOTHROW(runRanks(1, [](Comm& comm) {
    const DevComm dc = comm.devComm();
    // What a GPU rank's engine or wire does (DevCommMemory::hostRecordError): claim the
    // record's state, not the device-side claim word.
    uint32_t idle = 0;
    expect(atomicCompareExchange<Scope::System>(&dc.error->state, idle, 1u), "the record was idle");
    fillErrorRecord(*dc.error, Op::ProxyEngine, comm.rank(), 0, -1, 7, 0, 0);
    // A device wait gives up afterwards: it must not overwrite the record.
    recordError(dc, Op::WaitSignal, 0, 2, 99, 1, 0);
    expect(dc.error->op == uint32_t(Op::ProxyEngine) && dc.error->objectId == 7 && dc.error->context == -1,
           "the device's later failure overwrote the host's record (op " + std::to_string(dc.error->op) + ")");
    expect(aborted(dc), "the device's failure still raises the abort flag");
  }));
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
  // The first of ranks 0 and 1 to give up names peer 2; the other may stop
  // on that failure instead of its own timeout (Op::PeerFailed).
  auto own = [](const std::string& m) { return m.find("peerFailed") == std::string::npos; };
  CHECK((own(msgs[0]) || own(msgs[1])));
  for (int r : {0, 1}) {
    CAPTURE(r, msgs[size_t(r)]);
    if (own(msgs[size_t(r)]))
      CHECK_THAT(msgs[size_t(r)],
                 ContainsSubstring("lsaBarrier") && ContainsSubstring("peer 2") && ContainsSubstring("id 11"));
    else
      CHECK_THAT(msgs[size_t(r)], ContainsSubstring("stopped its lsaBarrier") &&
                                      ContainsSubstring("because rank " + std::to_string(1 - r) + " failed first"));
  }
  CHECK(msgs[2].empty());
}

namespace {
// Rank 0 gives up on a signal nobody sends after 300 ms; the other ranks wait
// for signals nobody sends either, with a 120 s timeout of their own. Each
// returns the time its wait took (ms) and its check() message.
std::pair<long, std::string> oneRankFails(Comm& comm) {
  DevComm dc = comm.devComm();
  dc.timeoutNs = comm.rank() == 0 ? 300'000'000ull : 120'000'000'000ull;
  Net net(dc, comm.rank() % dc.nContexts);
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = net.waitSignal(CoopThread{}, 20 + uint32_t(comm.rank()), 1);
  const long ms = long(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
  expect(!ok, "the wait should stop");
  // Stopped: later waits of the same rank return at once too.
  expect(!net.waitSignal(CoopThread{}, 30, 1), "a later wait should stop at once");
  return {ms, checkMessage(comm)};
}
void expectPeerFailed(int rank, long ms, const std::string& msg) {
  CAPTURE(rank, ms, msg);
  if (rank == 0) {
    CHECK_THAT(msg, ContainsSubstring("rank 0: waitSignal timed out") && ContainsSubstring("id 20"));
  } else {
    // Stopped by rank 0's failure, long before its own 120 s timeout.
    CHECK(ms < 60'000);
    CHECK_THAT(msg, ContainsSubstring("rank " + std::to_string(rank) + ": peerFailed") &&
                        ContainsSubstring("stopped its waitSignal") &&
                        ContainsSubstring("(id " + std::to_string(20 + rank) + ")") &&
                        ContainsSubstring("because rank 0 failed first"));
  }
}
}  // namespace

TEST_CASE("one rank's failure stops every rank's waits (threads): peerFailed names the rank that failed first",
          "[errors][abort]") {
  const int n = GENERATE(2, 4, 8);
  std::vector<std::pair<long, std::string>> got{size_t(n)};
  REQUIRE_NOTHROW(runRanks(
      n, [&](Comm& comm) { got[size_t(comm.rank())] = oneRankFails(comm); }, gintest::cpuConfig(300'000'000ull)));
  for (int r = 0; r < n; ++r) expectPeerFailed(r, got[size_t(r)].first, got[size_t(r)].second);
}

TEST_CASE("one rank's failure stops every rank's waits (processes): peerFailed names the rank that failed first",
          "[errors][abort]") {
  const UniqueId id = makeUniqueId();
  const int n = 3;
  const auto status = gintest::forkRanks(
      n,
      [&](int r) {
        TcpBootstrap bs(id, r, n);
        Comm comm(bs, gintest::cpuConfig(300'000'000ull));
        const auto [ms, msg] = oneRankFails(comm);
        // The child reports through its exit code (Catch's checks live in the parent).
        const bool good = r == 0 ? msg.find("waitSignal timed out") != std::string::npos
                                 : ms < 60'000 && msg.find("because rank 0 failed first") != std::string::npos;
        if (!good) std::fprintf(stderr, "rank %d: after %ld ms: %s\n", r, ms, msg.c_str());
        bs.barrier();
        return good ? 0 : 1;
      },
      150);
  for (int r = 0; r < n; ++r) CHECK(status[size_t(r)] == 0);
}

TEST_CASE("one rank's failure stops the waits of ranks on other hosts: peerFailed names the rank that failed first",
          "[errors][abort][hosts]") {
  // Processes on pretend hosts (proxy over the tcp wire between hosts): only
  // the cross-host abort channel can stop the ranks of other hosts before
  // their own 120 s timeout. Rank 0 stays alive (its connections open) until
  // the others are done, so no lost peer stops them either. 3 hosts of one
  // rank; 2 hosts of 2 ranks (rank 1 stops through its host's team words).
  const auto shape = GENERATE(std::make_pair(3, 1), std::make_pair(4, 2));
  const int n = shape.first, perHost = shape.second;
  CAPTURE(n, perHost);
  const UniqueId id = makeUniqueId();
  const auto status = gintest::forkRanks(
      n,
      [&](int r) {
        const std::string host = "abort-host-" + std::to_string(r / perHost);
        ::setenv("GIN_HOST_ID", host.c_str(), 1);
        TcpBootstrap bs(id, r, n);
        Comm comm(bs, gintest::cpuConfig(20'000'000'000ull));
        if (comm.lsaSize() != perHost || comm.railSize() != n / perHost ||
            comm.transportTo((r + perHost) % n) != Transport::Proxy)
          return 3;
        const auto [ms, msg] = oneRankFails(comm);
        // The steady clock is one for all processes: the stop times compare.
        const long long at =
            std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
                .count();
        std::fprintf(stderr, "rank %d: stopped after %ld ms (steady clock %lld us): %s\n", r, ms, at, msg.c_str());
        const bool good = r == 0 ? msg.find("waitSignal timed out") != std::string::npos
                                 : ms < 10'000 &&
                                       msg.find("rank " + std::to_string(r) + ": peerFailed") != std::string::npos &&
                                       msg.find("because rank 0 failed first") != std::string::npos;
        bs.barrier();
        return good ? 0 : 1;
      },
      150);
  for (int r = 0; r < n; ++r) CHECK(status[size_t(r)] == 0);
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
