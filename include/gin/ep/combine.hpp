// gin/ep/combine.hpp — normal-mode combine when the caller runs the experts
// (DeepEP's shape, gin/ep/buffer.hpp): each received token's expert output,
// one bf16 row, goes back to its source at (token, combine slot) with a
// SignalInc there; the source sums a token's rows in float and adds up to two
// bias rows (low-latency mode: one row per (token, choice), summed with the
// top-k weights). The bodies are GIN_HD, like those of gin/ep/layer.hpp.
#pragma once

#include <cstdint>

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
// `at`, with a SignalInc on the combine signal there: stored straight into
// the source's window when it is lsa-reachable, else copied to `partial` at
// position `stage` (bf16 rows of H) and put. signal() and put() sync the coop
// first, so every thread's part of the row is written before either.
template <class Coop>
GIN_HD void returnRow(const Layer& l, int src, size_t at, size_t stage, const uint16_t* row, Coop coop) {
  const size_t bytes = size_t(l.shape.hidden) * 2;
  gin::Net<> net(l.dc, int(stage % size_t(l.dc.nContexts)));
  if (void* out = directPointer(l, src, l.combine, at)) {
    gin::lsa::coopCopy(coop, out, row, bytes);
    net.signal(gin::teamWorld(l.dc), src, gin::SignalInc{l.sig.combine()}, coop);
    return;
  }
  gin::lsa::coopCopy(coop, gin::localPointer(l.partial, stage * bytes), row, bytes);
  net.put(gin::teamWorld(l.dc), src, l.combine, at, l.partial, stage * bytes, bytes, gin::SignalInc{l.sig.combine()},
          gin::None{}, coop);
}

// out[i] = bf16(sum over j < rows of comb row (t, j)[i], + bias0[i] + bias1[i]
// where given), for i < H, in float, rows in slot order (destination ranks
// ascending). comb: this rank's combine window.
template <class Coop>
GIN_HD void sumRows(const Layer& l, size_t t, int rows, const uint16_t* bias0, const uint16_t* bias1, uint16_t* out,
                    Coop coop) {
  const Shape& sh = l.shape;
  const size_t H = size_t(sh.hidden);
  const uint16_t* comb = static_cast<const uint16_t*>(gin::localPointer(l.combine, combineRowOffset(sh, t, 0)));
  for (size_t i = size_t(coop.rank()); i < H; i += size_t(coop.size())) {
    float acc = 0;
    for (int j = 0; j < rows; ++j) acc += bf16ToFloat(comb[size_t(j) * H + i]);
    if (bias0) acc += bf16ToFloat(bias0[i]);
    if (bias1) acc += bf16ToFloat(bias1[i]);
    out[i] = floatToBf16(acc);
  }
}

// Low-latency mode: out[i] = bf16(sum over k with idx[k] >= 0 of
// weight[k] * comb row (t, k)[i]), for i < H, in float, k ascending.
template <class Coop>
GIN_HD void weightedSumRows(const Layer& l, size_t t, const int32_t* idx, const float* weight, uint16_t* out,
                            Coop coop) {
  const Shape& sh = l.shape;
  const size_t H = size_t(sh.hidden);
  const uint16_t* comb = static_cast<const uint16_t*>(gin::localPointer(l.combine, llRowOffset(sh, t, 0)));
  for (size_t i = size_t(coop.rank()); i < H; i += size_t(coop.size())) {
    float acc = 0;
    for (int k = 0; k < sh.topk; ++k)
      if (idx[k] >= 0) acc += weight[k] * bf16ToFloat(comb[size_t(k) * H + i]);
    out[i] = floatToBf16(acc);
  }
}

}  // namespace gin::ep
