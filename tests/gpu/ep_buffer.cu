// GPU suite: gin::ep::GpuBuffer (gin/ep/gpu_buffer.hpp), DeepEP's Buffer on
// GPU ranks, checked by the checks of CpuBuffer's CPU-rank tests
// (tests/common/ep_buffer_checks.hpp) through HostFace, which gives the GPU
// buffer CpuBuffer's host-vector calls: inputs uploaded, outputs and handles
// read back, each call run on the GPU. 1, 2, 3 and 4 ranks (sharing GPUs
// round-robin), both modes, lsa and the proxy, hidden sizes 256 and 7168,
// choices of -1, token counts that differ per rank (0 included), expert
// alignment; FP8 rounds (rows and scales byte for byte, low-latency
// quantization bit for bit against the CPU encoder); one rank with too many
// tokens or a bad expert failing every rank alike (normal mode), a bad
// expert in low latency stopping every rank's next calls; low-latency calls
// queued with no host synchronization (two dispatches in flight, int32 and
// int64 indices, FP8 rounds among bf16 ones, a failing allocator, a buffer
// made again on the same communicator); receive hooks (deferReceive);
// sync-free normal dispatches
// (worstTokens: the checks above through padded results, mixed with
// synchronizing ones; calls queued with no synchronization, two dispatches
// before their combines, cached dispatches; more rows than worstTokens
// stopping every rank). Skips (exit 77) without a GPU.
#include <catch2/catch_session.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/ep_buffer_checks.hpp"
#include "gin/ep/gpu_buffer.hpp"
#include "gpu_common.cuh"

using namespace gin;

// What the std::invalid_argument that call() throws says ("" if none).
template <class F>
std::string refusal(F call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

namespace {

// GpuBuffer behind CpuBuffer's calls (host vectors in and out).
class HostFace {
 public:
  HostFace(Comm& comm, const gin::ep::Shape& sh, bool ll, cudaStream_t st)
      : sh_(sh), rank_(comm.rank()), st_(st), buf_(comm, sh, ll, st) {}

  gin::ep::Shape shape() const { return buf_.shape(); }
  // Normal dispatches from now on: sync-free with this worstTokens (0: not).
  void syncFree(int worst) { worst_ = worst; }

  struct Handle {
    int tokens = 0;
    std::vector<int> srcRank, srcToken, rows;  // the received rows only (a sync-free one's padding checked, cut)
    gin::ep::GpuHandle gpu;
  };
  struct Dispatched {
    std::vector<uint16_t> x;
    std::vector<uint8_t> xFp8;
    std::vector<float> xScales;
    std::vector<int32_t> topkIdx;
    std::vector<float> topkWeights;
    std::vector<int> tokensPerExpert;
    Handle handle;
  };
  struct LlHandle {
    int tokens = 0;
    std::vector<int> count, srcToken, srcK;
    std::vector<uint64_t> range;
    gin::ep::GpuLlHandle gpu;
  };
  struct LlDispatched {
    std::vector<uint16_t> x;
    std::vector<uint8_t> xFp8;
    std::vector<float> xScales;
    LlHandle handle;
  };

  Dispatched dispatch(const gin::ep::Inputs& in, int align) {
    const int T = int(in.idx.size() / size_t(sh_.topk));
    auto x = up(in.x);
    auto xFp8 = up(in.xFp8);
    auto xScales = up(in.xScales);
    auto idx = up(in.idx);
    auto w = up(in.weight);
    gin::ep::GpuDispatched g =
        in.xFp8.empty() ? buf_.dispatch(x.data(), idx.data(), w.data(), T, align, worst_)
                        : buf_.dispatch(gin::ep::Fp8Tokens{xFp8.data(), xScales.data()}, idx.data(), w.data(), T,
                                        align, worst_);
    Dispatched d;
    d.x = g.x.toHost();
    d.xFp8 = g.xFp8.toHost();
    d.xScales = g.xScales.toHost();
    d.topkIdx = g.topkIdx.toHost();
    d.topkWeights = g.topkWeights.toHost();
    d.tokensPerExpert = g.tokensPerExpert;
    d.handle = face(g.handle);
    if (g.handle.syncFree) {
      // worst_ rows: the received ones, then padding; the per-expert counts
      // (not returned) counted here from the top-k.
      const size_t n = d.handle.srcRank.size(), K = size_t(sh_.topk), H = size_t(sh_.hidden);
      gintest::expect(g.topkIdx.size() == size_t(worst_) * K && g.tokensPerExpert.empty(),
                      "a sync-free dispatch returns worstTokens rows and no per-expert counts");
      for (size_t i = n * K; i < d.topkIdx.size(); ++i)
        gintest::expect(d.topkIdx[i] == -1 && d.topkWeights[i] == 0.f, "a padding row chooses no expert");
      d.topkIdx.resize(n * K);
      d.topkWeights.resize(n * K);
      if (!d.x.empty()) d.x.resize(n * H);
      if (!d.xFp8.empty()) d.xFp8.resize(n * H), d.xScales.resize(n * (H / 128));
      d.tokensPerExpert.assign(size_t(sh_.experts / sh_.ranks), 0);
      for (int32_t e : d.topkIdx)
        if (e >= 0) d.tokensPerExpert[size_t(e)] += 1;
      for (int& c : d.tokensPerExpert) c = (c + align - 1) / align * align;
    }
    return d;
  }
  Dispatched dispatch(const std::vector<uint16_t>& xs, const Handle& h) {
    auto x = up(xs);
    gin::ep::GpuDispatched g = buf_.dispatch(x.data(), h.gpu);
    gintest::expect(g.topkIdx.empty() && g.topkWeights.empty() && g.tokensPerExpert.empty(),
           "a cached dispatch returns no top-k");
    Dispatched d;
    d.x = g.x.toHost();
    d.handle = face(g.handle);
    d.x.resize(d.handle.srcRank.size() * size_t(sh_.hidden));  // a sync-free one's padding cut
    return d;
  }
  Dispatched dispatch(const std::vector<uint8_t>& xFp8, const std::vector<float>& xScales, const Handle& h) {
    auto x = up(xFp8);
    auto s = up(xScales);
    gin::ep::GpuDispatched g = buf_.dispatch(gin::ep::Fp8Tokens{x.data(), s.data()}, h.gpu);
    gintest::expect(g.x.empty() && g.topkIdx.empty(), "an FP8 cached dispatch returns FP8 rows and no top-k");
    Dispatched d;
    d.xFp8 = g.xFp8.toHost();
    d.xScales = g.xScales.toHost();
    d.handle = face(g.handle);
    d.xFp8.resize(d.handle.srcRank.size() * size_t(sh_.hidden));  // a sync-free one's padding cut
    d.xScales.resize(d.handle.srcRank.size() * size_t(sh_.hidden / 128));
    return d;
  }
  std::vector<uint16_t> combine(const uint16_t* y, const Handle& h, const uint16_t* b0 = nullptr,
                                const uint16_t* b1 = nullptr) {
    const size_t H = size_t(sh_.hidden), T = size_t(h.tokens);
    std::vector<uint16_t> ys(y, y + h.srcRank.size() * H);
    ys.resize(h.gpu.received() * H, 0x7fc0);  // a sync-free handle's padding rows: NaN, never returned
    auto yd = up(ys);
    gin::ep::DeviceArray<uint16_t> b0d, b1d;
    if (b0) b0d = up(std::vector<uint16_t>(b0, b0 + T * H));
    if (b1) b1d = up(std::vector<uint16_t>(b1, b1 + T * H));
    return buf_.combine(yd.data(), h.gpu, b0 ? b0d.data() : nullptr, b1 ? b1d.data() : nullptr).toHost();
  }

  LlDispatched lowLatencyDispatch(const gin::ep::Inputs& in, bool useFp8 = false) {
    const int T = int(in.idx.size() / size_t(sh_.topk));
    auto x = up(in.x);
    auto idx = up(in.idx);
    auto w = up(in.weight);
    return llOf(buf_.lowLatencyDispatch(x.data(), idx.data(), w.data(), T, useFp8));
  }
  // A low-latency dispatch's result read back (waits for the stream).
  static LlDispatched llOf(const gin::ep::GpuLlDispatched& g) {
    LlDispatched d;
    d.x = g.x.toHost();
    d.xFp8 = g.xFp8.toHost();
    d.xScales = g.xScales.toHost();
    LlHandle& h = d.handle;
    h.tokens = g.handle.tokens;
    h.count = g.handle.count.toHost();
    for (int64_t r : g.handle.range.toHost()) h.range.push_back(uint64_t(r));
    h.srcToken = g.handle.srcToken.toHost();
    h.srcK = g.handle.srcK.toHost();
    h.gpu = g.handle;
    return d;
  }
  std::vector<uint16_t> lowLatencyCombine(const uint16_t* y, const int32_t* idx, const float* w, const LlHandle& h) {
    const size_t K = size_t(sh_.topk), T = size_t(h.tokens);
    auto yd = up(std::vector<uint16_t>(y, y + h.srcToken.size() * size_t(sh_.hidden)));
    auto idxd = up(std::vector<int32_t>(idx, idx + T * K));
    auto wd = up(std::vector<float>(w, w + T * K));
    return buf_.lowLatencyCombine(yd.data(), idxd.data(), wd.data(), h.gpu).toHost();
  }
  // The same with y uploaded into the buffer's zero-copy combine buffer
  // (after the dispatch: HostFace's calls synchronize), which goes in as y.
  std::vector<uint16_t> lowLatencyCombineZeroCopy(const std::vector<uint16_t>& y, const int32_t* idx, const float* w,
                                                  const LlHandle& h) {
    const size_t K = size_t(sh_.topk), T = size_t(h.tokens);
    uint16_t* b = buf_.lowLatencyCombineBuffer();
    GPU_CHECK(cudaMemcpyAsync(b, y.data(), y.size() * sizeof(uint16_t), cudaMemcpyHostToDevice, st_));
    auto idxd = up(std::vector<int32_t>(idx, idx + T * K));
    auto wd = up(std::vector<float>(w, w + T * K));
    return buf_.lowLatencyCombine(b, idxd.data(), wd.data(), h.gpu).toHost();
  }

 private:
  gin::ep::Shape sh_;
  int rank_;
  cudaStream_t st_;
  gin::ep::GpuBuffer buf_;
  int worst_ = 0;

  template <class T>
  gin::ep::DeviceArray<T> up(const std::vector<T>& v) {
    gin::ep::DeviceArray<T> a = buf_.deviceArray<T>(v.size());
    if (!v.empty()) GPU_CHECK(cudaMemcpyAsync(a.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, st_));
    GPU_CHECK(cudaStreamSynchronize(st_));
    return a;
  }
  // The handle's rows-received matrix (every rank's receive counts, from
  // the dispatch's opening all-gather): this rank's row is its own count per
  // source, and its column sums to the rows its tokens went out as.
  Handle face(const gin::ep::GpuHandle& g) const {
    const size_t R = size_t(sh_.ranks), me = size_t(rank_);
    if (g.syncFree) return syncFreeFace(g);
    gintest::expect(g.receivedBy.size() == R * R, "receivedBy is ranks x ranks");
    int sent = 0, mine = 0;
    for (int n : g.rows.toHost()) sent += n;
    for (size_t j = 0; j < R; ++j) mine += g.receivedBy[j * R + me];
    gintest::expect(mine == sent, "the ranks received as many rows from this rank as it sent");
    for (size_t i = 0; i < R; ++i)
      gintest::expect(g.receivedBy[me * R + i] == g.tokensFromRank[i], "receivedBy's row is this rank's counts");
    // DeepEP's rank prefix matrix, made on the GPU: [i][j] rows rank j got from ranks 0..i.
    const std::vector<int> prefix = g.rankPrefix.toHost();
    gintest::expect(prefix.size() == R * R, "the rank prefix matrix is ranks x ranks");
    for (size_t j = 0; j < R && prefix.size() == R * R; ++j)
      for (size_t i = 0, sum = 0; i < R; ++i)
        gintest::expect(size_t(prefix[i * R + j]) == (sum += size_t(g.receivedBy[j * R + i])),
                        "the rank prefix matrix sums receivedBy");
    return faceOf(g);
  }
  // A sync-free handle: the rows received (counts[0]) in order of source,
  // as the rank prefix matrix's column for this rank says; padding after.
  Handle syncFreeFace(const gin::ep::GpuHandle& g) const {
    const size_t R = size_t(sh_.ranks), me = size_t(rank_);
    const std::vector<unsigned long long> counts = g.counts.toHost();
    const std::vector<int> prefix = g.rankPrefix.toHost();
    Handle h = faceOf(g);
    const size_t n = size_t(counts[0]);
    gintest::expect(n <= h.srcRank.size() && prefix.size() == R * R && size_t(prefix[(R - 1) * R + me]) == n,
                    "a sync-free dispatch's rows received agree with its rank prefix matrix");
    for (size_t i = 0; i < h.srcRank.size(); ++i) {
      if (i >= n) {
        gintest::expect(h.srcRank[i] == -1 && h.srcToken[i] == -1, "a padding row comes from no rank");
        continue;
      }
      const int r = h.srcRank[i];
      gintest::expect(r >= 0 && size_t(r) < R && i < size_t(prefix[size_t(r) * R + me]) &&
                          i >= (r == 0 ? 0 : size_t(prefix[size_t(r - 1) * R + me])),
                      "a received row lies in its source's range of the rank prefix matrix");
    }
    h.srcRank.resize(n);
    h.srcToken.resize(n);
    int sent = 0;
    for (int v : h.rows) sent += v;
    unsigned long long own = 0;
    for (int r : h.srcRank) own += r == rank_;
    gintest::expect(counts[1] == static_cast<unsigned long long>(sent) - own,
                    "a sync-free combine waits for the rows this rank sent to others");
    return h;
  }
  static Handle faceOf(const gin::ep::GpuHandle& g) {
    Handle h;
    h.tokens = g.tokens;
    h.srcRank = g.srcRank.toHost();
    h.srcToken = g.srcToken.toHost();
    h.rows = g.rows.toHost();
    h.gpu = g;
    return h;
  }
};

// worst > 0 (normal mode): the rounds run sync-free with that worstTokens
// (bf16 and FP8, cached FP8 along sync-free and bf16 handles), with
// synchronizing rounds between (the two kinds mix on one buffer).
void run(const gintest::ep::Case& c, bool ll, int worst = 0) {
  CommConfig cfg = gputest::gpuConfig();
  cfg.transport = c.tr;
  cfg.nSignals = int(gin::ep::signalsNeeded(gintest::ep::shapeOf(c))) + 4;
  gputest::runRanksOnStreams(
      c.ranks,
      [&](Comm& comm, cudaStream_t st) {
        HostFace buf(comm, gintest::ep::shapeOf(c), ll, st);
        if (worst > 0) {
          buf.syncFree(worst);
          gintest::ep::checkRounds(buf, comm, c);
          gintest::ep::checkFp8Rounds(buf, comm, c);
          buf.syncFree(0);
          gintest::ep::checkFp8Rounds(buf, comm, c, 1);
          buf.syncFree(worst);
          gintest::ep::checkRounds(buf, comm, c, 2);
          return;
        }
        if (ll)
          gintest::ep::checkLlRounds(buf, comm, c);
        else
          gintest::ep::checkRounds(buf, comm, c);
        // FP8 (hidden sizes of whole 128-value groups), then bf16 again.
        if (ll)
          gintest::ep::checkLlFp8Rounds(buf, comm, c);
        else
          gintest::ep::checkFp8Rounds(buf, comm, c);
        if (ll)
          gintest::ep::checkLlRounds(buf, comm, c, 1);
        else
          gintest::ep::checkRounds(buf, comm, c, 1);
      },
      cfg);
}
// The failure cases' allocator: throws std::bad_alloc once `next` is set,
// else allocates from a pool that keeps what is freed, as the buffer's (a
// pool that trims at synchronizations, as the device's default pool, hung
// 2 ranks sharing a GPU here). Outlives the buffer.
class FailOnce {
 public:
  explicit FailOnce(cudaStream_t st) : st_(st), pool_(gin::ep::detail::makeKeepingPool()) {}
  ~FailOnce() { (void)cudaMemPoolDestroy(pool_); }
  FailOnce(const FailOnce&) = delete;
  FailOnce& operator=(const FailOnce&) = delete;
  gin::ep::DeviceAllocator allocator() {
    return [this](size_t bytes, void** p) -> std::shared_ptr<void> {
      if (next) {
        next = false;
        throw std::bad_alloc();
      }
      GPU_CHECK(cudaMallocFromPoolAsync(p, bytes, pool_, st_));
      return std::shared_ptr<void>(*p, [st = st_](void* q) { (void)cudaFreeAsync(q, st); });
    };
  }
  bool next = false;

 private:
  cudaStream_t st_;
  cudaMemPool_t pool_ = nullptr;
};
}  // namespace

// f(ranks, transport) for 1-4 ranks over lsa and the proxy, but for rank
// counts this process has too few GPUs or hardware queues for (a warning).
template <class F>
void overRanks(F f) {
  for (int ranks : {1, 2, 3, 4})
    for (TransportChoice tr : {TransportChoice::Lsa, TransportChoice::Proxy}) {
      if (ranks > gputest::maxRanks()) continue;
      if (!gputest::queuesFor(ranks)) {
        WARN(ranks << " ranks in one process need " << ranks + 1
                   << " hardware queues; CUDA_DEVICE_MAX_CONNECTIONS=" << gputest::hardwareQueues());
        continue;
      }
      f(ranks, tr);
    }
}

TEST_CASE("GPU ep buffer: DeepEP's dispatch and combine, both modes, checked row by row", "[gpu][ep]") {
  overRanks([](int ranks, TransportChoice tr) {
    for (int hidden : {256, 7168}) {
      const int experts = 4 * ranks, topk = std::min(4, experts);
      // Normal mode: 23 tokens at most, alignment 4; low latency: 17.
      const gintest::ep::Case normal{ranks, experts, hidden, topk, 23, 0.25, 4, tr};
      const gintest::ep::Case lowLatency{ranks, experts, hidden, topk, 17, 0.25, 1, tr};
      CAPTURE(ranks, hidden, int(tr));
      CHECK_NOTHROW(run(normal, false));
      CHECK_NOTHROW(run(lowLatency, true));
      // Sync-free (DeepEP's num_worst_tokens): room for every row any rank
      // can send, and some padding.
      CHECK_NOTHROW(run(normal, false, ranks * 23 + 5));
    }
  });
}

// v in a device array of buf's.
template <class T>
gin::ep::DeviceArray<T> upload(gin::ep::GpuBuffer& buf, const std::vector<T>& v, cudaStream_t st) {
  gin::ep::DeviceArray<T> a = buf.deviceArray<T>(v.size());
  GPU_CHECK(cudaMemcpyAsync(a.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, st));
  GPU_CHECK(cudaStreamSynchronize(st));
  return a;
}

// int32 values as int64.
std::vector<int64_t> widened(const std::vector<int32_t>& v) { return std::vector<int64_t>(v.begin(), v.end()); }

// The small shape of the failure cases: R ranks, E experts, top-K, hidden
// H, T tokens.
gin::ep::Shape smallShape(int R, int E, int K, int H, int T) {
  gin::ep::Shape sh;
  sh.ranks = R;
  sh.experts = E;
  sh.tokens = T;
  sh.hidden = H;
  sh.topk = K;
  return sh;
}

// Whether R in-process ranks have a hardware queue each (else a warning).
bool enoughQueues(int R) {
  if (gputest::queuesFor(R)) return true;
  WARN(R << " ranks in one process need " << R + 1 << " hardware queues; CUDA_DEVICE_MAX_CONNECTIONS="
          << gputest::hardwareQueues());
  return false;
}

TEST_CASE("GPU ep buffer: too many tokens or a bad expert on one rank fails every rank alike, and the next call works",
          "[gpu][ep]") {
  const int R = std::min(2, gputest::maxRanks());
  if (!enoughQueues(R)) return;
  const int E = 4 * R, K = 2, H = 256, T = 8;
  CommConfig cfg = gputest::gpuConfig();
  gin::ep::Shape sh = smallShape(R, E, K, H, T);
  sh.channels = 2;
  sh.slots = 4;
  cfg.nSignals = int(gin::ep::signalsNeeded(sh)) + 4;
  gputest::runRanksOnStreams(
      R,
      [&](Comm& comm, cudaStream_t st) {
        const int me = comm.rank();
        gin::ep::GpuBuffer buf(comm, sh, false, st);
        auto up = [&](const auto& v) { return upload(buf, v, st); };
        // Rank R - 1 brings 3 tokens more than the buffer holds.
        const int mine = me == R - 1 ? T + 3 : T;
        auto x = up(std::vector<uint16_t>(size_t(mine) * H, 0x3f80));
        std::vector<int32_t> idxHost(size_t(mine) * K);
        for (size_t i = 0; i < idxHost.size(); ++i) idxHost[i] = int32_t((i * 3 + size_t(me)) % size_t(E));
        auto idx = up(idxHost);
        auto w = up(std::vector<float>(idxHost.size(), 0.5f));
        int grow = 0;
        try {
          buf.dispatch(x.data(), idx.data(), w.data(), mine);
        } catch (const gin::ep::CapacityError& e) {
          grow = e.tokens;
          gintest::expect(std::string(e.what()).find("rank " + std::to_string(R - 1)) != std::string::npos,
                          "the error names the rank with too many tokens");
        }
        gintest::expect(grow == T + 3, "every rank learns the most tokens a rank brought");
        // A choice of expert E on rank 0: every rank throws, naming rank 0.
        std::vector<int32_t> bad(idxHost.begin(), idxHost.begin() + T * K);
        if (me == 0) bad[5] = E;
        auto badIdx = up(bad);
        const std::string what = refusal([&] { buf.dispatch(x.data(), badIdx.data(), w.data(), T); });
        gintest::expect(what.find("rank 0's token 2 choice 1") != std::string::npos,
                        "every rank reports rank 0's bad expert: " + what);
        // int64 indices (torch.topk's): a choice past int's range on rank 0
        // (2^32 + 1: expert 1 if cut to int32) is refused on every rank too.
        std::vector<int64_t> bad64(bad.size());
        for (size_t i = 0; i < bad64.size(); ++i) bad64[i] = idxHost[i];
        if (me == 0) bad64[5] = (int64_t(1) << 32) + 1;
        auto badIdx64 = up(bad64);
        const std::string what64 = refusal([&] { buf.dispatch(x.data(), badIdx64.data(), w.data(), T); });
        gintest::expect(what64.find("rank 0's token 2 choice 1") != std::string::npos,
                        "every rank reports rank 0's bad int64 expert: " + what64);
        // The buffer still works: every rank sends T tokens, with int32 and
        // int64 indices alike.
        gin::ep::GpuDispatched d = buf.dispatch(x.data(), idx.data(), w.data(), T);
        int sent = 0, got = 0;
        for (int n : d.handle.rows.toHost()) sent += n;
        for (int r = 0; r < R; ++r) got += d.handle.receivedBy[size_t(r) * size_t(R) + size_t(me)];
        gintest::expect(sent == got && sent > 0, "a dispatch after the failures delivers every row");
        auto idx64 = up(std::vector<int64_t>(idxHost.begin(), idxHost.begin() + T * K));
        gin::ep::GpuDispatched d64 = buf.dispatch(x.data(), idx64.data(), w.data(), T);
        gintest::expect(d64.handle.rows.toHost() == d.handle.rows.toHost() &&
                            d64.handle.receivedBy == d.handle.receivedBy &&
                            d64.topkIdx.empty() && widened(d.topkIdx.toHost()) == d64.topkIdx64.toHost() &&
                            d64.handle.topkIdx.toHost() == d.handle.topkIdx.toHost(),
                        "int64 indices route as the same int32 ones do");
      },
      cfg);
  // Low-latency mode plans on the GPU and returns before its work is done:
  // a bad index on rank 0 stops the communicator; within a call or two (and
  // synchronize) every rank throws, rank 0 naming its token and choice.
  gputest::runRanksOnStreams(
      R,
      [&](Comm& comm, cudaStream_t st) {
        const int me = comm.rank();
        gin::ep::GpuBuffer buf(comm, sh, true, st);
        auto up = [&](const auto& v) { return upload(buf, v, st); };
        auto x = up(std::vector<uint16_t>(size_t(T) * H, 0x3f80));
        std::vector<int32_t> idxHost(size_t(T) * K);
        for (size_t i = 0; i < idxHost.size(); ++i) idxHost[i] = int32_t((i * 5 + size_t(me)) % size_t(E));
        auto idx = up(idxHost);
        auto w = up(std::vector<float>(idxHost.size(), 0.5f));
        // First a good round, checked: every pair arrives.
        gin::ep::GpuLlDispatched d = buf.lowLatencyDispatch(x.data(), idx.data(), w.data(), T);
        int got = 0, want = 0;
        for (int n : d.handle.count.toHost()) got += n;
        const int L = E / R;
        for (int r = 0; r < R; ++r)
          for (size_t i = 0; i < idxHost.size(); ++i) want += int((i * 5 + size_t(r)) % size_t(E)) / L == me;
        gintest::expect(got == want && d.handle.arrivals.toHost() == std::vector<unsigned long long>{T * K},
                        "a low-latency dispatch delivers every pair");
        std::vector<int32_t> bad = idxHost;
        if (me == 0) bad[3] = -2;
        auto badIdx = up(bad);
        gintest::expect(refusal([&] { buf.lowLatencyDispatch(x.data(), badIdx.data(), w.data(), T); }).empty(),
                        "the bad index is found after the call returned");
        std::string what;
        for (int i = 0; i < 3 && what.empty(); ++i) try {
            buf.lowLatencyDispatch(x.data(), idx.data(), w.data(), T);
            buf.synchronize();
          } catch (const std::exception& e) {
            what = e.what();
          }
        if (me == 0)
          gintest::expect(what.find("rank 0's token 1 choice 1") != std::string::npos,
                          "rank 0 reports its bad expert: " + what);
        else
          gintest::expect(!what.empty(), "every rank's calls stop after rank 0's bad expert");
      },
      cfg);
}

// The stand-in experts on the GPU: y[el][q] = expertScale(me x L + el) x
// x[el][q] for the q < count[el] rows each local expert received.
__global__ void llExpertsKernel(const uint16_t* x, const int* count, uint16_t* y, int L, size_t rowsPerExpert,
                                size_t H, int me) {
  for (int el = 0; el < L; ++el) {
    const size_t n = size_t(count[el]) * H, base = size_t(el) * rowsPerExpert * H;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
      y[base + i] = gin::ep::floatToBf16(gin::ep::expertScale(me * L + el) * gin::ep::bf16ToFloat(x[base + i]));
  }
}

// Low-latency calls queue without any host synchronization: rounds whose
// dispatches and combines interleave (two dispatches in flight, then their
// combines; alternating; three in a row), the experts as a kernel on the
// same stream, everything read back and checked at the end. Odd rounds
// pass their top-k indices as int64, even rounds as int32; rounds 1 and 4
// travel in FP8 (their layout checked, not their values: the ring's halves
// must not move with the row size). Then an allocator that fails on rank
// 0 in a dispatch: the call throws there, its round still ends on the GPU,
// and a next round (after no rank combined that one) is right everywhere.
// Then a second buffer on the same communicator (another token count) does
// it again: its signals start from zero, not where the first buffer's ended.
void runQueued(const gintest::ep::Case& c) {
  CommConfig cfg = gputest::gpuConfig();
  cfg.transport = c.tr;
  cfg.nSignals = int(gin::ep::signalsNeeded(gintest::ep::shapeOf(c))) + 4;
  // The order of calls: r + 1 dispatches round r, -(r + 1) combines it.
  const std::vector<int> order{1, 2, -1, -2, 3, -3, 4, 5, 6, -4, -5, -6, 7, -7, 8, 9, -8, -9};
  const int rounds = 9;
  const auto fp8 = [](size_t r) { return r == 1 || r == 4; };
  gputest::runRanksOnStreams(
      c.ranks,
      [&](Comm& comm, cudaStream_t st) {
        for (int tmax : {c.maxTokens, c.maxTokens - 4}) {
          gintest::ep::Case cc = c;
          cc.maxTokens = tmax;
          const gin::ep::Shape sh = gintest::ep::shapeOf(cc);
          const int me = comm.rank(), L = cc.experts / cc.ranks;
          const size_t H = size_t(cc.hidden), rowsPerExpert = size_t(cc.ranks) * size_t(tmax);
          FailOnce failing(st);  // made before the buffer: outlives it
          gin::ep::GpuBuffer buf(comm, sh, true, st);
          std::vector<std::vector<gin::ep::Inputs>> all;
          std::vector<gin::ep::DeviceArray<uint16_t>> x, y, out(static_cast<size_t>(rounds));
          std::vector<gin::ep::DeviceArray<int32_t>> idx;
          std::vector<gin::ep::DeviceArray<int64_t>> idx64;
          std::vector<gin::ep::DeviceArray<float>> w;
          for (int r = 0; r < rounds; ++r) {
            all.push_back(gintest::ep::roundInputs(cc, sh, r));
            const gin::ep::Inputs& in = all.back()[size_t(me)];
            x.push_back(upload(buf, in.x, st));
            idx.push_back(upload(buf, in.idx, st));
            idx64.push_back(upload(buf, std::vector<int64_t>(in.idx.begin(), in.idx.end()), st));
            w.push_back(upload(buf, in.weight, st));
            y.push_back(buf.deviceArray<uint16_t>(size_t(L) * rowsPerExpert * H));
          }
          std::vector<gin::ep::GpuLlDispatched> d(static_cast<size_t>(rounds));
          for (int op : order) {
            const size_t r = size_t(op < 0 ? -op : op) - 1;
            const int T = gintest::ep::tokensOf(cc, me, int(r));
            const bool wide = r % 2 == 1;
            if (op > 0) {
              d[r] = wide ? buf.lowLatencyDispatch(x[r].data(), idx64[r].data(), w[r].data(), T, fp8(r))
                          : buf.lowLatencyDispatch(x[r].data(), idx[r].data(), w[r].data(), T, fp8(r));
              if (!fp8(r))
                llExpertsKernel<<<64, 256, 0, st>>>(d[r].x.data(), d[r].handle.count.data(), y[r].data(), L,
                                                    rowsPerExpert, H, me);
              GPU_CHECK(cudaGetLastError());
            } else {
              out[r] = wide ? buf.lowLatencyCombine(y[r].data(), idx64[r].data(), w[r].data(), d[r].handle)
                            : buf.lowLatencyCombine(y[r].data(), idx[r].data(), w[r].data(), d[r].handle);
            }
          }
          buf.synchronize();
          for (int r = 0; r < rounds; ++r) {
            const std::string where = "rank " + std::to_string(me) + " tokens " + std::to_string(tmax) +
                                      " queued round " + std::to_string(r) + ": ";
            gintest::ep::checkLlDispatched(HostFace::llOf(d[size_t(r)]), all[size_t(r)], cc, me, where, !fp8(r));
            if (!fp8(r))
              gintest::ep::checkLlCombined(out[size_t(r)].toHost(), all[size_t(r)][size_t(me)], cc,
                                           size_t(gintest::ep::tokensOf(cc, me, r)), where);
          }
          failing.next = me == 0;
          buf.setAllocator(failing.allocator());
          const int T0 = gintest::ep::tokensOf(cc, me, 0);
          bool threw = false;
          try {
            buf.lowLatencyDispatch(x[0].data(), idx[0].data(), w[0].data(), T0);
          } catch (const std::bad_alloc&) {
            threw = true;
          }
          gintest::expect(threw == (me == 0), "the failing allocator's dispatch throws on rank 0 only");
          gin::ep::GpuLlDispatched again = buf.lowLatencyDispatch(x[0].data(), idx[0].data(), w[0].data(), T0);
          llExpertsKernel<<<64, 256, 0, st>>>(again.x.data(), again.handle.count.data(), y[0].data(), L,
                                              rowsPerExpert, H, me);
          GPU_CHECK(cudaGetLastError());
          gin::ep::DeviceArray<uint16_t> againOut =
              buf.lowLatencyCombine(y[0].data(), idx[0].data(), w[0].data(), again.handle);
          buf.synchronize();
          const std::string where = "rank " + std::to_string(me) + " after a failed allocation: ";
          gintest::ep::checkLlDispatched(HostFace::llOf(again), all[0], cc, me, where);
          gintest::ep::checkLlCombined(againOut.toHost(), all[0][size_t(me)], cc, size_t(T0), where);
        }
      },
      cfg);
}

TEST_CASE("GPU ep buffer: low-latency calls queue without a host synchronization, checked at the end", "[gpu][ep]") {
  overRanks([](int ranks, TransportChoice tr) {
    const int experts = 4 * ranks;
    const gintest::ep::Case c{ranks, experts, 256, std::min(4, experts), 17, 0.25, 1, tr};
    CAPTURE(ranks, int(tr));
    CHECK_NOTHROW(runQueued(c));
  });
}

// DeepEP's return_recv_hook: low-latency calls given deferReceive queue
// their sends and return, receive() queues the rest. Three rounds, the
// middle one not deferred: a deferred dispatch, a call before its receive()
// refused (on every rank, before any GPU work), receive(), the experts, a
// deferred combine, receive(); each round checked after a synchronize, and
// a receive() with nothing pending refused.
void runDeferred(const gintest::ep::Case& c) {
  CommConfig cfg = gputest::gpuConfig();
  cfg.transport = c.tr;
  const gin::ep::Shape sh = gintest::ep::shapeOf(c);
  cfg.nSignals = int(gin::ep::signalsNeeded(sh)) + 4;
  gputest::runRanksOnStreams(
      c.ranks,
      [&](Comm& comm, cudaStream_t st) {
        const int me = comm.rank(), L = c.experts / c.ranks;
        const size_t H = size_t(c.hidden), rowsPerExpert = size_t(c.ranks) * size_t(c.maxTokens);
        gin::ep::GpuBuffer buf(comm, sh, true, st);
        for (int r = 0; r < 3; ++r) {
          const bool defer = r != 1;
          const std::string where = "rank " + std::to_string(me) + " hook round " + std::to_string(r) + ": ";
          const std::vector<gin::ep::Inputs> all = gintest::ep::roundInputs(c, sh, r);
          const gin::ep::Inputs& in = all[size_t(me)];
          auto x = upload(buf, in.x, st);
          auto idx = upload(buf, in.idx, st);
          auto w = upload(buf, in.weight, st);
          auto y = buf.deviceArray<uint16_t>(size_t(L) * rowsPerExpert * H);
          const int T = gintest::ep::tokensOf(c, me, r);
          gin::ep::GpuLlDispatched d = buf.lowLatencyDispatch(x.data(), idx.data(), w.data(), T, false, defer);
          gintest::expect(buf.receivePending() == defer, where + "a deferred dispatch leaves its receive pending");
          if (defer) {
            const std::string why =
                refusal([&] { buf.lowLatencyCombine(y.data(), idx.data(), w.data(), d.handle); });
            gintest::expect(why.find("receive() (the hook) first") != std::string::npos,
                            where + "a call with a receive pending is refused: '" + why + "'");
            buf.receive();
          }
          llExpertsKernel<<<64, 256, 0, st>>>(d.x.data(), d.handle.count.data(), y.data(), L, rowsPerExpert, H, me);
          GPU_CHECK(cudaGetLastError());
          gin::ep::DeviceArray<uint16_t> out = buf.lowLatencyCombine(y.data(), idx.data(), w.data(), d.handle, defer);
          if (defer) buf.receive();
          buf.synchronize();
          gintest::ep::checkLlDispatched(HostFace::llOf(d), all, c, me, where);
          gintest::ep::checkLlCombined(out.toHost(), in, c, size_t(T), where);
        }
        gintest::expect(refusal([&] { buf.receive(); }).find("no low-latency call") != std::string::npos,
                        "receive() with nothing pending is refused");
      },
      cfg);
}

TEST_CASE("GPU ep buffer: low-latency receive hooks (deferReceive, then receive())", "[gpu][ep][hook]") {
  overRanks([](int ranks, TransportChoice tr) {
    const int experts = 4 * ranks;
    const gintest::ep::Case c{ranks, experts, 256, std::min(4, experts), 17, 0.25, 1, tr};
    CAPTURE(ranks, int(tr));
    CHECK_NOTHROW(runDeferred(c));
  });
}

// Sync-free normal calls queued with no host synchronization between
// (ranks x Case::maxTokens as worstTokens): dispatch then combine, two
// dispatches then their combines in order, a cached dispatch of new tokens
// (along the last dispatch's layout, and along the one before) then its
// combine; each combine of the rows as they came (the identity expert:
// token t comes back as rows[t] x x[t]); every result is read after the
// last call and checked against the inputs.
void runSyncFreeQueued(const gintest::ep::Case& c) {
  CommConfig cfg = gputest::gpuConfig();
  cfg.transport = c.tr;
  const gin::ep::Shape sh = gintest::ep::shapeOf(c);
  cfg.nSignals = int(gin::ep::signalsNeeded(sh)) + 4;
  constexpr int kRounds = 9;
  gputest::runRanksOnStreams(
      c.ranks,
      [&](Comm& comm, cudaStream_t st) {
        const int me = comm.rank(), K = c.topk, worst = c.ranks * c.maxTokens;
        const size_t H = size_t(c.hidden);
        gin::ep::GpuBuffer buf(comm, sh, false, st);
        // Round r's tokens of every rank; a cached round's (r % 3 == 0, r > 0)
        // are new tokens, as many as round from(r)'s, whose layout it repeats:
        // round 3 the layout of round 1 (not the last dispatch: 1 and 2 went
        // together), round 6 that of round 5.
        const auto cached = [](int r) { return r % 3 == 0 && r > 0; };
        const auto from = [](int r) { return r % 6 == 3 ? r - 2 : r - 1; };
        std::vector<std::vector<std::vector<uint16_t>>> xs(kRounds);
        std::vector<gin::ep::Inputs> mine;
        std::vector<gin::ep::DeviceArray<uint16_t>> x;
        std::vector<gin::ep::DeviceArray<int32_t>> idx;
        std::vector<gin::ep::DeviceArray<float>> w;
        for (int r = 0; r < kRounds; ++r) {
          const std::vector<gin::ep::Inputs> all = gintest::ep::roundInputs(c, sh, r);
          for (int rr = 0; rr < c.ranks; ++rr) {
            gin::ep::Shape s = sh;
            s.tokens = gintest::ep::tokensOf(c, rr, from(r));
            xs[size_t(r)].push_back(cached(r) ? gin::ep::makeInputs(s, rr, 900 + uint64_t(r)).x : all[size_t(rr)].x);
          }
          mine.push_back(all[size_t(me)]);
          x.push_back(upload(buf, xs[size_t(r)][size_t(me)], st));
          idx.push_back(upload(buf, mine.back().idx, st));
          w.push_back(upload(buf, mine.back().weight, st));
        }
        const auto T = [&](int r) { return int(mine[size_t(r)].idx.size() / size_t(K)); };
        std::vector<gin::ep::GpuDispatched> got(kRounds);
        std::vector<gin::ep::DeviceArray<uint16_t>> out(kRounds);
        for (int r = 0; r < kRounds; ++r) {
          if (r % 3 == 1) {  // rounds r and r + 1 dispatched, then combined in order
            got[size_t(r)] = buf.dispatch(x[size_t(r)].data(), idx[size_t(r)].data(), w[size_t(r)].data(), T(r), 1,
                                          worst);
            got[size_t(r + 1)] = buf.dispatch(x[size_t(r + 1)].data(), idx[size_t(r + 1)].data(),
                                              w[size_t(r + 1)].data(), T(r + 1), 1, worst);
            out[size_t(r)] = buf.combine(got[size_t(r)].x.data(), got[size_t(r)].handle);
            out[size_t(r + 1)] = buf.combine(got[size_t(r + 1)].x.data(), got[size_t(r + 1)].handle);
            ++r;
          } else if (cached(r)) {  // new tokens along round from(r)'s layout
            got[size_t(r)] = buf.dispatch(x[size_t(r)].data(), got[size_t(from(r))].handle);
            out[size_t(r)] = buf.combine(got[size_t(r)].x.data(), got[size_t(r)].handle);
          } else {
            got[size_t(r)] = buf.dispatch(x[size_t(r)].data(), idx[size_t(r)].data(), w[size_t(r)].data(), T(r), 1,
                                          worst);
            out[size_t(r)] = buf.combine(got[size_t(r)].x.data(), got[size_t(r)].handle);
          }
        }
        buf.synchronize();
        for (int r = 0; r < kRounds; ++r) {
          const std::string where = "rank " + std::to_string(me) + " round " + std::to_string(r) + ": ";
          const gin::ep::GpuHandle& h = got[size_t(r)].handle;
          const size_t n = size_t(h.counts.toHost()[0]);
          const std::vector<int> src = h.srcRank.toHost(), tok = h.srcToken.toHost(), rows = h.rows.toHost();
          const std::vector<uint16_t> rx = got[size_t(r)].x.toHost(), o = out[size_t(r)].toHost();
          const int Tr = cached(r) ? T(from(r)) : T(r);
          gintest::expect(src.size() == size_t(worst) && rx.size() == size_t(worst) * H && n <= size_t(worst),
                          where + "worstTokens rows");
          // Every received row is its source's token (the sources' tokens of this round).
          for (size_t i = 0; i < n; ++i) {
            gintest::expect(src[i] >= 0 && src[i] < c.ranks && (i == 0 || src[i] >= src[i - 1]),
                            where + "rows by source");
            const auto& sx = xs[size_t(r)][size_t(src[i])];
            for (size_t hh = 0; hh < H; ++hh)
              gintest::expect(rx[i * H + hh] == sx[size_t(tok[i]) * H + hh],
                              where + "row " + std::to_string(i) + " value " + std::to_string(hh));
          }
          for (size_t i = n; i < size_t(worst); ++i) gintest::expect(src[i] == -1, where + "padding");
          // Identity experts: token t back as rows[t] x x[t].
          const auto& xm = xs[size_t(r)][size_t(me)];
          gintest::expect(o.size() == size_t(Tr) * H, where + "combine's size");
          for (size_t t = 0; t < size_t(Tr); ++t)
            for (size_t hh = 0; hh < H; ++hh) {
              const double ref = double(rows[t]) * gin::ep::bf16ToFloat(xm[t * H + hh]);
              gintest::expect(std::fabs(gin::ep::bf16ToFloat(o[t * H + hh]) - ref) <= std::fabs(ref) / 128 + 1e-30,
                              where + "combine: token " + std::to_string(t) + " value " + std::to_string(hh));
            }
        }
      },
      cfg);
}

TEST_CASE("GPU ep buffer: sync-free normal calls queue without a host synchronization, checked at the end",
          "[gpu][ep][syncfree]") {
  overRanks([](int ranks, TransportChoice tr) {
    const int experts = 4 * ranks;
    const gintest::ep::Case c{ranks, experts, 256, std::min(4, experts), 19, 0.25, 1, tr};
    CAPTURE(ranks, int(tr));
    CHECK_NOTHROW(runSyncFreeQueued(c));
  });
}

TEST_CASE("GPU ep buffer: a sync-free dispatch with more rows than its worstTokens stops every rank",
          "[gpu][ep][syncfree]") {
  const int R = std::min(2, gputest::maxRanks());
  if (!enoughQueues(R)) return;
  const int E = 4 * R, K = 2, H = 256, T = 8;
  CommConfig cfg = gputest::gpuConfig();
  const gin::ep::Shape sh = smallShape(R, E, K, H, T);
  cfg.nSignals = int(gin::ep::signalsNeeded(sh)) + 4;
  gputest::runRanksOnStreams(
      R,
      [&](Comm& comm, cudaStream_t st) {
        const int me = comm.rank();
        gin::ep::GpuBuffer buf(comm, sh, false, st);
        // Every token to expert 0 (rank 0): rank 0 receives R x T rows.
        auto x = upload(buf, std::vector<uint16_t>(size_t(T) * H, 0x3f80), st);
        std::vector<int32_t> idxHost(size_t(T) * K, -1);
        for (int t = 0; t < T; ++t) idxHost[size_t(t) * K] = 0;
        auto idx = upload(buf, idxHost, st);
        auto w = upload(buf, std::vector<float>(idxHost.size(), 0.5f), st);
        // Room for all: fine.
        gin::ep::GpuDispatched ok = buf.dispatch(x.data(), idx.data(), w.data(), T, 1, R * T);
        buf.combine(ok.x.data(), ok.handle);
        buf.synchronize();
        gintest::expect(ok.handle.counts.toHost()[0] == (me == 0 ? unsigned(R * T) : 0u),
                        "rank 0 receives every token");
        // Rank 0 gives room for 3 rows only: its next call or synchronize throws, and so do every rank's.
        std::string what;
        for (int i = 0; i < 3 && what.empty(); ++i) try {
            const int worst = me == 0 && i == 0 ? 3 : R * T;
            gin::ep::GpuDispatched d = buf.dispatch(x.data(), idx.data(), w.data(), T, 1, worst);
            buf.combine(d.x.data(), d.handle);
            buf.synchronize();
          } catch (const std::exception& e) {
            what = e.what();
          }
        if (me == 0)
          gintest::expect(what.find("more than its worstTokens") != std::string::npos,
                          "rank 0 reports its rows past worstTokens: " + what);
        else
          gintest::expect(!what.empty(), "every rank's calls stop after rank 0's rows past worstTokens");
      },
      cfg);
}

// A sync-free call makes every array before its first kernel; when rank
// 0's allocator throws there (in a dispatch, or in a combine along a
// sync-free handle), rank 0's call throws it and the communicator's error
// (callAborted) ends the peers' waits at once, not at the timeout (60 s
// here): every rank's calls stop within 20 s.
TEST_CASE("GPU ep buffer: a sync-free call whose allocator throws on one rank stops every rank at once",
          "[gpu][ep][syncfree]") {
  const int R = std::min(2, gputest::maxRanks());
  if (!enoughQueues(R)) return;
  const int E = 4 * R, K = 2, H = 256, T = 8;
  CommConfig cfg = gputest::gpuConfig(60'000'000'000ull);
  const gin::ep::Shape sh = smallShape(R, E, K, H, T);
  cfg.nSignals = int(gin::ep::signalsNeeded(sh)) + 4;
  for (const bool inCombine : {false, true}) {
    CAPTURE(inCombine);
    std::vector<std::string> what(static_cast<size_t>(R));  // per rank: what its calls threw
    std::vector<double> seconds(static_cast<size_t>(R), -1);
    std::vector<int> badAlloc(static_cast<size_t>(R), 0);
    REQUIRE_NOTHROW(gputest::runRanksOnStreams(
        R,
        [&](Comm& comm, cudaStream_t st) {
          const int me = comm.rank();
          FailOnce failing(st);  // made before the buffer: outlives it
          gin::ep::GpuBuffer buf(comm, sh, false, st);
          buf.setAllocator(failing.allocator());
          auto x = upload(buf, std::vector<uint16_t>(size_t(T) * H, 0x3f80), st);
          std::vector<int32_t> idxHost(size_t(T) * K, -1);
          for (int t = 0; t < T; ++t) idxHost[size_t(t) * K] = (t + me) % E;
          auto idx = upload(buf, idxHost, st);
          auto w = upload(buf, std::vector<float>(idxHost.size(), 0.5f), st);
          gin::ep::GpuDispatched ok = buf.dispatch(x.data(), idx.data(), w.data(), T, 1, R * T);
          buf.combine(ok.x.data(), ok.handle);
          buf.synchronize();
          const auto start = std::chrono::steady_clock::now();
          std::string& msg = what[size_t(me)];
          try {
            failing.next = me == 0 && !inCombine;
            gin::ep::GpuDispatched d = buf.dispatch(x.data(), idx.data(), w.data(), T, 1, R * T);
            failing.next = me == 0 && inCombine;
            buf.combine(d.x.data(), d.handle);
            buf.synchronize();
          } catch (const std::bad_alloc&) {
            badAlloc[size_t(me)] = 1;
            try {  // the next call says why
              buf.synchronize();
            } catch (const std::exception& e) {
              msg = e.what();
            }
          } catch (const std::exception& e) {
            msg = e.what();
          }
          seconds[size_t(me)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        },
        cfg));
    for (int r = 0; r < R; ++r) {
      CAPTURE(r, what[size_t(r)], seconds[size_t(r)]);
      CHECK(badAlloc[size_t(r)] == (r == 0));
      CHECK(what[size_t(r)].find(r == 0 ? "callAborted" : "rank 0") != std::string::npos);
      CHECK(seconds[size_t(r)] >= 0);
      CHECK(seconds[size_t(r)] < 20);
    }
  }
}

int main(int argc, char** argv) {
  gputest::widenQueues();  // before CUDA starts
  if (gputest::gpuCount() == 0) return gputest::skipNoGpu("GPU ep buffer suite");
  return Catch::Session().run(argc, argv);
}
