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

void checkFp8(const Case& c) {
  gintest::runRanks(
      c.ranks,
      [&](Comm& comm) {
        gin::ep::CpuBuffer buf(comm, shapeOf(c));
        checkFp8Rounds(buf, comm, c);
        checkRounds(buf, comm, c, 1);  // bf16 again after FP8
      },
      configOf(c));
  gintest::runRanks(
      c.ranks,
      [&](Comm& comm) {
        gin::ep::CpuBuffer buf(comm, shapeOf(c), true);
        checkLlFp8Rounds(buf, comm, c);
        checkLlRounds(buf, comm, c, 1);
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

TEST_CASE("ep fp8: e4m3 rounds to nearest even and saturates (cvt.rn.satfinite), groups scale to 448", "[ep][fp8]") {
  using gin::ep::e4m3ToFloat;
  using gin::ep::floatToE4m3;
  // Every finite code decodes and encodes back; NaN stays NaN.
  for (int b = 0; b < 256; ++b) {
    const uint8_t code = uint8_t(b);
    if ((code & 0x7f) == 0x7f) {
      CHECK(std::isnan(e4m3ToFloat(code)));
      CHECK((floatToE4m3(e4m3ToFloat(code)) & 0x7f) == 0x7f);
      continue;
    }
    CAPTURE(b, e4m3ToFloat(code));
    if (code == 0x80) continue;  // -0 encodes as -0 too, checked below
    CHECK(floatToE4m3(e4m3ToFloat(code)) == code);
  }
  CHECK(floatToE4m3(-0.0f) == 0x80);
  CHECK(e4m3ToFloat(0x7e) == 448.0f);
  CHECK(e4m3ToFloat(0x01) == 1.0f / 512);
  CHECK(e4m3ToFloat(0x08) == 1.0f / 64);
  // Halfway between neighbours: to the even code; a hair above: up.
  for (uint8_t c = 0; c < 0x7e; ++c) {
    const float lo = e4m3ToFloat(c), hi = e4m3ToFloat(uint8_t(c + 1)), mid = (lo + hi) / 2;
    CAPTURE(int(c), lo, hi);
    CHECK(floatToE4m3(mid) == ((c & 1) ? c + 1 : c));
    CHECK(floatToE4m3(-mid) == (0x80 | ((c & 1) ? c + 1 : c)));
    CHECK(floatToE4m3(std::nextafter(mid, hi)) == c + 1);
    CHECK(floatToE4m3(std::nextafter(mid, lo)) == c);
  }
  CHECK(floatToE4m3(500.0f) == 0x7e);
  CHECK(floatToE4m3(-1e30f) == 0xfe);
  CHECK(floatToE4m3(INFINITY) == 0x7e);
  CHECK(floatToE4m3(1e-30f) == 0x00);
  // A group's largest |x| becomes +-448 and its scale amax / 448.
  std::vector<uint16_t> x(128);
  for (size_t i = 0; i < x.size(); ++i) x[i] = gin::ep::floatToBf16(float(int(i) - 40) / 16);
  std::vector<uint8_t> q(128);
  const float scale = gin::ep::quantizeGroup(x.data(), 128, q.data());
  CHECK(scale == (87.0f / 16) / 448.0f);
  CHECK(q[127] == 0x7e);
  CHECK(q[40] == 0x00);
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = gin::ep::bf16ToFloat(x[i]), back = e4m3ToFloat(q[i]) * scale;
    CHECK(std::fabs(back - v) <= std::fabs(v) / 16 + scale / 512);  // 3 mantissa bits
  }
}

TEST_CASE("ep buffer in FP8: dispatch carries e4m3 rows and scales byte for byte, low latency quantizes", "[ep][fp8]") {
  const int ranks = GENERATE(1, 2, 3, 4);
  CAPTURE(ranks);
  CHECK_NOTHROW(checkFp8({ranks, 4 * ranks, 256, std::min(4, 4 * ranks), 13, 0.2, 1, TransportChoice::Lsa}));
}

TEST_CASE("ep buffer over the proxy and ibgda (soft NIC): both modes, expert alignment 4", "[ep][proxy][ibgda]") {
  const char* forced = std::getenv("GIN_TRANSPORT");
  for (auto [name, tr] : {std::pair{"proxy", TransportChoice::Proxy}, std::pair{"ibgda", TransportChoice::Ibgda}}) {
    if (forced && std::string(forced) != name) continue;
    CAPTURE(name);
    CHECK_NOTHROW(check({3, 6, 24, 3, 17, 0.2, 4, tr}));
    CHECK_NOTHROW(checkLl({3, 6, 24, 3, 17, 0.2, 1, tr}));
    CHECK_NOTHROW(checkFp8({2, 4, 128, 2, 9, 0.2, 1, tr}));
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
  // FP8 needs whole groups of 128 values per scale (hidden 8 here).
  std::string fp8;
  gintest::runRanks(2, [&](Comm& comm) {
    gin::ep::CpuBuffer buf(comm, sh, true);
    try {
      buf.lowLatencyDispatch(gin::ep::makeInputs(sh, comm.rank(), 1), true);
    } catch (const std::invalid_argument& e) {
      if (comm.rank() == 0) fp8 = e.what();
    }
  });
  CHECK(fp8.find("lowLatencyDispatch in FP8 needs a hidden size that is a multiple of 128") != std::string::npos);
}
