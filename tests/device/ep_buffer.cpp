// gin::ep::CpuBuffer (gin/ep/buffer.hpp) on CPU ranks: DeepEP's normal-mode
// dispatch and combine with the experts run by the test between them. Every
// rank regenerates every rank's inputs (they are seeded by rank), so it
// checks what it received row by row against its sources: the rows in
// (source, token) order, bit-exact; the received top-k indices and weights;
// tokens per expert with the alignment; get_dispatch_layout's counts. Then
// combine with the test's experts and 0, 1 or 2 biases against a float
// reference. Low-latency mode: rows packed per local expert in source order,
// the layout ranges, combine weighted by the top-k weights. lsa, proxy and
// ibgda (soft NIC); 1 to 4 ranks; token counts that differ per rank, 0
// included; choices of -1; a cached dispatch of new tokens along a handle's
// layout.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "../common/ranks.hpp"
#include "gin/ep/buffer.hpp"

using namespace gin;
using gin::ep::bf16ToFloat;
using gin::ep::floatToBf16;
using gintest::expect;

namespace {
struct Case {
  int ranks, experts, hidden, topk, maxTokens;
  double noExpert;
  int align;
  TransportChoice tr;
};

// Rank r's token count in round `round` (0 for some, maxTokens for some).
int tokensOf(const Case& c, int r, int round) { return std::max(0, c.maxTokens - (r * 5 + round * 3) % 9); }

gin::ep::Inputs inputsOf(const Case& c, const gin::ep::Shape& sh, int r, int round) {
  gin::ep::Shape s = sh;
  s.tokens = tokensOf(c, r, round);
  return gin::ep::makeInputs(s, r, 500 + uint64_t(round), c.noExpert);
}

// The test's experts: expert e's output on x is expertScale(e) * x; a
// received row's output is the weighted sum over its local choices, to bf16.
std::vector<uint16_t> runExperts(const gin::ep::Dispatched& d, int me, int L, int K, size_t H) {
  const size_t n = d.handle.srcRank.size();
  std::vector<uint16_t> y(n * H);
  for (size_t i = 0; i < n; ++i)
    for (size_t h = 0; h < H; ++h) {
      float acc = 0;
      for (int k = 0; k < K; ++k)
        if (const int el = d.topkIdx[i * size_t(K) + size_t(k)]; el >= 0)
          acc += d.topkWeights[i * size_t(K) + size_t(k)] * gin::ep::expertScale(me * L + el) *
                 bf16ToFloat(d.x[i * H + h]);
      y[i * H + h] = floatToBf16(acc);
    }
  return y;
}

// The case's shape (rings of 3 slots on 2 channels; 2 low-latency senders)
// and a communicator config with its transport and enough signals.
gin::ep::Shape shapeOf(const Case& c) {
  return {.ranks = c.ranks,
          .experts = c.experts,
          .tokens = c.maxTokens,
          .hidden = c.hidden,
          .topk = c.topk,
          .channels = 2,
          .slots = 3,
          .llSenders = 2};
}
CommConfig configOf(const Case& c) {
  CommConfig cfg = gintest::cpuConfig();
  cfg.transport = c.tr;
  cfg.ibgda.device = IbgdaConfig::Device::Soft;
  cfg.nSignals = int(gin::ep::signalsNeeded(shapeOf(c))) + 4;
  return cfg;
}

void check(const Case& c) {
  const gin::ep::Shape sh = shapeOf(c);
  const int R = c.ranks, K = c.topk, L = c.experts / c.ranks;
  const size_t H = size_t(c.hidden);
  gintest::runRanks(
      R,
      [&](Comm& comm) {
        const int me = comm.rank();
        gin::ep::CpuBuffer buf(comm, sh);
        for (int round = 0; round < 3; ++round) {
          const std::string where = "rank " + std::to_string(me) + " round " + std::to_string(round) + ": ";
          std::vector<gin::ep::Inputs> all;
          for (int r = 0; r < R; ++r) all.push_back(inputsOf(c, sh, r, round));
          const gin::ep::Inputs& in = all[size_t(me)];
          const size_t T = size_t(tokensOf(c, me, round));

          // get_dispatch_layout, against a count of its own.
          const gin::ep::DispatchLayout lay = gin::ep::dispatchLayout(sh, in.idx.data(), int(T));
          for (int r = 0; r < R; ++r) {
            int n = 0;
            for (size_t t = 0; t < T; ++t) {
              bool hit = false;
              for (int k = 0; k < K; ++k) hit = hit || (in.idx[t * K + k] >= 0 && in.idx[t * K + k] / L == r);
              n += hit;
              expect(lay.isTokenInRank[t * R + size_t(r)] == uint8_t(hit), where + "isTokenInRank");
            }
            expect(lay.tokensPerRank[size_t(r)] == n, where + "tokensPerRank");
          }

          const gin::ep::Dispatched d = buf.dispatch(in, c.align);
          expect(buf.shape().tokens == c.maxTokens, where + "shape() after a dispatch");
          // The rows this rank must get: by source, then token, each once.
          size_t i = 0;
          std::vector<int> perExpert(size_t(L), 0);
          for (int r = 0; r < R; ++r)
            for (size_t t = 0; t < all[size_t(r)].idx.size() / size_t(K); ++t) {
              const auto& src = all[size_t(r)];
              bool mine = false;
              for (int k = 0; k < K; ++k) mine = mine || (src.idx[t * K + k] >= 0 && src.idx[t * K + k] / L == me);
              if (!mine) continue;
              const std::string row = where + "row " + std::to_string(i) + " (rank " + std::to_string(r) + " token " +
                                      std::to_string(t) + ")";
              expect(i < d.handle.srcRank.size(), row + ": missing");
              expect(d.handle.srcRank[i] == r && d.handle.srcToken[i] == int(t), row + ": out of order");
              for (size_t h = 0; h < H; ++h)
                expect(d.x[i * H + h] == src.x[t * H + h], row + ": value " + std::to_string(h) + " differs");
              for (int k = 0; k < K; ++k) {
                const int e = src.idx[t * K + k];
                const bool local = e >= 0 && e / L == me;
                expect(d.topkIdx[i * K + k] == (local ? e % L : -1), row + ": topkIdx");
                expect(d.topkWeights[i * K + k] == (local ? src.weight[t * K + k] : 0.f), row + ": topkWeights");
                if (local) perExpert[size_t(e % L)] += 1;
              }
              ++i;
            }
          expect(i == d.handle.srcRank.size(), where + "more rows than were sent");
          for (int el = 0; el < L; ++el)
            expect(d.tokensPerExpert[size_t(el)] == (perExpert[size_t(el)] + c.align - 1) / c.align * c.align,
                   where + "tokensPerExpert");

          // Experts, then combine with `round` biases.
          const std::vector<uint16_t> y = runExperts(d, me, L, K, H);
          std::vector<uint16_t> b0(T * H), b1(T * H);
          for (size_t k = 0; k < T * H; ++k) {
            b0[k] = floatToBf16(float(int(k % 7) - 3) / 8.f);
            b1[k] = floatToBf16(float(int(k % 5)) / 16.f);
          }
          const std::vector<uint16_t> out =
              buf.combine(y.data(), d.handle, round >= 1 ? b0.data() : nullptr, round >= 2 ? b1.data() : nullptr);
          expect(out.size() == T * H, where + "combine's size");
          // Reference: per destination rank, that rank's expert output
          // rounded to bf16 (as its experts do), summed in float.
          for (size_t t = 0; t < T; ++t)
            for (size_t h = 0; h < H; ++h) {
              double ref = 0, mag = 0;
              for (int r = 0; r < R; ++r) {
                float acc = 0;
                bool hit = false;
                for (int k = 0; k < K; ++k)
                  if (const int e = in.idx[t * K + k]; e >= 0 && e / L == r) {
                    hit = true;
                    acc += in.weight[t * K + k] * gin::ep::expertScale(e) * bf16ToFloat(in.x[t * H + h]);
                  }
                if (!hit) continue;
                const double v = bf16ToFloat(floatToBf16(acc));
                ref += v;
                mag += std::fabs(v);
              }
              if (round >= 1) ref += bf16ToFloat(b0[t * H + h]), mag += std::fabs(bf16ToFloat(b0[t * H + h]));
              if (round >= 2) ref += bf16ToFloat(b1[t * H + h]), mag += std::fabs(bf16ToFloat(b1[t * H + h]));
              const double got = bf16ToFloat(out[t * H + h]);
              // One bf16 rounding of the sum, and one of a partial either way.
              expect(std::fabs(got - ref) <= mag / 128 + 1e-30, where + "token " + std::to_string(t) + " value " +
                                                                    std::to_string(h) + ": " + std::to_string(got) +
                                                                    ", reference " + std::to_string(ref));
            }

          // A cached dispatch of new tokens along the same layout, then a
          // combine of the rows as they came (the identity expert).
          std::vector<std::vector<uint16_t>> x2;
          for (int r = 0; r < R; ++r) {
            gin::ep::Shape s = sh;
            s.tokens = tokensOf(c, r, round);
            x2.push_back(gin::ep::makeInputs(s, r, 900 + uint64_t(round)).x);
          }
          const gin::ep::Dispatched d2 = buf.dispatch(x2[size_t(me)], d.handle);
          expect(d2.topkIdx.empty() && d2.topkWeights.empty() && d2.tokensPerExpert.empty(),
                 where + "a cached dispatch returns no top-k");
          expect(d2.x.size() == d.x.size(), where + "cached dispatch: row count");
          for (size_t row = 0; row < d2.handle.srcRank.size(); ++row) {
            const auto& src = x2[size_t(d2.handle.srcRank[row])];
            for (size_t h = 0; h < H; ++h)
              expect(d2.x[row * H + h] == src[size_t(d2.handle.srcToken[row]) * H + h],
                     where + "cached dispatch: row " + std::to_string(row) + " value " + std::to_string(h));
          }
          const std::vector<uint16_t> out2 = buf.combine(d2.x.data(), d2.handle);
          for (size_t t = 0; t < T; ++t)
            for (size_t h = 0; h < H; ++h) {
              const double v = bf16ToFloat(x2[size_t(me)][t * H + h]), ref = d.handle.rows[t] * v;
              expect(std::fabs(bf16ToFloat(out2[t * H + h]) - ref) <= std::fabs(ref) / 128 + 1e-30,
                     where + "cached combine: token " + std::to_string(t));
            }
        }
      },
      configOf(c));
}

// Low-latency mode: every (token, choice) to its expert, packed per local
// expert in source order; combine weighted by the top-k weights.
void checkLl(const Case& c) {
  const gin::ep::Shape sh = shapeOf(c);
  const int R = c.ranks, K = c.topk, L = c.experts / c.ranks;
  const size_t H = size_t(c.hidden), Tmax = size_t(c.maxTokens);
  gintest::runRanks(
      R,
      [&](Comm& comm) {
        const int me = comm.rank();
        gin::ep::CpuBuffer buf(comm, sh, true);
        for (int round = 0; round < 2; ++round) {
          const std::string where = "rank " + std::to_string(me) + " round " + std::to_string(round) + ": ";
          std::vector<gin::ep::Inputs> all;
          for (int r = 0; r < R; ++r) all.push_back(inputsOf(c, sh, r, round));
          const gin::ep::Inputs& in = all[size_t(me)];
          const size_t T = size_t(tokensOf(c, me, round));
          const gin::ep::LlDispatched d = buf.lowLatencyDispatch(in);
          const gin::ep::LlHandle& h = d.handle;
          for (int el = 0; el < L; ++el) {
            uint64_t begin = 0;
            for (int r = 0; r < R; ++r) {
              const auto& src = all[size_t(r)];
              uint64_t n = 0;
              for (size_t t = 0; t < src.idx.size() / size_t(K); ++t)
                for (int k = 0; k < K; ++k) {
                  if (src.idx[t * K + k] != me * L + el) continue;
                  const size_t row = size_t(el) * R * Tmax + size_t(begin + n);
                  const std::string at = where + "expert " + std::to_string(el) + " row " + std::to_string(begin + n) +
                                         " (rank " + std::to_string(r) + " token " + std::to_string(t) + ")";
                  expect(h.srcToken[row] == int(t) && h.srcK[row] == k, at + ": out of order");
                  for (size_t i = 0; i < H; ++i)
                    expect(d.x[row * H + i] == src.x[t * H + i], at + ": value " + std::to_string(i) + " differs");
                  ++n;
                }
              expect(h.range[size_t(el) * R + size_t(r)] == (begin << 32 | n), where + "layout range");
              begin += n;
            }
            expect(h.count[size_t(el)] == int(begin), where + "count of expert " + std::to_string(el));
          }
          // The experts: expert e's row is expertScale(e) * x, unweighted.
          std::vector<uint16_t> y(d.x.size());
          for (int el = 0; el < L; ++el)
            for (size_t q = 0; q < size_t(h.count[size_t(el)]); ++q) {
              const size_t row = size_t(el) * R * Tmax + q;
              for (size_t i = 0; i < H; ++i)
                y[row * H + i] = floatToBf16(gin::ep::expertScale(me * L + el) * bf16ToFloat(d.x[row * H + i]));
            }
          const std::vector<uint16_t> out = buf.lowLatencyCombine(y.data(), in.idx.data(), in.weight.data(), h);
          expect(out.size() == T * H, where + "combine's size");
          for (size_t t = 0; t < T; ++t)
            for (size_t i = 0; i < H; ++i) {
              double ref = 0, mag = 0;
              for (int k = 0; k < K; ++k)
                if (const int e = in.idx[t * K + k]; e >= 0) {
                  const double v = double(in.weight[t * K + k]) *
                                   bf16ToFloat(floatToBf16(gin::ep::expertScale(e) * bf16ToFloat(in.x[t * H + i])));
                  ref += v;
                  mag += std::fabs(v);
                }
              const double got = bf16ToFloat(out[t * H + i]);
              expect(std::fabs(got - ref) <= mag / 128 + 1e-30, where + "token " + std::to_string(t) + " value " +
                                                                    std::to_string(i) + ": " + std::to_string(got) +
                                                                    ", reference " + std::to_string(ref));
            }
        }
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
