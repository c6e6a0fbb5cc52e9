// tests/common/ep_buffer_checks.hpp — the checks of DeepEP's Buffer calls,
// shared by gin::ep::CpuBuffer's tests on CPU ranks (tests/device/ep_buffer.cpp)
// and GpuBuffer's on GPUs (tests/gpu/ep_buffer.cu, through a face with
// CpuBuffer's host-vector calls). Every rank regenerates every rank's inputs
// (they are seeded by rank), so it checks what it received row by row
// against its sources: the rows in (source, token) order, bit-exact; the
// received top-k indices and weights; tokens per expert with the alignment;
// get_dispatch_layout's counts. Then combine with the test's experts and 0,
// 1 or 2 biases against a float reference, and a cached dispatch of new
// tokens along a handle's layout. Low-latency mode: rows packed per local
// expert in source order, the layout ranges, combine weighted by the top-k
// weights. Token counts differ per rank (0 included); choices of -1.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gin/ep/buffer.hpp"
#include "ranks.hpp"

namespace gintest::ep {

using gin::ep::bf16ToFloat;
using gin::ep::floatToBf16;
using gintest::expect;

struct Case {
  int ranks, experts, hidden, topk, maxTokens;
  double noExpert;
  int align;
  gin::TransportChoice tr;
};

// Rank r's token count in round `round` (0 for some, maxTokens for some).
inline int tokensOf(const Case& c, int r, int round) { return std::max(0, c.maxTokens - (r * 5 + round * 3) % 9); }

inline gin::ep::Inputs inputsOf(const Case& c, const gin::ep::Shape& sh, int r, int round) {
  gin::ep::Shape s = sh;
  s.tokens = tokensOf(c, r, round);
  return gin::ep::makeInputs(s, r, 500 + uint64_t(round), c.noExpert);
}

// Every rank's inputs of a round (each rank makes all of them to check what
// it receives).
inline std::vector<gin::ep::Inputs> roundInputs(const Case& c, const gin::ep::Shape& sh, int round) {
  std::vector<gin::ep::Inputs> all;
  for (int r = 0; r < c.ranks; ++r) all.push_back(inputsOf(c, sh, r, round));
  return all;
}

// The test's experts: expert e's output on x is expertScale(e) * x; a
// received row's output is the weighted sum over its local choices, to bf16.
template <class Dispatched>
std::vector<uint16_t> runExperts(const Dispatched& d, int me, int L, int K, size_t H) {
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
inline gin::ep::Shape shapeOf(const Case& c) {
  return {.ranks = c.ranks,
          .experts = c.experts,
          .tokens = c.maxTokens,
          .hidden = c.hidden,
          .topk = c.topk,
          .channels = 2,
          .slots = 3,
          .llSenders = 2};
}
// One rank's normal-mode rounds on `buf` (a normal-mode buffer of
// shapeOf(c)); every rank of the communicator runs them.
template <class Buffer>
void checkRounds(Buffer& buf, gin::Comm& comm, const Case& c, int rounds = 3) {
  const gin::ep::Shape sh = shapeOf(c);
  const int R = c.ranks, K = c.topk, L = c.experts / c.ranks;
  const size_t H = size_t(c.hidden);
  const int me = comm.rank();
  for (int round = 0; round < rounds; ++round) {
    const std::string where = "rank " + std::to_string(me) + " round " + std::to_string(round) + ": ";
    const std::vector<gin::ep::Inputs> all = roundInputs(c, sh, round);
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

    const auto d = buf.dispatch(in, c.align);
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
        const std::string row =
            where + "row " + std::to_string(i) + " (rank " + std::to_string(r) + " token " + std::to_string(t) + ")";
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
    const auto d2 = buf.dispatch(x2[size_t(me)], d.handle);
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
}

// A low-latency dispatch's result on rank `me` (d.x, d.handle's count,
// range, srcToken, srcK on the host) against every rank's inputs `all`:
// each expert's rows by source rank, then token and choice order, and the
// layout ranges and counts; the rows' values too unless `values` is false
// (an FP8 dispatch, checked elsewhere).
template <class Dispatched>
void checkLlDispatched(const Dispatched& d, const std::vector<gin::ep::Inputs>& all, const Case& c, int me,
                       const std::string& where, bool values = true) {
  const int R = c.ranks, K = c.topk, L = c.experts / c.ranks;
  const size_t H = size_t(c.hidden), Tmax = size_t(c.maxTokens);
  const auto& h = d.handle;
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
          for (size_t i = 0; values && i < H; ++i)
            expect(d.x[row * H + i] == src.x[t * H + i], at + ": value " + std::to_string(i) + " differs");
          ++n;
        }
      expect(h.range[size_t(el) * R + size_t(r)] == (begin << 32 | n), where + "layout range");
      begin += n;
    }
    expect(h.count[size_t(el)] == int(begin), where + "count of expert " + std::to_string(el));
  }
}

// The stand-in experts on rank `me`'s received rows x [L][R x Tmax][H]:
// expert e's row is expertScale(e) x its input, unweighted, in bf16.
inline uint16_t llExpertValue(int e, uint16_t x) {
  return floatToBf16(gin::ep::expertScale(e) * bf16ToFloat(x));
}

// A low-latency combine's out [T][H] on a rank whose inputs were `in`,
// after the stand-in experts: per token the weighted sum over its choices.
inline void checkLlCombined(const std::vector<uint16_t>& out, const gin::ep::Inputs& in, const Case& c, size_t T,
                            const std::string& where) {
  const int K = c.topk;
  const size_t H = size_t(c.hidden);
  expect(out.size() == T * H, where + "combine's size");
  for (size_t t = 0; t < T; ++t)
    for (size_t i = 0; i < H; ++i) {
      double ref = 0, mag = 0;
      for (int k = 0; k < K; ++k)
        if (const int e = in.idx[t * K + k]; e >= 0) {
          const double v = double(in.weight[t * K + k]) * bf16ToFloat(llExpertValue(e, in.x[t * H + i]));
          ref += v;
          mag += std::fabs(v);
        }
      const double got = bf16ToFloat(out[t * H + i]);
      expect(std::fabs(got - ref) <= mag / 128 + 1e-30, where + "token " + std::to_string(t) + " value " +
                                                            std::to_string(i) + ": " + std::to_string(got) +
                                                            ", reference " + std::to_string(ref));
    }
}

// DeepEP's zero-copy combine: the expert outputs y written into the
// buffer's combine buffer, which then goes in as y. A GPU buffer's face
// (tests/gpu/ep_buffer.cu) has a member that does the same on the device.
inline std::vector<uint16_t> zeroCopyCombine(gin::ep::CpuBuffer& buf, const std::vector<uint16_t>& y,
                                             const int32_t* idx, const float* w, const gin::ep::LlHandle& h) {
  uint16_t* b = buf.lowLatencyCombineBuffer();
  std::copy(y.begin(), y.end(), b);
  return buf.lowLatencyCombine(b, idx, w, h);
}
template <class Face, class Handle>
auto zeroCopyCombine(Face& buf, const std::vector<uint16_t>& y, const int32_t* idx, const float* w, const Handle& h)
    -> decltype(buf.lowLatencyCombineZeroCopy(y, idx, w, h)) {
  return buf.lowLatencyCombineZeroCopy(y, idx, w, h);
}

// Low-latency mode: every (token, choice) to its expert, packed per local
// expert in source order; combine weighted by the top-k weights (odd
// rounds through the zero-copy combine buffer).
template <class Buffer>
void checkLlRounds(Buffer& buf, gin::Comm& comm, const Case& c, int rounds = 2) {
  const gin::ep::Shape sh = shapeOf(c);
  const int R = c.ranks, L = c.experts / c.ranks;
  const size_t H = size_t(c.hidden), Tmax = size_t(c.maxTokens);
  const int me = comm.rank();
  for (int round = 0; round < rounds; ++round) {
    const std::string where = "rank " + std::to_string(me) + " round " + std::to_string(round) + ": ";
    const std::vector<gin::ep::Inputs> all = roundInputs(c, sh, round);
    const gin::ep::Inputs& in = all[size_t(me)];
    const auto d = buf.lowLatencyDispatch(in);
    checkLlDispatched(d, all, c, me, where);
    std::vector<uint16_t> y(d.x.size());
    for (int el = 0; el < L; ++el)
      for (size_t q = 0; q < size_t(d.handle.count[size_t(el)]); ++q) {
        const size_t row = size_t(el) * R * Tmax + q;
        for (size_t i = 0; i < H; ++i) y[row * H + i] = llExpertValue(me * L + el, d.x[row * H + i]);
      }
    const std::vector<uint16_t> out =
        round % 2 == 1 ? zeroCopyCombine(buf, y, in.idx.data(), in.weight.data(), d.handle)
                       : buf.lowLatencyCombine(y.data(), in.idx.data(), in.weight.data(), d.handle);
    checkLlCombined(out, in, c, size_t(tokensOf(c, me, round)), where + (round % 2 ? "zero-copy " : ""));
  }
}

// ---- FP8 (gin/ep/fp8.hpp) ----------------------------------------------------

// in's tokens as FP8 (each row quantized; x left empty): xFp8 [T][H], xScales [T][H / 128].
inline gin::ep::Inputs fp8Of(const gin::ep::Inputs& in, size_t H) {
  const size_t T = in.x.size() / H, G = H / gin::ep::kFp8Group;
  gin::ep::Inputs f = in;
  f.x.clear();
  f.xFp8.resize(T * H);
  f.xScales.resize(T * G);
  std::vector<char> row(gin::ep::fp8RowBytes(H));
  for (size_t t = 0; t < T; ++t) {
    gin::ep::quantizeRow(in.x.data() + t * H, H, row.data(), 0, 1);
    std::memcpy(f.xFp8.data() + t * H, row.data(), H);
    std::memcpy(f.xScales.data() + t * G, row.data() + H, G * 4);
  }
  return f;
}

// DeepEP's measure of how far two tensors are apart: 1 - 2 sum(xy) / sum(x^2 + y^2).
inline double calcDiff(const std::vector<double>& x, const std::vector<double>& y) {
  double xy = 0, sq = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    xy += x[i] * y[i];
    sq += x[i] * x[i] + y[i] * y[i];
  }
  return sq == 0 ? 0 : 1 - 2 * xy / sq;
}

// Normal-mode dispatch of FP8 tokens: every received row's e4m3 bytes and
// scales equal its source's, in (source, token) order, with the handle's
// sources; the rows dequantized are within DeepEP's FP8 bound (calc_diff
// below 1e-3) of the bf16 tokens; then a bf16 combine of the dequantized
// rows along the FP8 dispatch's handle.
template <class Buffer>
void checkFp8Rounds(Buffer& buf, gin::Comm& comm, const Case& c, int rounds = 2) {
  const gin::ep::Shape sh = shapeOf(c);
  const int R = c.ranks, K = c.topk, L = c.experts / c.ranks;
  const size_t H = size_t(c.hidden), G = H / gin::ep::kFp8Group;
  const int me = comm.rank();
  for (int round = 0; round < rounds; ++round) {
    const std::string where = "rank " + std::to_string(me) + " FP8 round " + std::to_string(round) + ": ";
    const std::vector<gin::ep::Inputs> all = roundInputs(c, sh, round);
    std::vector<gin::ep::Inputs> f;
    for (const auto& in : all) f.push_back(fp8Of(in, H));
    const auto d = buf.dispatch(f[size_t(me)], 1);
    expect(d.x.empty(), where + "an FP8 dispatch returns no bf16 rows");
    size_t i = 0;
    std::vector<double> deq, ref;
    for (int r = 0; r < R; ++r) {
      const size_t T = f[size_t(r)].idx.size() / size_t(K);
      for (size_t t = 0; t < T; ++t) {
        bool mine = false;
        for (int k = 0; k < K; ++k) {
          const int e = f[size_t(r)].idx[t * K + k];
          mine = mine || (e >= 0 && e / L == me);
        }
        if (!mine) continue;
        const std::string at = where + "row " + std::to_string(i) + " (rank " + std::to_string(r) + " token " +
                               std::to_string(t) + ")";
        expect(i < d.handle.srcRank.size() && d.handle.srcRank[i] == r && d.handle.srcToken[i] == int(t),
               at + ": out of order");
        expect(std::equal(d.xFp8.begin() + std::ptrdiff_t(i * H), d.xFp8.begin() + std::ptrdiff_t(i * H + H),
                          f[size_t(r)].xFp8.begin() + std::ptrdiff_t(t * H)),
               at + ": e4m3 bytes differ");
        expect(std::equal(d.xScales.begin() + std::ptrdiff_t(i * G), d.xScales.begin() + std::ptrdiff_t(i * G + G),
                          f[size_t(r)].xScales.begin() + std::ptrdiff_t(t * G)),
               at + ": scales differ");
        for (size_t v = 0; v < H; ++v) {
          deq.push_back(double(gin::ep::e4m3ToFloat(d.xFp8[i * H + v])) * d.xScales[i * G + v / gin::ep::kFp8Group]);
          ref.push_back(bf16ToFloat(all[size_t(r)].x[t * H + v]));
        }
        ++i;
      }
    }
    expect(i == d.handle.srcRank.size() && d.xFp8.size() == i * H && d.xScales.size() == i * G,
           where + "received " + std::to_string(d.handle.srcRank.size()) + " rows, want " + std::to_string(i));
    expect(calcDiff(deq, ref) < 1e-3, where + "dequantized rows are too far from the tokens");
    // Combine the dequantized rows: each token gets back one per destination rank.
    std::vector<uint16_t> y(i * H);
    for (size_t v = 0; v < y.size(); ++v) y[v] = floatToBf16(float(deq[v]));
    const std::vector<uint16_t> out = buf.combine(y.data(), d.handle);
    const gin::ep::Inputs& in = all[size_t(me)];
    const size_t T = in.idx.size() / size_t(K);
    expect(out.size() == T * H, where + "combine's size");
    std::vector<double> got, want;
    for (size_t t = 0; t < T; ++t) {
      int dests = 0;
      for (int r = 0; r < R; ++r) {
        bool hit = false;
        for (int k = 0; k < K; ++k) hit = hit || (in.idx[t * K + k] >= 0 && in.idx[t * K + k] / L == r);
        dests += hit;
      }
      for (size_t v = 0; v < H; ++v) {
        got.push_back(bf16ToFloat(out[t * H + v]));
        want.push_back(dests * double(bf16ToFloat(in.x[t * H + v])));
      }
    }
    expect(calcDiff(got, want) < 1e-3, where + "combine of the dequantized rows");
    // A cached dispatch of new FP8 tokens along this handle, and one along
    // the handle of a bf16 dispatch of the same routing: the bytes of every
    // row and its scales, in the handle's order.
    std::vector<gin::ep::Inputs> f2;
    for (int r = 0; r < R; ++r) {
      gin::ep::Shape s = sh;
      s.tokens = tokensOf(c, r, round);
      f2.push_back(fp8Of(gin::ep::makeInputs(s, r, 700 + uint64_t(round)), H));
    }
    const auto dBf16 = buf.dispatch(all[size_t(me)], 1);
    for (const auto* hp : {&d.handle, &dBf16.handle}) {
      const auto d2 = buf.dispatch(f2[size_t(me)].xFp8, f2[size_t(me)].xScales, *hp);
      const size_t n = hp->srcRank.size();
      const std::string at = where + (hp == &d.handle ? "cached FP8 dispatch: " : "cached FP8 on a bf16 handle: ");
      expect(d2.x.empty() && d2.xFp8.size() == n * H && d2.xScales.size() == n * G, at + "sizes");
      for (size_t row = 0; row < n; ++row) {
        const auto& src = f2[size_t(hp->srcRank[row])];
        const size_t t = size_t(hp->srcToken[row]);
        expect(std::equal(d2.xFp8.begin() + std::ptrdiff_t(row * H), d2.xFp8.begin() + std::ptrdiff_t(row * H + H),
                          src.xFp8.begin() + std::ptrdiff_t(t * H)) &&
                   std::equal(d2.xScales.begin() + std::ptrdiff_t(row * G),
                              d2.xScales.begin() + std::ptrdiff_t(row * G + G),
                              src.xScales.begin() + std::ptrdiff_t(t * G)),
               at + "row " + std::to_string(row) + " differs");
      }
    }
  }
}

// Low-latency dispatch with useFp8: every packed row is the quantization of
// its source token (quantizeRow, bit for bit) with its scales at DeepEP's
// [local expert][H / 128][R x Tmax]; dequantized within calc_diff 1e-3.
template <class Buffer>
void checkLlFp8Rounds(Buffer& buf, gin::Comm& comm, const Case& c, int rounds = 2) {
  const gin::ep::Shape sh = shapeOf(c);
  const int R = c.ranks, K = c.topk, L = c.experts / c.ranks;
  const size_t H = size_t(c.hidden), G = H / gin::ep::kFp8Group, Tmax = size_t(c.maxTokens);
  const int me = comm.rank();
  std::vector<char> q(gin::ep::fp8RowBytes(H));
  for (int round = 0; round < rounds; ++round) {
    const std::string where = "rank " + std::to_string(me) + " FP8 low-latency round " + std::to_string(round) + ": ";
    const std::vector<gin::ep::Inputs> all = roundInputs(c, sh, round);
    const auto d = buf.lowLatencyDispatch(all[size_t(me)], true);
    expect(d.x.empty() && d.xFp8.size() == size_t(L) * R * Tmax * H && d.xScales.size() == size_t(L) * R * Tmax * G,
           where + "FP8 output sizes");
    std::vector<double> deq, ref;
    for (int el = 0; el < L; ++el) {
      size_t row = 0;
      for (int r = 0; r < R; ++r) {
        const auto& src = all[size_t(r)];
        for (size_t t = 0; t < src.idx.size() / size_t(K); ++t)
          for (int k = 0; k < K; ++k) {
            if (src.idx[t * K + k] != me * L + el) continue;
            const std::string at = where + "expert " + std::to_string(el) + " row " + std::to_string(row);
            const size_t p = size_t(el) * R * Tmax + row;
            expect(d.handle.srcToken[p] == int(t), at + ": out of order");
            gin::ep::quantizeRow(src.x.data() + t * H, H, q.data(), 0, 1);
            expect(std::memcmp(d.xFp8.data() + p * H, q.data(), H) == 0, at + ": e4m3 bytes differ");
            for (size_t g = 0; g < G; ++g) {
              float want;
              std::memcpy(&want, q.data() + H + g * 4, 4);
              expect(d.xScales[(size_t(el) * G + g) * R * Tmax + row] == want, at + ": scale differs");
            }
            for (size_t v = 0; v < H; ++v) {
              deq.push_back(double(gin::ep::e4m3ToFloat(d.xFp8[p * H + v])) *
                            d.xScales[(size_t(el) * G + v / gin::ep::kFp8Group) * R * Tmax + row]);
              ref.push_back(bf16ToFloat(src.x[t * H + v]));
            }
            ++row;
          }
      }
      expect(d.handle.count[size_t(el)] == int(row), where + "count of expert " + std::to_string(el));
    }
    expect(calcDiff(deq, ref) < 1e-3, where + "dequantized rows are too far from the tokens");
  }
}

}  // namespace gintest::ep
