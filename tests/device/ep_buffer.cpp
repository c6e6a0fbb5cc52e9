// gin::ep::CpuBuffer (gin/ep/buffer.hpp) on CPU ranks: DeepEP's normal and
// low-latency dispatch and combine with the experts run by the test between
// them, checked by tests/common/ep_buffer_checks.hpp (which says what), over
// lsa, proxy and ibgda (soft NIC), 1 to 4 ranks; and the buffer's refusals.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "../common/ep_buffer_checks.hpp"
#include "../common/ranks.hpp"
#include "gin/ep/buffer.hpp"

using namespace gin;

namespace {
using namespace gintest::ep;

CommConfig configOf(const Case& c) {
  CommConfig cfg = gintest::cpuConfig();
  cfg.transport = c.tr;
  cfg.ibgda.device = IbgdaConfig::Device::Soft;
  cfg.nSignals = int(gin::ep::signalsNeeded(shapeOf(c))) + 4;
  return cfg;
}

void check(const Case& c) {
  gintest::runRanks(
      c.ranks,
      [&](Comm& comm) {
        gin::ep::CpuBuffer buf(comm, shapeOf(c));
        checkRounds(buf, comm, c);
      },
      configOf(c));
}

void checkLl(const Case& c) {
  gintest::runRanks(
      c.ranks,
      [&](Comm& comm) {
        gin::ep::CpuBuffer buf(comm, shapeOf(c), true);
        checkLlRounds(buf, comm, c);
      },
      configOf(c));
}
}  // namespace

TEST_CASE("ep buffer, low-latency mode: rows packed per expert in source order, combine weighted", "[ep]") {
  const int ranks = GENERATE(1, 2, 3, 4);
  const int maxTokens = GENERATE(1, 23);
  const double noExpert = GENERATE(0.0, 0.3);
  CAPTURE(ranks, maxTokens, noExpert);
  CHECK_NOTHROW(checkLl({ranks, 4 * ranks, 40, std::min(4, 4 * ranks), maxTokens, noExpert, 1, TransportChoice::Lsa}));
}

TEST_CASE("ep buffer: dispatch hands each rank its rows in (source, token) order, combine sums the experts' rows",
          "[ep]") {
  const int ranks = GENERATE(1, 2, 3, 4);
  const int maxTokens = GENERATE(1, 23);
  const double noExpert = GENERATE(0.0, 0.3);
  CAPTURE(ranks, maxTokens, noExpert);
  CHECK_NOTHROW(check({ranks, 4 * ranks, 40, std::min(4, 4 * ranks), maxTokens, noExpert, 1, TransportChoice::Lsa}));
}

TEST_CASE("ep buffer over the proxy and ibgda (soft NIC): both modes, expert alignment 4", "[ep][proxy][ibgda]") {
  const char* forced = std::getenv("GIN_TRANSPORT");
  for (auto [name, tr] : {std::pair{"proxy", TransportChoice::Proxy}, std::pair{"ibgda", TransportChoice::Ibgda}}) {
    if (forced && std::string(forced) != name) continue;
    CAPTURE(name);
    CHECK_NOTHROW(check({3, 6, 24, 3, 17, 0.2, 4, tr}));
    CHECK_NOTHROW(checkLl({3, 6, 24, 3, 17, 0.2, 1, tr}));
  }
}

TEST_CASE("ep buffer refuses more tokens than it was built for, a foreign handle and the other mode's calls",
          "[ep][errors]") {
  const gin::ep::Shape sh{.ranks = 2, .experts = 4, .tokens = 3, .hidden = 8, .topk = 2};
  std::string tooMany, foreign;
  gintest::runRanks(2, [&](Comm& comm) {
    gin::ep::CpuBuffer buf(comm, sh);
    gin::ep::Shape big = sh;
    big.tokens = 4;
    try {
      buf.dispatch(gin::ep::makeInputs(big, comm.rank(), 1));
    } catch (const std::invalid_argument& e) {
      if (comm.rank() == 0) tooMany = e.what();
    }
    gin::ep::Handle h;
    h.tokens = 2;  // rows for 0 tokens
    try {
      buf.combine(nullptr, h);
    } catch (const std::invalid_argument& e) {
      if (comm.rank() == 0) foreign = e.what();
    }
  });
  CHECK(tooMany.find("dispatch of 4 tokens; the buffer takes at most 3") != std::string::npos);
  std::string wrongMode;
  gintest::runRanks(2, [&](Comm& comm) {
    gin::ep::CpuBuffer buf(comm, sh, true);
    try {
      buf.dispatch(gin::ep::makeInputs(sh, comm.rank(), 1));
    } catch (const std::invalid_argument& e) {
      if (comm.rank() == 0) wrongMode = e.what();
    }
  });
  CHECK(wrongMode.find("dispatch on a low-latency buffer; build the buffer with lowLatency = false") !=
        std::string::npos);
  CHECK(foreign.find("a handle that no dispatch of this buffer made") != std::string::npos);
}
