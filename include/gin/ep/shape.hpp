// gin/ep/shape.hpp — the sizes and layout of one expert-parallel layer
// (gin/ep/layer.hpp): Shape (token, ring slot and lane sizes), TokenMeta (what
// travels with a token in normal mode) and Signals (the layer's signal ids).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gin/core/config.hpp"
#include "gin/ep/fp8.hpp"

namespace gin::ep {

inline constexpr int kMaxTopk = 16;

struct Shape {
  int ranks = 1;
  int experts = 8;    // E, a multiple of ranks
  int tokens = 0;     // T per rank
  int hidden = 7168;  // H (bf16 elements)
  int topk = 8;       // K <= E
  int channels = 4;   // C
  int slots = 8;      // S per (source, channel) ring
  // Normal mode: tokens per tail/head signal. 1: a sender advances the tail
  // after every step (the tokens its warps put at once) and a receiver frees
  // the slots it copied out at every step. B > 1: each waits until B tokens
  // or slots are due (DeepEP's chunked tail/head updates); neither holds a
  // signal back while it waits (see sendStep, layer.hpp).
  int batch = 1;
  // Low-latency mode: senders per expert (CTAs per expert on a GPU). Each
  // puts a share of the expert's tokens and then the count with a SignalAdd
  // of 1; a receiver waits for the count signal to reach llSenders (times
  // the call's round where signals are not reset: Layer::llRounds).
  int llSenders = 4;
  // The tokens of this call travel as FP8 (gin/ep/fp8.hpp: H e4m3 bytes and
  // H / 128 float scales) instead of bf16: set per call on the layer (the
  // windows are sized for bf16, the larger row). H a multiple of 128.
  bool fp8 = false;
  GIN_HD int localExperts() const { return experts / ranks; }
  // Destinations per token are at most min(K, ranks).
  GIN_HD int maxDests() const { return topk < ranks ? topk : ranks; }
  GIN_HD size_t metaBytes() const { return (16 + 8 * size_t(topk) + 15) / 16 * 16; }
  GIN_HD size_t tokenBytes() const { return (rowBytes() + 15) / 16 * 16; }
  // A token's bytes as a receiver gets them: H bf16 values, or its FP8 row.
  GIN_HD size_t rowBytes() const { return fp8 ? fp8RowBytes(size_t(hidden)) : size_t(hidden) * 2; }
  // One ring slot: metadata, then the token's row (rowBytes), 16-byte
  // aligned; as large as a bf16 row in every call (an FP8 row uses its
  // start), so where a slot lies does not depend on the call: rings that run
  // on across calls (Layer::ringPos) keep their slots where they were.
  GIN_HD size_t slotBytes() const { return metaBytes() + (size_t(hidden) * 2 + 15) / 16 * 16; }
  // Normal mode: the most tokens one (channel, destination) lane sends.
  GIN_HD size_t laneCap() const { return (size_t(tokens) + size_t(channels) - 1) / size_t(channels); }
};

// The metadata that travels with a token (normal mode): who sent it, where
// its combined result goes back to, and the experts of the destination rank
// it chose, with their weights.
struct TokenMeta {
  uint32_t srcToken;
  uint32_t combineSlot;  // j: the token's j-th destination rank
  uint32_t nLocal;       // entries used below
  uint32_t choices;      // bit k: the token's k-th choice is one of pick[] (they are in increasing k)
  struct {
    int32_t localExpert;
    float weight;
  } pick[kMaxTopk];  // [topk] of them travel (metaBytes())
};

// Signal ids of one layer, from `base`.
struct Signals {
  uint32_t base;
  int ranks, channels, localExperts;
  GIN_HD uint32_t count() const { return base; }
  GIN_HD uint32_t combine() const { return base + 1; }
  GIN_HD uint32_t tail(int src, int c) const { return base + 2 + uint32_t(src * channels + c); }
  GIN_HD uint32_t head(int dst, int c) const { return base + 2 + uint32_t((ranks + dst) * channels + c); }
  GIN_HD uint32_t end() const { return base + 2 + uint32_t(2 * ranks * channels); }
  // Normal mode without resets (GpuBuffer), one signal per source rank (a
  // counter summed over the ranks could reach its mark with a rank a call
  // ahead standing in for one a call behind): the combines that rank
  // summed (a combine's returns wait until every rank summed the combines
  // before), and the sync-free count rounds it sent.
  GIN_HD uint32_t summed(int src) const { return end() + uint32_t(src); }
  GIN_HD uint32_t sfCount(int src) const { return end() + uint32_t(ranks + src); }
  // Low-latency mode: one count signal per (local expert, source).
  GIN_HD uint32_t llCount(int localExpert, int src) const { return base + 2 + uint32_t(localExpert * ranks + src); }
  // Low-latency mode without resets, one signal per rank: the combines that
  // rank summed (a SignalAdd of 1 each; a block returning rows to it waits
  // for the combines before). Per rank: one counter summed over the ranks
  // could reach its mark with a rank a combine ahead standing in for one
  // a combine behind.
  GIN_HD uint32_t llSummed(int src) const { return base + 2 + uint32_t(localExperts * ranks + src); }
};

}  // namespace gin::ep
