// MoE dispatch/combine (gin::ep) on CPU ranks: normal mode (counts,
// per-channel rings whose head/tail are gin signals) and low-latency mode
// (per-expert buffers), over lsa, the proxy and ibgda (soft NIC), for 1 to 8 ranks and
// token counts 0, 1 and primes; every output checked against a host
// reference, two layers in a row (the second reuses reset signals); choices
// of -1 (no expert) and indices it must refuse.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <cmath>
#include <cstdlib>
#include <string>

#include "../common/ranks.hpp"
#include "gin/ep/cpu.hpp"
#include "gin/host/test_access.hpp"

using namespace gin;
using gin::test::CommAccess;
using gintest::expect;

namespace {
void check(const gin::ep::Shape& sh, bool ll, TransportChoice tr, double noExpert = 0) {
  CommConfig cfg = gintest::cpuConfig();
  cfg.transport = tr;
  cfg.ibgda.device = IbgdaConfig::Device::Soft;  // used when tr is Ibgda
  cfg.nSignals = int(gin::ep::signalsNeeded(sh)) + 4;
  gintest::runRanks(
      sh.ranks,
      [&](Comm& comm) {
        expect(tr != TransportChoice::Ibgda || CommAccess::ibgda(comm) != nullptr, "the ibgda transport is not in use");
        expect(tr != TransportChoice::Proxy || CommAccess::proxyEngine(comm) != nullptr,
               "the proxy transport is not in use");
        gin::ep::CpuLayer layer(comm, sh, ll);
        for (int round = 0; round < 2; ++round) {
          const gin::ep::Inputs in = gin::ep::makeInputs(sh, comm.rank(), 77 + uint64_t(round), noExpert);
          const std::vector<float> out = layer.run(in);
          const std::vector<double> ref = gin::ep::reference(sh, in);
          size_t first = 0;
          const size_t bad = gin::ep::mismatches(out, ref, &first);
          expect(bad == 0, "rank " + std::to_string(comm.rank()) + " round " + std::to_string(round) + ": " +
                               std::to_string(bad) + " wrong outputs, first at " + std::to_string(first));
        }
      },
      cfg);
}
}  // namespace

TEST_CASE("moe normal mode: dispatch and combine match the host reference", "[moe]") {
  const int ranks = GENERATE(1, 2, 3, 4, 8);
  const int tokens = GENERATE(0, 1, 37);
  // Tail/head signals per token, every 2 slots (the ring's size), every 5
  // (more than the ring holds: only the waits advance them).
  const int batch = GENERATE(1, 2, 5);
  gin::ep::Shape sh;
  sh.ranks = ranks;
  sh.experts = ranks == 3 ? 12 : 16;
  sh.tokens = tokens;
  sh.hidden = 72;  // not a multiple of 16 bytes of bf16... 144 bytes: rounded slots
  sh.topk = 8;
  sh.channels = 3;
  sh.slots = 2;  // tiny rings: the head/tail flow control is exercised
  sh.batch = batch;
  CAPTURE(ranks, tokens, batch);
  CHECK_NOTHROW(check(sh, false, TransportChoice::Lsa));
}

TEST_CASE("moe low-latency mode: per-expert buffers match the host reference", "[moe]") {
  const int ranks = GENERATE(1, 2, 4, 8);
  const int tokens = GENERATE(0, 1, 29, 128);
  const int senders = GENERATE(1, 3);  // count signals per (expert, source): a receiver waits for all
  gin::ep::Shape sh;
  sh.ranks = ranks;
  sh.experts = 16;
  sh.tokens = tokens;
  sh.hidden = 40;
  sh.topk = 8;
  sh.llSenders = senders;
  CAPTURE(ranks, tokens, senders);
  CHECK_NOTHROW(check(sh, true, TransportChoice::Lsa));
}

TEST_CASE("moe over the proxy and ibgda (soft NIC) transports: both modes, batched tails and heads",
          "[moe][proxy][ibgda]") {
  const char* forced = std::getenv("GIN_TRANSPORT");
  for (auto [name, tr] : {std::pair{"proxy", TransportChoice::Proxy}, std::pair{"ibgda", TransportChoice::Ibgda}}) {
    if (forced && std::string(forced) != name) continue;  // another transport forced
    CAPTURE(name);
    gin::ep::Shape sh;
    sh.ranks = 3;
    sh.experts = 6;
    sh.tokens = 23;
    sh.hidden = 24;
    sh.topk = 4;
    sh.channels = 2;
    sh.slots = 3;
    CHECK_NOTHROW(check(sh, false, tr));
    CHECK_NOTHROW(check(sh, true, tr));
    sh.batch = 2;  // tails and heads advanced two slots at a time (the ring holds 3)
    CHECK_NOTHROW(check(sh, false, tr));
  }
}

TEST_CASE("moe: a choice of -1 means no expert; a token with none gets zeros", "[moe]") {
  const char* forced = std::getenv("GIN_TRANSPORT");
  const double noExpert = GENERATE(0.3, 1.0);  // 1.0: nothing is sent at all
  for (auto [name, tr] : {std::pair{"lsa", TransportChoice::Lsa}, std::pair{"proxy", TransportChoice::Proxy},
                          std::pair{"ibgda", TransportChoice::Ibgda}}) {
    if (forced && std::string(forced) != name) continue;
    CAPTURE(name, noExpert);
    const gin::ep::Shape sh{.ranks = 4, .experts = 8, .tokens = 19, .hidden = 32, .topk = 4, .channels = 2, .slots = 2};
    CHECK_NOTHROW(check(sh, false, tr, noExpert));
    CHECK_NOTHROW(check(sh, true, tr, noExpert));
  }
}

TEST_CASE("moe refuses an expert index outside -1 and [0, experts), naming it", "[moe][errors]") {
  const gin::ep::Shape sh{.ranks = 2, .experts = 4, .tokens = 3, .hidden = 8, .topk = 2};
  for (const int bad : {-2, 4}) {
    std::string msg;
    gintest::runRanks(2, [&](Comm& comm) {
      gin::ep::CpuLayer layer(comm, sh, false);
      gin::ep::Inputs in = gin::ep::makeInputs(sh, comm.rank(), 5);
      in.idx[3] = bad;  // token 1, choice 1
      try {
        layer.run(in);
      } catch (const std::invalid_argument& e) {
        if (comm.rank() == 0) msg = e.what();
      }
    });
    CAPTURE(bad, msg);
    CHECK(msg.find("token 1 choice 1 names expert " + std::to_string(bad)) != std::string::npos);
  }
}

TEST_CASE("moe rejects shapes it cannot run, with the reason", "[moe][errors]") {
  gin::ep::Shape sh;
  sh.ranks = 2;
  sh.experts = 7;  // not a multiple of 2
  sh.tokens = 4;
  sh.hidden = 8;
  sh.topk = 2;
  // Rank 0's error for `sh` ("" if the layer was built).
  auto refusal = [&] {
    std::string msg;
    gintest::runRanks(2, [&](Comm& comm) {
      try {
        gin::ep::CpuLayer layer(comm, sh, false);
      } catch (const std::invalid_argument& e) {
        if (comm.rank() == 0) msg = e.what();
      }
    });
    return msg;
  };
  CHECK(refusal().find("multiple of ranks") != std::string::npos);
  sh.experts = 8;
  sh.batch = 0;
  CHECK(refusal().find("batch and llSenders >= 1") != std::string::npos);
  sh.batch = 1;
  sh.llSenders = 0;
  CHECK(refusal().find("llSenders >= 1") != std::string::npos);
  sh.llSenders = 2;
  CHECK(refusal().empty());
}
