// gin/ep/combine.hpp — normal-mode combine when the caller runs the experts
// (DeepEP's shape, gin/ep/buffer.hpp): each received token's expert output,
// one bf16 row, goes back to its source at (token, combine slot), counted by
// a SignalAdd on the source's combine signal; the source sums a token's rows
// in float and adds up to two bias rows (low-latency mode: one row per
// (token, choice), summed with the top-k weights). The bodies are GIN_HD,
// like those of gin/ep/layer.hpp.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gin/ep/layer.hpp"

namespace gin::ep {

// Where row (token t, slot j) of a source's combine window starts: bf16 rows
// of H, [T][maxDests] (normal mode; low-latency mode: [T][K], llRowOffset).
GIN_HD inline size_t combineRowOffset(const Shape& sh, size_t t, size_t j) {
  return (t * sh.maxDests() + j) * size_t(sh.hidden) * 2;
}
GIN_HD inline size_t llRowOffset(const Shape& sh, size_t t, size_t k) {
  return (t * size_t(sh.topk) + k) * size_t(sh.hidden) * 2;
}

// Send `row` (H bf16 values) back to `src`'s combine window at byte offset
// `at` on context `ctx`, with the remote action `act` on the combine signal
// there: stored straight into the source's window when it is lsa-reachable,
// else copied to `partial` at position `stage` (bf16 rows of H) and put;
// a row that is already there (low-latency mode's zero-copy combine buffer,
// lowLatencyCombineBuffer) is put as it is. signal() and put() sync the
// coop first, so every thread's part of the row is written before either.
// act None: no signal; the caller counts the row in a later rowsReturned
// on the same context (a GPU signals once per block and source: every
// row's SignalAdd would hit the source's one combine word).
template <class Act, class Coop>
GIN_HD void returnRow(const Layer& l, int src, size_t at, size_t stage, const uint16_t* row, int ctx, Act act,
                      Coop coop) {
  const size_t bytes = size_t(l.shape.hidden) * 2;
  gin::Net<> net(l.dc, ctx);
  if (void* out = directPointer(l, src, l.combine, at)) {
    gin::lsa::coopCopy(coop, out, row, bytes);
    if constexpr (!std::is_same_v<Act, gin::None>) net.signal(gin::teamWorld(l.dc), src, act, coop);
    return;
  }
  void* staged = gin::localPointer(l.partial, stage * bytes);
  if (staged != row) gin::lsa::coopCopy(coop, staged, row, bytes);
  net.put(gin::teamWorld(l.dc), src, l.combine, at, l.partial, stage * bytes, bytes, act, gin::None{}, coop);
}

// `n` rows returned to `src` with no action on context `ctx` have arrived:
// one SignalAdd on its combine signal. It syncs the coop first; over lsa its
// system-scope release covers every thread's row stores, over the proxy and
// ibgda it follows the coop's puts to src on ctx.
template <class Coop>
GIN_HD void rowsReturned(const Layer& l, int src, uint64_t n, int ctx, Coop coop) {
  gin::Net<>(l.dc, ctx).signal(gin::teamWorld(l.dc), src, gin::SignalAdd{l.sig.combine(), n}, coop);
}

// out[i] = bf16(sum over j < n of weight[j] * rows[j][i], + bias0[i] +
// bias1[i]), for i < H, in float, j ascending; rows[j] is the j-th row of H
// bf16 values from `rows`. Each of idx, weight, bias0, bias1 may be null:
// idx skips j where idx[j] < 0 (no expert), no weight means 1, no bias none.
// Normal combine: a token's rows in its combine window (combineRowOffset),
// its rows count, biases; low latency: its K rows (llRowOffset), top-k
// indices and weights (int32 or int64, as the caller has them). swapRow
// non-null: row swapJ is read from there instead (a GPU rank's row from
// itself, never copied into its window).
template <class Coop, class Idx>
GIN_HD void sumRows(const uint16_t* rows, size_t H, int n, const Idx* idx, const float* weight,
                    const uint16_t* bias0, const uint16_t* bias1, uint16_t* out, Coop coop, int swapJ = -1,
                    const uint16_t* swapRow = nullptr) {
  size_t done = 0;
  const auto row = [&](int j) { return j == swapJ && swapRow != nullptr ? swapRow : rows + size_t(j) * H; };
#if GIN_DEVICE_CODE
  // On a GPU, 8 values per 16-byte load and store where every row is
  // 16-byte aligned (the same float operations per value).
  const auto aligned = [](const void* p) { return p == nullptr || uintptr_t(p) % 16 == 0; };
  if (H % 8 == 0 && aligned(rows) && aligned(out) && aligned(bias0) && aligned(bias1) && aligned(swapRow)) {
    const auto lo = [](uint32_t u) { return __uint_as_float(u << 16); };
    const auto hi = [](uint32_t u) { return __uint_as_float(u & 0xffff0000u); };
    const auto add = [&](float* acc, const uint4& u, float w) {
      const uint32_t word[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[2 * e] += w * lo(word[e]);
        acc[2 * e + 1] += w * hi(word[e]);
      }
    };
    // kUnroll vectors a thread apart by the coop's size at once: their
    // loads of a row are issued together (a block per token of a 14 KB row
    // has 3.5 vectors a thread: one load in flight at a time left the sum
    // latency-bound).
    constexpr int kUnroll = 4;
    const size_t V = H / 8, step = size_t(coop.size());
    for (size_t v0 = size_t(coop.rank()); v0 < V; v0 += kUnroll * step) {
      float acc[kUnroll][8] = {};
      const auto addRow = [&](const uint16_t* p, float w) {
        uint4 u[kUnroll];
#pragma unroll
        for (int q = 0; q < kUnroll; ++q)
          if (v0 + q * step < V) u[q] = reinterpret_cast<const uint4*>(p)[v0 + q * step];
#pragma unroll
        for (int q = 0; q < kUnroll; ++q)
          if (v0 + q * step < V) add(acc[q], u[q], w);
      };
      for (int j = 0; j < n; ++j) {
        if (idx && idx[j] < 0) continue;
        addRow(row(j), weight ? weight[j] : 1.f);
      }
      if (bias0) addRow(bias0, 1.f);
      if (bias1) addRow(bias1, 1.f);
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        if (v0 + q * step >= V) continue;
        const auto pack = [&](int e) {
          return uint32_t(floatToBf16(acc[q][2 * e])) | uint32_t(floatToBf16(acc[q][2 * e + 1])) << 16;
        };
        reinterpret_cast<uint4*>(out)[v0 + q * step] = make_uint4(pack(0), pack(1), pack(2), pack(3));
      }
    }
    done = H;
  }
#endif
  for (size_t i = done + size_t(coop.rank()); i < H; i += size_t(coop.size())) {
    float acc = 0;
    for (int j = 0; j < n; ++j) {
      if (idx && idx[j] < 0) continue;
      const float v = bf16ToFloat(row(j)[i]);
      acc += weight ? weight[j] * v : v;
    }
    if (bias0) acc += bf16ToFloat(bias0[i]);
    if (bias1) acc += bf16ToFloat(bias1[i]);
    out[i] = floatToBf16(acc);
  }
}

}  // namespace gin::ep
