// gin/ep/buffer.hpp — DeepEP's Buffer on CPU ranks: dispatch hands each rank
// the tokens routed to its experts, the caller runs the experts, combine sums
// their bf16 outputs back at the tokens' sources (normal and low-latency
// modes; docs/ep.md).
//
//   gin::ep::CpuBuffer buf(comm, shape);          // shape.tokens: the most tokens per call
//   gin::ep::Dispatched d = buf.dispatch(in);     // in: x [T][H] bf16, topk idx (-1: none) and weights
//   // y[i] = experts(d.x[i]) for the local experts d.topkIdx[i][k] >= 0, one bf16 row each
//   std::vector<uint16_t> out = buf.combine(y.data(), d.handle, bias0, bias1);  // [T][H] bf16
//
// What DeepEP users get: rows received in source rank order, then source
// token order; received top-k indices are local expert ids with -1 where the
// choice is on another rank or none (weight 0 there); tokens per local
// expert rounded up to an alignment; combine an unweighted float sum plus up
// to two biases, to bf16. Collective: every rank calls dispatch and combine
// in the same order. gin/ep/gpu_buffer.hpp has the same calls on a GPU rank
// (GpuBuffer).
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "gin/ep/combine.hpp"
#include "gin/ep/cpu.hpp"

namespace gin::ep {

// DeepEP's get_dispatch_layout: per rank and per expert, how many of the T
// tokens go there, and whether token t goes to rank r ([T][R]). -1: none.
struct DispatchLayout {
  std::vector<int> tokensPerRank;      // [R]
  std::vector<int> tokensPerExpert;    // [E]
  std::vector<uint8_t> isTokenInRank;  // [T][R]
};

inline DispatchLayout dispatchLayout(const Shape& sh, const int32_t* topkIdx, int tokens) {
  const int R = sh.ranks, L = sh.localExperts(), K = sh.topk;
  DispatchLayout lay;
  lay.tokensPerRank.assign(size_t(R), 0);
  lay.tokensPerExpert.assign(size_t(sh.experts), 0);
  lay.isTokenInRank.assign(size_t(tokens) * size_t(R), 0);
  for (size_t t = 0; t < size_t(tokens); ++t)
    for (int k = 0; k < K; ++k) {
      const int e = topkIdx[t * size_t(K) + size_t(k)];
      if (e < 0) continue;
      lay.tokensPerExpert[size_t(e)] += 1;
      uint8_t& in = lay.isTokenInRank[t * size_t(R) + size_t(e / L)];
      if (!in) lay.tokensPerRank[size_t(e / L)] += 1;
      in = 1;
    }
  return lay;
}

// What combine needs to send a dispatch's rows back, and a cached dispatch
// to repeat its layout (DeepEP's handle).
struct Handle {
  int tokens = 0;                      // T of the dispatch, on this rank
  std::vector<int> tokensFromRank;     // [R] rows received from each source
  std::vector<int> srcRank, srcToken;  // [N] where received row i came from
  std::vector<uint32_t> slot;          // [N] its combine slot at the source
  std::vector<int> rows;               // [T] rows each of this rank's tokens gets back
  uint64_t arrivals = 0;               // rows this rank's combine waits for
  // For a cached dispatch: what this rank sent (the plan, without tokens),
  // and what each (source, channel) sent here.
  Plan sent;
  std::vector<uint64_t> fromLane;  // [R][C]
};

// Low-latency mode (DeepEP's low_latency_dispatch): per local expert, the
// rows of every source packed in source order.
struct LlHandle {
  int tokens = 0;                   // T of the dispatch, on this rank
  std::vector<int> count;           // [L] rows per local expert
  std::vector<uint64_t> range;      // [L][R] begin << 32 | count of each source's rows
  std::vector<int> srcToken, srcK;  // [L][R * Tmax] each packed row's token and choice at its source
  uint64_t arrivals = 0;            // rows this rank's combine waits for
};
struct LlDispatched {
  std::vector<uint16_t> x;  // [L][R * Tmax][H] bf16; rows past count[e] are not written (empty with FP8)
  // FP8 (lowLatencyDispatch's useFp8): [L][R * Tmax][H] e4m3, and the
  // scales as DeepEP lays them out, [L][H / 128][R * Tmax] (row r's scale g
  // at [el][g][r]).
  std::vector<uint8_t> xFp8;
  std::vector<float> xScales;
  LlHandle handle;
};

struct Dispatched {
  std::vector<uint16_t> x;           // [N][H] bf16: by source rank, then source token (empty with FP8)
  std::vector<uint8_t> xFp8;         // FP8 inputs: [N][H] e4m3, same order
  std::vector<float> xScales;        // FP8 inputs: [N][H / 128]
  std::vector<int32_t> topkIdx;      // [N][K] local expert, -1 where the choice is elsewhere or none
  std::vector<float> topkWeights;    // [N][K] 0 where topkIdx is -1
  std::vector<int> tokensPerExpert;  // [L] rows per local expert, rounded up to the alignment
  Handle handle;
};

class CpuBuffer {
 public:
  // shape.tokens is the most tokens a call may bring (the same on every
  // rank); ranks must be the communicator's size. lowLatency picks the
  // mode, as DeepEP's low_latency_mode: dispatch/combine in normal mode,
  // lowLatencyDispatch/lowLatencyCombine in low-latency mode. Signals
  // [sigBase, sigBase + signalsNeeded(shape)).
  CpuBuffer(gin::Comm& comm, const Shape& sh, bool lowLatency = false, uint32_t sigBase = 0)
      : comm_(comm), maxTokens_(sh.tokens), ll_(lowLatency), l_(openLayer(comm, sh, lowLatency, sigBase)) {
    const size_t maxRecv = size_t(sh.ranks) * size_t(sh.tokens);
    if (!ll_) {
      recvX_.resize(maxRecv * size_t(sh.hidden));
      recvMeta_.resize(maxRecv * sh.metaBytes());
    }
  }
  CpuBuffer(const CpuBuffer&) = delete;
  CpuBuffer& operator=(const CpuBuffer&) = delete;
  ~CpuBuffer() { closeLayer(comm_, l_); }

  // The shape the buffer was built with (tokens: the most per call).
  Shape shape() const {
    Shape s = l_.shape;
    s.tokens = maxTokens_;
    return s;
  }

  // Tokens T = in.idx.size() / topk (at most shape().tokens; ranks may
  // differ). expertAlignment >= 1 rounds tokensPerExpert up. FP8 tokens
  // (in.xFp8 and in.xScales, x empty; every rank passes FP8 or none) come
  // back as xFp8 and xScales, byte for byte.
  Dispatched dispatch(const Inputs& in, int expertAlignment = 1) {
    const int K = l_.shape.topk, L = l_.shape.localExperts();
    const size_t H = size_t(l_.shape.hidden);
    const size_t T = checkTokens(in, false, "dispatch");
    if (expertAlignment < 1) throw std::invalid_argument("ep: expertAlignment must be >= 1");
    const bool fp8 = !in.xFp8.empty() || !in.xScales.empty();
    checkFp8Hidden(fp8, l_.shape.hidden, "dispatch");
    l_.shape.tokens = int(T);
    l_.shape.fp8 = fp8;
    l_.topkIdx = in.idx.data();
    const Plan p = plan(l_, false, in);
    startLayer(comm_, l_, p);
    std::vector<int> srcOf;
    std::vector<uint64_t> fromLane;
    const size_t n = size_t(dispatchNormalCpu(comm_, l_, p, size_t(l_.shape.ranks) * size_t(maxTokens_), recvX_.data(),
                                              recvMeta_.data(), srcOf, fromLane));
    settleLayer(comm_, l_);
    // Positions arrive by (source, channel), and channel c holds tokens
    // [c, c + 1) x laneCap: that is (source, token) order already.
    std::vector<TokenMeta> meta(n);
    for (size_t pos = 0; pos < n; ++pos)
      std::memcpy(&meta[pos], recvMeta_.data() + pos * l_.shape.metaBytes(), l_.shape.metaBytes());
    Dispatched d;
    Handle& h = d.handle;
    h.tokens = int(T);
    h.tokensFromRank.assign(size_t(l_.shape.ranks), 0);
    h.rows = p.rows;
    h.arrivals = p.combineArrivals;
    h.sent = p;
    h.sent.x.clear();
    h.fromLane = std::move(fromLane);
    if (fp8)
      splitFp8Rows(n, d.xFp8, d.xScales);
    else
      d.x.assign(recvX_.begin(), recvX_.begin() + std::ptrdiff_t(n * H));
    d.topkIdx.assign(n * size_t(K), -1);
    d.topkWeights.assign(n * size_t(K), 0.f);
    d.tokensPerExpert.assign(size_t(L), 0);
    for (size_t i = 0; i < n; ++i) {
      const TokenMeta& m = meta[i];
      h.srcRank.push_back(srcOf[i]);
      h.srcToken.push_back(int(m.srcToken));
      h.slot.push_back(m.combineSlot);
      h.tokensFromRank[size_t(srcOf[i])] += 1;
      uint32_t choices = m.choices;
      for (uint32_t j = 0; j < m.nLocal; ++j, choices &= choices - 1) {
        const int k = __builtin_ctz(choices);  // the j-th choice on this rank
        d.topkIdx[i * size_t(K) + size_t(k)] = m.pick[j].localExpert;
        d.topkWeights[i * size_t(K) + size_t(k)] = m.pick[j].weight;
        d.tokensPerExpert[size_t(m.pick[j].localExpert)] += 1;
      }
    }
    for (int& c : d.tokensPerExpert) c = (c + expertAlignment - 1) / expertAlignment * expertAlignment;
    return d;
  }

  // A cached dispatch (DeepEP's dispatch with a handle): new tokens x
  // [T][H] bf16 along the layout of the dispatch that made `h`, with no
  // count exchange and no plan. Every rank calls it with a handle of the same
  // dispatch. Returns the rows in that dispatch's order and its handle;
  // topkIdx, topkWeights and tokensPerExpert stay empty (DeepEP: None).
  Dispatched dispatch(const std::vector<uint16_t>& x, const Handle& h) {
    checkCached(x.size(), size_t(h.tokens) * size_t(l_.shape.hidden), h, "x of its ", " tokens x hidden values");
    l_.shape.tokens = h.tokens;
    l_.shape.fp8 = false;
    return cachedDispatch(packTokens(l_.shape, x.data()), h);
  }
  // The same with FP8 tokens (xFp8 [T][H] e4m3, xScales [T][H / 128]; every
  // rank passes FP8): the rows come back as xFp8 and xScales, byte for byte.
  // The handle may come from a bf16 or an FP8 dispatch (the layout is the
  // same).
  Dispatched dispatch(const std::vector<uint8_t>& xFp8, const std::vector<float>& xScales, const Handle& h) {
    const size_t T = size_t(h.tokens), H = size_t(l_.shape.hidden);
    checkFp8Hidden(true, l_.shape.hidden, "dispatch");
    checkCached(xFp8.size(), T * H, h, "FP8 x of its ", " tokens x hidden bytes");
    checkCached(xScales.size(), T * (H / size_t(kFp8Group)), h, "FP8 scales of its ", " tokens x hidden / 128 floats");
    l_.shape.tokens = h.tokens;
    l_.shape.fp8 = true;
    return cachedDispatch(packFp8Tokens(l_.shape, xFp8.data(), xScales.data()), h);
  }

  // y: [N][H] bf16, one row per row of the dispatch that made `h`, in its
  // order. bias0/bias1: [T][H] bf16 or nullptr. Returns [T][H] bf16: per
  // token the float sum of its rows and biases (zeros for a token that went
  // nowhere, plus the biases).
  std::vector<uint16_t> combine(const uint16_t* y, const Handle& h, const uint16_t* bias0 = nullptr,
                                const uint16_t* bias1 = nullptr) {
    const size_t H = size_t(l_.shape.hidden), T = size_t(h.tokens), n = h.srcRank.size();
    if (ll_) throw std::invalid_argument("ep: combine on a low-latency buffer; call lowLatencyCombine");
    if (T > size_t(maxTokens_) || h.rows.size() != T || h.srcToken.size() != n || h.slot.size() != n)
      throw std::invalid_argument("ep: combine was given a handle that no dispatch of this buffer made");
    l_.shape.tokens = int(T);
    gin::Net<> net(l_.dc, 0);
    net.resetSignal(l_.sig.combine());
    comm_.bootstrap().barrier();  // every rank's combine signal is zero before rows come back
    for (size_t i = 0; i < n; ++i)
      returnRow(l_, h.srcRank[i], combineRowOffset(l_.shape, size_t(h.srcToken[i]), h.slot[i]), i, y + i * H,
                int(i % size_t(l_.dc.nContexts)), gin::SignalAdd{l_.sig.combine(), 1},
                gin::CoopThread{});
    if (!net.waitSignal(gin::CoopThread{}, l_.sig.combine(), h.arrivals)) failLayer(comm_, "combine");
    std::vector<uint16_t> out(T * H);
    for (size_t t = 0; t < T; ++t)
      sumRows(combineRows(combineRowOffset(l_.shape, t, 0)), H, h.rows[t], static_cast<const int32_t*>(nullptr),
              nullptr, bias0 ? bias0 + t * H : nullptr, bias1 ? bias1 + t * H : nullptr, out.data() + t * H,
              gin::CoopThread{});
    settleLayer(comm_, l_);
    return out;
  }

  // Low-latency mode: every (token, choice) pair goes to its expert's rank
  // on its own (a token with two experts on one rank goes twice), into that
  // expert's rows; T at most shape().tokens.
  // useFp8: each token is quantized (gin/ep/fp8.hpp) and travels and
  // arrives as FP8 (DeepEP's use_fp8): xFp8 and xScales instead of x.
  LlDispatched lowLatencyDispatch(const Inputs& in, bool useFp8 = false) {
    const Shape& sh = l_.shape;
    const int R = sh.ranks, L = sh.localExperts();
    const size_t H = size_t(sh.hidden), Tmax = size_t(maxTokens_), G = H / size_t(kFp8Group);
    const size_t T = checkTokens(in, true, "lowLatencyDispatch");
    checkFp8Hidden(useFp8, l_.shape.hidden, "lowLatencyDispatch");
    l_.shape.fp8 = useFp8;
    // Tokens past T choose no expert, so the layout is the same on every
    // rank whatever its T (DeepEP's num_max_dispatch_tokens_per_rank).
    Inputs padded = in;
    padded.x.resize(Tmax * H, 0);
    padded.idx.resize(Tmax * size_t(sh.topk), -1);
    padded.weight.resize(padded.idx.size(), 0.f);
    l_.topkIdx = padded.idx.data();
    const Plan p = plan(l_, true, padded);
    startLayer(comm_, l_, p);
    for (int e = 0; e < sh.experts; ++e) {
      llDispatchExpert(l_, e, 0, 1, gin::CoopThread{});
      for (int s = 0; s < sh.llSenders; ++s) llDispatchCount(l_, e, gin::CoopThread{});
    }
    if (!llWaitDispatch(l_, gin::CoopThread{})) failLayer(comm_, "low-latency dispatch");
    LlDispatched d;
    LlHandle& h = d.handle;
    h.tokens = int(T);
    h.arrivals = p.combineArrivals;
    h.count.assign(size_t(L), 0);
    h.range.assign(size_t(L) * size_t(R), 0);
    h.srcToken.assign(size_t(L) * size_t(R) * Tmax, -1);
    h.srcK.assign(h.srcToken.size(), -1);
    if (useFp8) {
      d.xFp8.assign(h.srcToken.size() * H, 0);
      d.xScales.assign(h.srcToken.size() * G, 0.f);
    } else {
      d.x.assign(h.srcToken.size() * H, 0);
    }
    const auto* counts = static_cast<const uint64_t*>(comm_.localPointer(l_.counts));
    for (int el = 0; el < L; ++el) {
      uint64_t begin = 0;
      for (int src = 0; src < R; ++src) {
        const uint64_t n = gin::volatileLoad(counts + size_t(el) * size_t(R) + size_t(src));
        h.range[size_t(el) * size_t(R) + size_t(src)] = begin << 32 | n;
        for (uint64_t q = 0; q < n; ++q) {
          const char* slot = static_cast<const char*>(comm_.localPointer(l_.ring, llSlot(sh, 0, el, src, size_t(q))));
          uint32_t tk[2];
          std::memcpy(tk, slot, 8);
          const size_t row = size_t(el) * size_t(R) * Tmax + size_t(begin + q);
          h.srcToken[row] = int(tk[0]);
          h.srcK[row] = int(tk[1]);
          if (useFp8) {
            std::memcpy(d.xFp8.data() + row * H, slot + 16, H);
            for (size_t g = 0; g < G; ++g)
              std::memcpy(d.xScales.data() + llScaleAt(sh, el, g, size_t(begin + q)), slot + 16 + H + g * 4, 4);
          } else {
            std::memcpy(d.x.data() + row * H, slot + 16, H * 2);
          }
        }
        begin += n;
      }
      h.count[size_t(el)] = int(begin);
    }
    settleLayer(comm_, l_);
    return d;
  }

  // DeepEP's zero-copy combine buffer: [L][R * Tmax][H] bf16 in the
  // buffer's own memory, where rows to peers that are not lsa-reachable are
  // staged. Expert outputs written there and passed to lowLatencyCombine as
  // y go out with no copy. Low-latency mode only.
  uint16_t* lowLatencyCombineBuffer() const {
    if (!ll_) throw std::invalid_argument("ep: lowLatencyCombineBuffer on a normal-mode buffer");
    return static_cast<uint16_t*>(comm_.localPointer(l_.partial));
  }

  // y: [L][R * Tmax][H] bf16, one row per packed row of the dispatch that
  // made `h` (rows past count[e] are not read), or lowLatencyCombineBuffer().
  // topkIdx/topkWeights: [T][K], those of that dispatch. Returns [T][H] bf16: per token the float sum of
  // its choices' rows, each times its weight (choices of -1 skipped).
  std::vector<uint16_t> lowLatencyCombine(const uint16_t* y, const int32_t* topkIdx, const float* topkWeights,
                                          const LlHandle& h) {
    const Shape& sh = l_.shape;
    const int R = sh.ranks, L = sh.localExperts();
    const size_t H = size_t(sh.hidden), Tmax = size_t(maxTokens_), T = size_t(h.tokens);
    if (!ll_) throw std::invalid_argument("ep: lowLatencyCombine on a normal-mode buffer; call combine");
    if (T > Tmax || h.count.size() != size_t(L) || h.srcToken.size() != size_t(L) * size_t(R) * Tmax)
      throw std::invalid_argument("ep: lowLatencyCombine was given a handle that no dispatch of this buffer made");
    gin::Net<> net(l_.dc, 0);
    net.resetSignal(l_.sig.combine());
    comm_.bootstrap().barrier();  // every rank's combine signal is zero before rows come back
    for (int el = 0; el < L; ++el)
      for (int src = 0; src < R; ++src) {
        // The pair's rows with no signal, then one SignalAdd for them all
        // (as a GPU block does; normal combine above signals every row).
        const uint64_t r = h.range[size_t(el) * size_t(R) + size_t(src)];
        const int ctx = (el * R + src) % l_.dc.nContexts;
        for (uint64_t q = r >> 32; q < (r >> 32) + (r & 0xffffffffu); ++q) {
          const size_t row = size_t(el) * size_t(R) * Tmax + size_t(q);
          returnRow(l_, src, llRowOffset(sh, size_t(h.srcToken[row]), size_t(h.srcK[row])), row, y + row * H, ctx,
                    gin::None{}, gin::CoopThread{});
        }
        if ((r & 0xffffffffu) != 0) rowsReturned(l_, src, r & 0xffffffffu, ctx, gin::CoopThread{});
      }
    if (!net.waitSignal(gin::CoopThread{}, l_.sig.combine(), h.arrivals)) failLayer(comm_, "low-latency combine");
    std::vector<uint16_t> out(T * H);
    const size_t K = size_t(sh.topk);
    for (size_t t = 0; t < T; ++t)
      sumRows(combineRows(llRowOffset(sh, t, 0)), H, sh.topk, topkIdx + t * K, topkWeights + t * K, nullptr, nullptr,
              out.data() + t * H, gin::CoopThread{});
    settleLayer(comm_, l_);
    return out;
  }

 private:
  gin::Comm& comm_;
  int maxTokens_;
  bool ll_;
  Layer l_;

  // This rank's combine window from byte offset `at`, as bf16 rows.
  const uint16_t* combineRows(size_t at) const {
    return static_cast<const uint16_t*>(comm_.localPointer(l_.combine, at));
  }

  void checkCached(size_t got, size_t want, const Handle& h, const char* what, const char* unit) const {
    if (ll_)
      throw std::invalid_argument("ep: dispatch on a low-latency buffer; build the buffer with lowLatency = false");
    if (h.tokens > maxTokens_ || got != want || h.sent.rows.size() != size_t(h.tokens))
      throw std::invalid_argument("ep: a cached dispatch needs the handle of a dispatch of this buffer and " +
                                  std::string(what) + std::to_string(h.tokens) + unit);
  }

  // A cached dispatch of tokens packed for l_.shape (tokens and fp8 set).
  Dispatched cachedDispatch(std::vector<char> packed, const Handle& h) {
    const size_t H = size_t(l_.shape.hidden), n = h.srcRank.size();
    Plan p = h.sent;
    p.x = std::move(packed);
    startLayer(comm_, l_, p);
    std::vector<int> srcOf;
    std::vector<uint64_t> fromLane = h.fromLane;
    const size_t got = size_t(dispatchNormalCpu(comm_, l_, p, size_t(l_.shape.ranks) * size_t(maxTokens_),
                                                recvX_.data(), recvMeta_.data(), srcOf, fromLane, true));
    settleLayer(comm_, l_);
    if (got != n)
      failLayer(comm_, "a cached dispatch received " + std::to_string(got) + " rows, its handle " + std::to_string(n) +
                           ": every rank must pass a handle of the same dispatch");
    Dispatched d;
    d.handle = h;
    if (l_.shape.fp8)
      splitFp8Rows(n, d.xFp8, d.xScales);
    else
      d.x.assign(recvX_.begin(), recvX_.begin() + std::ptrdiff_t(n * H));
    return d;
  }

  // The first n received FP8 rows (rowBytes each) as [n][H] e4m3 and [n][H / 128] scales.
  void splitFp8Rows(size_t n, std::vector<uint8_t>& data, std::vector<float>& scales) const {
    const size_t H = size_t(l_.shape.hidden), G = H / size_t(kFp8Group), B = l_.shape.rowBytes();
    const char* rows = reinterpret_cast<const char*>(recvX_.data());
    data.resize(n * H);
    scales.resize(n * G);
    for (size_t i = 0; i < n; ++i)
      splitFp8Row(gin::CoopThread{}, rows + i * B, data.data() + i * H, scales.data() + i * G, H);
  }

  // T of `in`, checked against the buffer and its mode.
  size_t checkTokens(const Inputs& in, bool lowLatency, const char* call) const {
    if (lowLatency != ll_)
      throw std::invalid_argument(std::string("ep: ") + call + " on a " + (ll_ ? "low-latency" : "normal-mode") +
                                  " buffer; build the buffer with lowLatency = " + (lowLatency ? "true" : "false"));
    const size_t T = in.idx.size() / size_t(l_.shape.topk);
    if (T > size_t(maxTokens_))
      throw std::invalid_argument(std::string("ep: ") + call + " of " + std::to_string(T) +
                                  " tokens; the buffer takes at most " + std::to_string(maxTokens_) +
                                  " (Shape::tokens)");
    return T;
  }
  std::vector<uint16_t> recvX_;
  std::vector<char> recvMeta_;
};

}  // namespace gin::ep
