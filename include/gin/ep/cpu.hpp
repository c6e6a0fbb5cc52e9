// gin/ep/cpu.hpp — the expert-parallel layer of gin/ep/layer.hpp driven by a CPU rank
// (one thread per rank; the same device bodies a GPU runs), its inputs, and
// the host reference it is checked against.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gin/ep/layer.hpp"
#include "gin/gin.hpp"

namespace gin::ep {

struct Inputs {
  std::vector<uint16_t> x;    // [T][H] bf16
  // FP8 tokens instead (normal-mode dispatch of CpuBuffer; x stays empty):
  // [T][H] e4m3 and [T][H / 128] scales (gin/ep/fp8.hpp).
  std::vector<uint8_t> xFp8;
  std::vector<float> xScales;
  std::vector<int32_t> idx;   // [T][K] distinct experts; -1: no expert (the choice is masked, as in DeepEP)
  std::vector<float> weight;  // [T][K] (ignored where idx is -1)
};

// Random tokens and routing; each choice is -1 with probability `noExpert`
// (its weight left nonzero, so a reduction that does not skip it is wrong).
inline Inputs makeInputs(const Shape& sh, int rank, uint64_t seed, double noExpert = 0) {
  std::mt19937_64 g(seed * 1000003u + uint64_t(rank));
  Inputs in;
  in.x.resize(size_t(sh.tokens) * sh.hidden);
  for (auto& v : in.x) v = floatToBf16(std::uniform_real_distribution<float>(-2.f, 2.f)(g));
  in.idx.resize(size_t(sh.tokens) * sh.topk);
  in.weight.resize(in.idx.size());
  std::vector<int32_t> all(size_t(sh.experts));
  for (int e = 0; e < sh.experts; ++e) all[size_t(e)] = e;
  for (int t = 0; t < sh.tokens; ++t) {
    std::shuffle(all.begin(), all.end(), g);
    float sum = 0;
    for (int k = 0; k < sh.topk; ++k) {
      in.idx[size_t(t) * sh.topk + k] = all[size_t(k)];
      sum += in.weight[size_t(t) * sh.topk + k] = std::uniform_real_distribution<float>(0.1f, 1.f)(g);
    }
    for (int k = 0; k < sh.topk; ++k) {
      in.weight[size_t(t) * sh.topk + k] /= sum;
      if (noExpert > 0 && std::uniform_real_distribution<double>(0, 1)(g) < noExpert)
        in.idx[size_t(t) * sh.topk + k] = -1;
    }
  }
  return in;
}

// Every expert index of idx [tokens][K] is -1 or in [0, experts):
// std::invalid_argument naming the first one that is not.
inline void checkIndices(const Shape& sh, const int32_t* idx) {
  for (size_t i = 0; i < size_t(sh.tokens) * size_t(sh.topk); ++i)
    if (idx[i] < -1 || idx[i] >= sh.experts)
      throw std::invalid_argument("moe: token " + std::to_string(i / size_t(sh.topk)) + " choice " +
                                  std::to_string(i % size_t(sh.topk)) + " names expert " + std::to_string(idx[i]) +
                                  "; expert indices are -1 (no expert) or in [0, " + std::to_string(sh.experts) + ")");
}

// The sizes of `in` and its indices (checkIndices).
inline void checkRouting(const Shape& sh, const Inputs& in) {
  const size_t T = size_t(sh.tokens), H = size_t(sh.hidden);
  const bool tokensOk = sh.fp8 && !in.xFp8.empty()
                            ? in.xFp8.size() == T * H && in.xScales.size() == T * (H / size_t(kFp8Group))
                            : in.x.size() == T * H;
  if (in.idx.size() != T * size_t(sh.topk) || in.weight.size() != in.idx.size() || !tokensOk)
    throw std::invalid_argument("moe: inputs must hold tokens x hidden values (FP8: and tokens x hidden / 128 "
                                "scales) and tokens x topk indices and weights");
  checkIndices(sh, in.idx.data());
}

// out[t] = sum_k weight[t][k] * expert_{idx[t][k]}(x[t]), in double.
inline std::vector<double> reference(const Shape& sh, const Inputs& in) {
  std::vector<double> out(size_t(sh.tokens) * sh.hidden, 0.0);
  for (int t = 0; t < sh.tokens; ++t)
    for (int k = 0; k < sh.topk; ++k) {
      if (in.idx[size_t(t) * sh.topk + k] < 0) continue;
      const double w = in.weight[size_t(t) * sh.topk + k], s = expertScale(in.idx[size_t(t) * sh.topk + k]);
      for (int i = 0; i < sh.hidden; ++i)
        out[size_t(t) * sh.hidden + i] += w * s * bf16ToFloat(in.x[size_t(t) * sh.hidden + i]);
    }
  return out;
}

// Outputs that differ from the reference by more than a relative 1e-5 (the
// sums run in another order than the reference's); *first: the first one.
inline size_t mismatches(const std::vector<float>& out, const std::vector<double>& ref, size_t* first) {
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(std::fabs(double(out[i]) - ref[i]) <= 1e-5 * (std::fabs(ref[i]) + 1.0)) && bad++ == 0) *first = i;
  return out.size() == ref.size() ? bad : bad + 1;
}

// ---- host side shared by CpuLayer and GpuLayer ----------------------------------

// What one layer of this rank puts to each rank (itself included), in units:
// normal mode sends each (token, destination rank) once (metadata + token),
// low-latency mode each (token, expert) ({t, k} record + token); combine
// returns one float row of H per unit received. units[d] * dispatchUnitBytes
// is what the dispatch puts to d, and d's combine puts as many rows back.
// gin-bench moe counts the bytes moved with it and gives an NCCL all-to-all
// the same bytes per peer.
inline std::vector<uint64_t> dispatchUnits(const Shape& sh, const Inputs& in, bool ll) {
  std::vector<uint64_t> units(size_t(sh.ranks), 0);
  const int L = sh.localExperts();
  for (size_t t = 0; t < size_t(sh.tokens); ++t) {
    uint64_t hit = 0;  // normal mode: one unit per destination rank (ranks <= 64)
    for (size_t k = 0; k < size_t(sh.topk); ++k) {
      if (in.idx[t * size_t(sh.topk) + k] < 0) continue;
      const int d = in.idx[t * size_t(sh.topk) + k] / L;
      if (ll)
        units[size_t(d)] += 1;
      else
        hit |= 1ull << d;
    }
    for (int d = 0; !ll && d < sh.ranks; ++d) units[size_t(d)] += (hit >> d) & 1;
  }
  return units;
}
inline size_t dispatchUnitBytes(const Shape& sh, bool ll) {
  return ll ? llSlotBytes(sh) : sh.metaBytes() + sh.tokenBytes();
}
inline size_t combineUnitBytes(const Shape& sh) { return size_t(sh.hidden) * 4; }

// The normal-mode count window: [R][C] words (what each (source, channel)
// sends here), then GpuBuffer's sync-free exchange (countsAt).
inline size_t countsBytes(const Shape& sh) {
  return size_t(sh.ranks) * sh.channels * 8 + 2 * size_t(sh.ranks) * (size_t(sh.channels) + sh.ranks) * 8;
}
// Where source `src`'s words of a sync-free exchange of round parity `parity`
// start in the count window: its C lane counts to this rank, then R words,
// the rows it sends to each rank.
GIN_HD inline size_t countsAt(const Shape& sh, int parity, int src) {
  const size_t R = size_t(sh.ranks), C = size_t(sh.channels);
  return (R * C + (size_t(parity) * R + size_t(src)) * (C + R)) * 8;
}

inline uint32_t signalsNeeded(const Shape& sh) {
  const uint32_t normal = 2 + uint32_t(2 * sh.ranks * sh.channels + 2 * sh.ranks);  // ..., summed(R), sfCount(R)
  const uint32_t ll = 2 + uint32_t(sh.localExperts() * sh.ranks + sh.ranks);  // ..., llCount, llSummed(R)
  return normal > ll ? normal : ll;
}

// Checks the shape against the communicator and allocates the layer's
// windows (collective). Signals [sigBase, sigBase + signalsNeeded) are the layer's.
inline Layer openLayer(gin::Comm& comm, const Shape& sh, bool ll, uint32_t sigBase) {
  if (sh.ranks != comm.nRanks()) throw std::invalid_argument("moe: shape.ranks must be the communicator's size");
  if (sh.experts % sh.ranks != 0 || sh.topk < 1 || sh.topk > sh.experts || sh.topk > kMaxTopk)
    throw std::invalid_argument("moe: experts must be a multiple of ranks and 1 <= topk <= min(experts, 16)");
  if (sh.tokens < 0 || sh.hidden < 1 || sh.channels < 1 || sh.slots < 1 || sh.batch < 1 || sh.llSenders < 1)
    throw std::invalid_argument("moe: tokens >= 0, hidden, channels, slots, batch and llSenders >= 1");
  if (sh.ranks > 64) throw std::invalid_argument("moe: at most 64 ranks");
  if (sh.tokens >= (1 << 24)) throw std::invalid_argument("moe: fewer than 2^24 tokens per rank");
  if (sigBase + signalsNeeded(sh) > uint32_t(comm.devComm().nSignals))
    throw std::invalid_argument("moe: needs " + std::to_string(signalsNeeded(sh)) +
                                " signals; raise CommConfig::nSignals");
  const size_t T = size_t(sh.tokens), R = size_t(sh.ranks), C = size_t(sh.channels), L = size_t(sh.localExperts());
  const size_t H = size_t(sh.hidden), K = size_t(sh.topk), D = size_t(sh.maxDests());
  auto win = [&](size_t bytes) { return comm.allocWindow(std::max<size_t>(bytes, 16)); };
  Layer l{};
  l.dc = comm.devComm();
  l.shape = sh;
  l.sig = Signals{sigBase, sh.ranks, sh.channels, sh.localExperts()};
  l.x = win(T * sh.tokenBytes());
  l.meta = win(ll ? T * K * 16 : T * D * sh.metaBytes());
  l.ring = win(ll ? 2 * L * R * T * llSlotStride(sh) : R * C * size_t(sh.slots) * sh.slotBytes());
  l.counts = win(ll ? 2 * L * R * 8 : countsBytes(sh));
  l.combine = win(ll ? T * K * H * 4 : T * D * H * 4);
  l.partial = win(ll ? L * R * T * H * 4 : R * T * H * 4);
  return l;
}

// Deregisters the layer's windows (collective). For destructors, so it never
// throws: deregistering fails where a rank left after an error, and a
// throwing destructor ends the process; the error is printed, not lost.
inline void closeLayer(gin::Comm& comm, const Layer& l) noexcept {
  try {
    for (gin::Window w : {l.x, l.meta, l.ring, l.counts, l.combine, l.partial}) comm.deregisterWindow(w);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe: closing the layer of rank %d: %s\n", comm.rank(), e.what());
  }
}

// What a rank prepares before a layer: the tokens laid out in slots, the
// metadata of each (token, destination) (normal) or (token, k) (low latency),
// what each sender puts (its list and count), and per token the number of
// combine rows it will get back.
struct Plan {
  std::vector<char> x;              // [T][tokenBytes]
  std::vector<char> meta;           // the meta window's contents
  std::vector<int> rows;            // [T] (normal)
  std::vector<uint32_t> sendList;   // Layer::sendList's contents
  std::vector<uint64_t> sendCount;  // Layer::sendCount's (normal: also the counts each destination gets)
  uint64_t combineArrivals = 0;
};

// FP8 rows need a hidden size of whole scale groups (checked before a call).
inline void checkFp8Hidden(bool fp8, int hidden, const char* call) {
  if (fp8 && hidden % kFp8Group != 0)
    throw std::invalid_argument(std::string("ep: ") + call + " in FP8 needs a hidden size that is a multiple of " +
                                std::to_string(kFp8Group) + " (one scale per " + std::to_string(kFp8Group) +
                                " values); hidden is " + std::to_string(hidden));
}

// x [T][H] bf16 laid out in slots of tokenBytes (the x window's contents);
// with sh.fp8, each quantized to its FP8 row (quantizeRow).
inline std::vector<char> packTokens(const Shape& sh, const uint16_t* x) {
  const size_t T = size_t(sh.tokens), H = size_t(sh.hidden);
  std::vector<char> out(T * sh.tokenBytes(), 0);
  for (size_t t = 0; t < T; ++t) {
    if (sh.fp8)
      quantizeRow(x + t * H, H, out.data() + t * sh.tokenBytes(), 0, 1);
    else
      std::memcpy(out.data() + t * sh.tokenBytes(), x + t * H, H * 2);
  }
  return out;
}

// FP8 tokens (data [T][H] e4m3, scales [T][H / 128]) laid out in slots of
// tokenBytes as their FP8 rows (sh.fp8).
inline std::vector<char> packFp8Tokens(const Shape& sh, const uint8_t* data, const float* scales) {
  const size_t T = size_t(sh.tokens), H = size_t(sh.hidden), G = H / size_t(kFp8Group);
  std::vector<char> out(T * sh.tokenBytes(), 0);
  for (size_t t = 0; t < T; ++t)
    joinFp8Row(gin::CoopThread{}, out.data() + t * sh.tokenBytes(), data + t * H, scales + t * G, H);
  return out;
}

// The plan without the tokens (Plan::x empty) from the routing alone: idx
// and weight [T][K] on the host (T = l.shape.tokens).
inline Plan planRouting(const Layer& lIn, bool ll, const int32_t* idx, const float* weight) {
  checkIndices(lIn.shape, idx);
  Layer l = lIn;
  l.topkIdx = idx;
  const Shape& sh = l.shape;
  const size_t T = size_t(sh.tokens), K = size_t(sh.topk), D = size_t(sh.maxDests());
  const int R = sh.ranks, C = sh.channels;
  Plan p;
  if (ll) {
    p.meta.assign(T * K * 16, 0);
    for (size_t t = 0; t < T; ++t)
      for (size_t k = 0; k < K; ++k) {
        const uint32_t tk[2] = {uint32_t(t), uint32_t(k)};
        std::memcpy(p.meta.data() + (t * K + k) * 16, tk, 8);
      }
    p.sendList.assign(std::max<size_t>(size_t(sh.experts) * T, 1), 0);
    p.sendCount.assign(size_t(sh.experts), 0);
    for (size_t t = 0; t < T; ++t)
      for (size_t k = 0; k < K; ++k) {
        if (idx[t * K + k] < 0) continue;  // no expert: nothing sent, nothing comes back
        const size_t e = size_t(idx[t * K + k]);
        p.sendList[e * T + p.sendCount[e]++] = uint32_t(t) | uint32_t(k) << 24;
        p.combineArrivals += 1;
      }
    return p;
  }
  p.meta.assign(T * D * sh.metaBytes(), 0);
  p.rows.assign(T, 0);
  p.sendList.assign(std::max<size_t>(size_t(C) * R * sh.laneCap(), 1), 0);
  p.sendCount.assign(size_t(C) * R, 0);
  for (size_t t = 0; t < T; ++t)
    for (int d = 0; d < R; ++d) {
      const int j = destSlot(l, int(t), d);
      if (j < 0) continue;
      const size_t lane = (t / sh.laneCap()) * size_t(R) + size_t(d);  // channel c: tokens [c, c + 1) x laneCap
      p.sendList[lane * sh.laneCap() + p.sendCount[lane]++] = uint32_t(t) | uint32_t(j) << 24;
      p.rows[t] += 1;
      p.combineArrivals += 1;
      TokenMeta m{};
      m.srcToken = uint32_t(t);
      m.combineSlot = uint32_t(j);
      for (int k = 0; k < sh.topk; ++k) {
        const int e = idx[t * K + size_t(k)];
        if (e < 0 || e / sh.localExperts() != d) continue;
        m.pick[m.nLocal].localExpert = e % sh.localExperts();
        m.pick[m.nLocal].weight = weight[t * K + size_t(k)];
        m.nLocal += 1;
        m.choices |= 1u << k;
      }
      std::memcpy(p.meta.data() + (t * D + size_t(j)) * sh.metaBytes(), &m, sh.metaBytes());
    }
  return p;
}

// The plan of `in` (its sizes checked), tokens included.
inline Plan plan(const Layer& l, bool ll, const Inputs& in) {
  checkRouting(l.shape, in);
  Plan p = planRouting(l, ll, in.idx.data(), in.weight.data());
  p.x = l.shape.fp8 && !in.xFp8.empty() ? packFp8Tokens(l.shape, in.xFp8.data(), in.xScales.data())
                                        : packTokens(l.shape, in.x.data());
  return p;
}

// ---- CPU-rank drivers: CpuLayer (stand-in experts) and CpuBuffer (gin/ep/buffer.hpp) ----

// A failure of this rank's layer: the device error if there is one (it names
// itself), else std::runtime_error with `what`.
[[noreturn]] inline void failLayer(gin::Comm& comm, const std::string& what) {
  comm.check();
  throw std::runtime_error("moe: rank " + std::to_string(comm.rank()) + ": " + what);
}

// The plan's tokens and metadata into the layer's windows, its send lists
// into `l`, every signal of the layer back to zero on this rank, then a
// barrier: nobody signals before every rank has reset (collective).
inline void startLayer(gin::Comm& comm, Layer& l, const Plan& p) {
  l.sendList = p.sendList.data();
  l.sendCount = p.sendCount.data();
  // Empty vectors (no metadata, no tokens) have no data() to copy from:
  // memcpy from a null pointer is undefined even for 0 bytes.
  if (!p.x.empty()) std::memcpy(comm.localPointer(l.x), p.x.data(), p.x.size());
  if (!p.meta.empty()) std::memcpy(comm.localPointer(l.meta), p.meta.data(), p.meta.size());
  gin::Net<> net(l.dc, 0);
  for (uint32_t s = l.sig.base; s < l.sig.base + signalsNeeded(l.shape); ++s) net.resetSignal(s);
  comm.bootstrap().barrier();
}

// Everything this rank pushed carried out (proxy, ibgda) before any rank
// resets the layer's signals again, then check() (collective).
inline void settleLayer(gin::Comm& comm, const Layer& l) {
  for (int c = 0; c < l.dc.nContexts; ++c) gin::Net<>(l.dc, c).flush(gin::CoopThread{});
  comm.bootstrap().barrier();
  comm.check();
}

// Normal-mode dispatch on one CPU rank, after startLayer: the count exchange,
// then every lane's sender and every (source, channel) receiver stepped in
// turn until all are done. What arrives goes to recvX [maxRecv][H] and
// recvMeta [maxRecv][metaBytes], by (source, channel); srcOf gets each
// position's source, fromLane [R][C] how many each (source, channel) sent.
// With `cached`, fromLane holds those counts already (a repeated layout) and
// the exchange is skipped. Returns how many arrived.
inline uint64_t dispatchNormalCpu(gin::Comm& comm, const Layer& l, const Plan& p, size_t maxRecv, void* recvX,
                                  char* recvMeta, std::vector<int>& srcOf, std::vector<uint64_t>& fromLane,
                                  bool cached = false) {
  const Shape& sh = l.shape;
  const int R = sh.ranks, C = sh.channels, me = comm.rank();
  gin::Net<> net(l.dc, 0);
  const gin::Team world = gin::teamWorld(l.dc);
  if (!cached) {
    for (int d = 0; d < R; ++d)
      for (int c = 0; c < C; ++c) {
        const size_t at = (size_t(me) * C + size_t(c)) * 8;
        const uint64_t n = p.sendCount[size_t(c) * R + size_t(d)];  // lane (c, d)'s tokens
        if (c + 1 < C)
          net.putValue(world, d, l.counts, at, n, gin::None{});
        else
          net.putValue(world, d, l.counts, at, n, gin::SignalAdd{l.sig.count(), 1});
      }
    if (!net.waitSignal(gin::CoopThread{}, l.sig.count(), uint64_t(R))) failLayer(comm, "count exchange");
    const auto* got = static_cast<const uint64_t*>(comm.localPointer(l.counts));
    fromLane.assign(size_t(R) * C, 0);
    for (size_t i = 0; i < fromLane.size(); ++i) fromLane[i] = gin::volatileLoad(got + i);
  } else if (fromLane.size() != size_t(R) * C) {
    throw std::invalid_argument("ep: a cached layout of another shape");
  }
  std::vector<RecvState> rs(size_t(R) * C);
  srcOf.clear();
  uint64_t base = 0;
  for (int src = 0; src < R; ++src)
    for (int c = 0; c < C; ++c) {
      RecvState& s = rs[size_t(src) * C + size_t(c)];
      s.expect = fromLane[size_t(src) * C + size_t(c)];
      s.base = base;
      base += s.expect;
      if (base > maxRecv) failLayer(comm, "more tokens announced than any rank can send");
      srcOf.insert(srcOf.end(), size_t(s.expect), src);
    }
  std::vector<SendState> ss(size_t(C) * size_t(R));  // lane (c, d) at [c * R + d]
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(l.dc.timeoutNs);
  for (;;) {
    bool busy = false, progress = false;
    for (int c = 0; c < C; ++c)
      for (int d = 0; d < R; ++d) {
        const int r = sendStep(l, c, d, ss[size_t(c) * R + size_t(d)], gin::CoopThread{});
        busy = busy || r >= 0;
        progress = progress || r > 0;
      }
    for (int src = 0; src < R; ++src)
      for (int c = 0; c < C; ++c) {
        const int r = recvStep(l, src, c, rs[size_t(src) * C + size_t(c)], recvX, recvMeta, gin::CoopThread{});
        busy = busy || r >= 0;
        progress = progress || r > 0;
      }
    if (!busy) break;
    if (!progress) {
      if (comm.hasError()) failLayer(comm, "dispatch");
      if (std::chrono::steady_clock::now() > deadline) failLayer(comm, "dispatch did not finish within the timeout");
      std::this_thread::yield();
    }
  }
  return base;
}

// Runs layers on one CPU rank. Collective: every rank constructs it and calls
// run() the same number of times with the same shape. Signals [sigBase,
// sigBase + signalsNeeded(shape)) of the communicator are the layer's.
class CpuLayer {
 public:
  CpuLayer(gin::Comm& comm, const Shape& sh, bool lowLatency, uint32_t sigBase = 0)
      : comm_(comm), sh_(sh), ll_(lowLatency), l_(openLayer(comm, sh, lowLatency, sigBase)) {
    if (!ll_) {
      recvX_.resize(size_t(sh.ranks) * size_t(sh.tokens) * size_t(sh.hidden));
      recvMeta_.resize(size_t(sh.ranks) * size_t(sh.tokens) * sh.metaBytes());
    }
  }
  CpuLayer(const CpuLayer&) = delete;
  CpuLayer& operator=(const CpuLayer&) = delete;
  ~CpuLayer() { closeLayer(comm_, l_); }

  // Dispatch, experts, combine. Returns out[T][H] (float).
  std::vector<float> run(const Inputs& in) {
    l_.topkIdx = in.idx.data();
    l_.topkW = in.weight.data();
    const Plan p = plan(l_, ll_, in);
    startLayer(comm_, l_, p);
    t0_ = Clock::now();
    std::vector<float> out = ll_ ? runLowLatency(in, p) : runNormal(p);
    timing_.combineS = seconds(t1_, Clock::now());
    timing_.dispatchS = seconds(t0_, t1_);
    settleLayer(comm_, l_);
    return out;
  }

  // Seconds of the last run()'s phases on this rank's thread: dispatch (from
  // the start, after the resets, until every token sent to this rank is
  // here) and combine (experts, the returns, the weighted sums).
  struct Timing {
    double dispatchS = 0, combineS = 0;
  };
  const Timing& timing() const { return timing_; }

 private:
  using Clock = std::chrono::steady_clock;
  gin::Comm& comm_;
  Shape sh_;
  bool ll_;
  Layer l_;
  Clock::time_point t0_, t1_;
  Timing timing_;

  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  std::vector<uint16_t> recvX_;
  std::vector<char> recvMeta_;

  void fail(const std::string& what) { failLayer(comm_, what); }

  std::vector<float> runNormal(const Plan& p) {
    const Shape& sh = sh_;
    const size_t T = size_t(sh.tokens), H = size_t(sh.hidden), D = size_t(sh.maxDests());
    gin::Net<> net(l_.dc, 0);
    std::vector<int> srcOf;
    std::vector<uint64_t> fromLane;
    const uint64_t base =
        dispatchNormalCpu(comm_, l_, p, size_t(sh.ranks) * T, recvX_.data(), recvMeta_.data(), srcOf, fromLane);
    t1_ = Clock::now();
    // Experts, then combine straight into the sources' buffers.
    float* partial = static_cast<float*>(comm_.localPointer(l_.partial));
    for (size_t pos = 0; pos < base; ++pos)
      expertAndReturn(l_, pos, srcOf[pos], recvX_.data(), recvMeta_.data(), partial, gin::CoopThread{});
    if (!net.waitSignal(gin::CoopThread{}, l_.sig.combine(), p.combineArrivals)) fail("combine");
    std::vector<float> out(T * H, 0.f);
    const float* comb = static_cast<const float*>(comm_.localPointer(l_.combine));
    for (size_t t = 0; t < T; ++t)
      for (int j = 0; j < p.rows[t]; ++j)
        for (size_t i = 0; i < H; ++i) out[t * H + i] += comb[(t * D + size_t(j)) * H + i];
    return out;
  }

  std::vector<float> runLowLatency(const Inputs& in, const Plan& p) {
    const Shape& sh = sh_;
    const size_t T = size_t(sh.tokens), H = size_t(sh.hidden), K = size_t(sh.topk);
    // Each expert's pairs: llSenders senders of two shares each, as a GPU
    // splits them among CTAs and their warps.
    for (int e = 0; e < sh.experts; ++e)
      for (int snd = 0; snd < sh.llSenders; ++snd) {
        for (int part = 0; part < 2; ++part)
          llDispatchExpert(l_, e, snd * 2 + part, sh.llSenders * 2, gin::CoopThread{});
        llDispatchCount(l_, e, gin::CoopThread{});
      }
    if (!llWaitDispatch(l_, gin::CoopThread{})) fail("low-latency dispatch");
    t1_ = Clock::now();
    for (int el = 0; el < sh.localExperts(); ++el)
      for (int src = 0; src < sh.ranks; ++src)
        for (int part = 0; part < 3; ++part)
          if (!llExpertAndCombine(l_, el, src, part, 3, gin::CoopThread{})) fail("low-latency dispatch");
    gin::Net<> net(l_.dc, 0);
    if (!net.waitSignal(gin::CoopThread{}, l_.sig.combine(), p.combineArrivals)) fail("low-latency combine");
    std::vector<float> out(T * H, 0.f);
    const float* comb = static_cast<const float*>(comm_.localPointer(l_.combine));
    for (size_t t = 0; t < T; ++t)
      for (size_t k = 0; k < K; ++k)
        if (in.idx[t * K + k] >= 0)
          for (size_t i = 0; i < H; ++i) out[t * H + i] += in.weight[t * K + k] * comb[(t * K + k) * H + i];
    return out;
  }
};

}  // namespace gin::ep
