// python/csrc/runtime.cu — the gin_ep extension's side that holds gin: a
// TcpBootstrap from a unique id, the Comm, and a gin::ep::GpuBuffer made for
// the shape of the calls (made again, collectively, when the hidden size,
// experts or top-k change or more tokens come than it holds: every rank
// learns that in the same call, from the buffer's CapacityError). The buffer
// runs on a stream of its own that waits for the caller's stream at every
// call. Every call returns once its work is queued (a normal dispatch
// without num_worst_tokens after its one synchronization, for its receive
// count), the caller's stream then waiting for the buffer's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "gin/ep/gpu_buffer.hpp"
#include "gin/gin.hpp"
#include "runtime.hpp"

namespace gin_ep_rt {

namespace {
// A normal-mode dispatch's handle as the extension keeps it.
struct NormalHandle {
  gin::ep::GpuHandle h;
};

template <class T>
Array arrayOf(const gin::ep::DeviceArray<T>& a) {
  return Array{a.data(), a.size(), a.owner()};
}

// What a normal dispatch returns to the bindings, its handle kept as h.
Dispatched dispatchedOf(const gin::ep::GpuDispatched& d, bool fp8, bool idx64, std::shared_ptr<NormalHandle> h) {
  h->h = d.handle;
  Dispatched out;
  out.x = fp8 ? arrayOf(d.xFp8) : arrayOf(d.x);
  out.xScales = arrayOf(d.xScales);
  out.idx64 = idx64;
  out.topkIdx = out.idx64 ? arrayOf(d.topkIdx64) : arrayOf(d.topkIdx);
  out.topkWeights = arrayOf(d.topkWeights);
  out.tokensPerExpert = d.tokensPerExpert;
  out.rankPrefix = arrayOf(h->h.rankPrefix);  // made on the GPU
  out.srcRank = arrayOf(h->h.srcRank);
  out.srcToken = arrayOf(h->h.srcToken);
  out.handle = std::move(h);
  return out;
}
}  // namespace

struct Runtime::State {
  gin::TcpBootstrap bs;
  gin::Comm comm;
  bool ll;
  int channels;
  cudaStream_t st = nullptr;
  cudaEvent_t ev = nullptr, done = nullptr;
  gin::ep::Shape shape{};  // of buf
  std::unique_ptr<gin::ep::GpuBuffer> buf;
  std::function<Array(size_t)> alloc;

  State(const gin::UniqueId& id, int rank, int nRanks, const gin::CommConfig& cfg, bool lowLatency, int ch)
      : bs(id, rank, nRanks), comm(bs, cfg), ll(lowLatency), channels(ch) {
    GIN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    GIN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    GIN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  }
  ~State() {
    buf.reset();
    (void)cudaEventDestroy(ev);
    (void)cudaEventDestroy(done);
    (void)cudaStreamDestroy(st);
  }

  // The buffer's stream waits for the caller's work queued so far.
  void follow(uintptr_t caller) {
    GIN_CUDA_CHECK(cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(caller)));
    GIN_CUDA_CHECK(cudaStreamWaitEvent(st, ev, 0));
  }
  // The caller's stream waits for the buffer's work queued so far.
  void join(uintptr_t caller) {
    GIN_CUDA_CHECK(cudaEventRecord(done, st));
    GIN_CUDA_CHECK(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(caller), done, 0));
  }

  // A buffer for (hidden, experts, topk) holding `tokens` per rank (any
  // number when anyTokens: the buffer itself finds out, on every rank at
  // once, that a call brings more than it holds). Every rank makes one in
  // the same call (the first, one with a new shape, or one whose buffer
  // threw CapacityError on every rank), for the most tokens any rank passes.
  gin::ep::GpuBuffer& bufferFor(int tokens, int hidden, int experts, int topk, bool anyTokens = false) {
    if (buf && shape.hidden == hidden && shape.experts == experts && shape.topk == topk &&
        (anyTokens || tokens <= shape.tokens))
      return *buf;
    buf.reset();
    std::vector<int> all(size_t(comm.nRanks()), 0);
    all[size_t(comm.rank())] = tokens;
    bs.allGather(all.data(), sizeof(int));
    tokens = *std::max_element(all.begin(), all.end());
    gin::ep::Shape sh;
    sh.ranks = comm.nRanks();
    sh.experts = experts;
    sh.tokens = std::max(tokens, 1);
    sh.hidden = hidden;
    sh.topk = topk;
    sh.channels = channels;  // 0: chosen for the GPU (gin::ep::gpu::autoShape)
    sh.slots = 0;
    sh.batch = 0;  // chosen for the GPU (GIN_EP_BATCH)
    buf = std::make_unique<gin::ep::GpuBuffer>(comm, sh, ll, st);
    if (alloc)
      buf->setAllocator([f = alloc](size_t bytes, void** p) {
        Array a = f(bytes);
        *p = a.ptr;
        return a.keep;
      });
    shape = sh;
    return *buf;
  }
};

std::string Runtime::uniqueId() {
  const gin::UniqueId id = gin::makeUniqueId();
  return std::string(id.bytes, sizeof id.bytes);
}

Runtime::Runtime(const std::string& uniqueId, int rank, int nRanks, int device, bool lowLatency, int channels) {
  if (uniqueId.size() != sizeof(gin::UniqueId))
    throw std::invalid_argument("gin_ep: the unique id must be the 128 bytes Runtime.unique_id() made");
  gin::UniqueId id;
  std::memcpy(id.bytes, uniqueId.data(), sizeof id.bytes);
  GIN_CUDA_CHECK(cudaSetDevice(device));
  gin::CommConfig cfg;
  cfg.device = gin::DeviceKind::Gpu;
  cfg.cudaDevice = device;
  cfg.nSignals = 8192;
  s_ = std::make_unique<State>(id, rank, nRanks, cfg, lowLatency, channels);
}

Runtime::~Runtime() = default;

int Runtime::rank() const { return s_->comm.rank(); }
int Runtime::nRanks() const { return s_->comm.nRanks(); }
std::string Runtime::transports() const {
  std::string t;
  for (int r = 0; r < nRanks(); ++r)
    t += std::string(r ? " " : "") + gin::detail::transportName(s_->comm.transportTo(r));
  return t;
}

void Runtime::synchronize() {
  State& s = *s_;
  if (s.buf)
    s.buf->synchronize();
  else
    s.comm.check();
}

void Runtime::setAllocator(std::function<Array(size_t)> alloc) { s_->alloc = std::move(alloc); }

Dispatched Runtime::dispatch(uintptr_t stream, const void* x, const float* xScales, const void* idx, bool idx64,
                             const float* weights, int tokens, int hidden, int experts, int topk,
                             int expertAlignment, int worstTokens) {
  State& s = *s_;
  // The buffer's dispatch for bf16 or FP8 tokens and int32 or int64 indices.
  const auto call = [&](gin::ep::GpuBuffer& buf, int worst) {
    const auto with = [&](const auto* ix) {
      return xScales ? buf.dispatch(gin::ep::Fp8Tokens{static_cast<const uint8_t*>(x), xScales}, ix, weights, tokens,
                                    expertAlignment, worst)
                     : buf.dispatch(static_cast<const uint16_t*>(x), ix, weights, tokens, expertAlignment, worst);
    };
    return idx64 ? with(static_cast<const int64_t*>(idx)) : with(static_cast<const int32_t*>(idx));
  };
  if (worstTokens > 0) {
    // Without the host: the buffer as it is (a first call makes it, every
    // rank in the same call, for the most tokens any rank brings); a later
    // call with more tokens than it holds stops every rank (no rank can
    // learn that the others need a bigger one without the host).
    gin::ep::GpuBuffer& buf = s.bufferFor(tokens, hidden, experts, topk, /*anyTokens=*/true);
    s.follow(stream);
    gin::ep::GpuDispatched d = call(buf, worstTokens);
    s.join(stream);
    return dispatchedOf(d, xScales != nullptr, idx64, std::make_shared<NormalHandle>());
  }
  // The buffer is made for the tokens of the first call and made again, by
  // every rank at once, when a call brings more than it holds (the buffer
  // finds that out in its opening barrier and throws on every rank).
  gin::ep::GpuDispatched d;
  for (int want = tokens, retry = 0;; retry = 1) {
    gin::ep::GpuBuffer& buf = s.bufferFor(want, hidden, experts, topk, !retry);
    s.follow(stream);
    try {
      d = call(buf, 0);
      break;
    } catch (const gin::ep::CapacityError& e) {
      want = e.tokens;
    }
  }
  s.join(stream);  // the call synchronized once, after its plan; its rows move after it returns
  return dispatchedOf(d, xScales != nullptr, idx64, std::make_shared<NormalHandle>());
}

Dispatched Runtime::cachedDispatch(uintptr_t stream, const void* x, const float* xScales,
                                   const std::shared_ptr<void>& handle) {
  State& s = *s_;
  const auto* h = static_cast<const NormalHandle*>(handle.get());
  if (!h || !s.buf || s.ll) throw std::invalid_argument("gin_ep: a cached dispatch needs a handle of this buffer's dispatch");
  s.follow(stream);
  gin::ep::GpuDispatched d =
      xScales ? s.buf->dispatch(gin::ep::Fp8Tokens{static_cast<const uint8_t*>(x), xScales}, h->h)
              : s.buf->dispatch(static_cast<const uint16_t*>(x), h->h);
  s.join(stream);  // the call returns once queued
  Dispatched out;
  out.x = xScales ? arrayOf(d.xFp8) : arrayOf(d.x);
  out.xScales = arrayOf(d.xScales);
  out.rankPrefix = arrayOf(h->h.rankPrefix);
  out.srcRank = arrayOf(h->h.srcRank);
  out.srcToken = arrayOf(h->h.srcToken);
  out.handle = handle;
  return out;
}

Array Runtime::combine(uintptr_t stream, const void* y, const std::shared_ptr<void>& handle, const void* bias0,
                       const void* bias1) {
  State& s = *s_;
  const auto* h = static_cast<const NormalHandle*>(handle.get());
  if (!h || !s.buf || s.ll) throw std::invalid_argument("gin_ep: combine needs a handle of this buffer's dispatch");
  s.follow(stream);
  Array out = arrayOf(s.buf->combine(static_cast<const uint16_t*>(y), h->h, static_cast<const uint16_t*>(bias0),
                                     static_cast<const uint16_t*>(bias1)));
  s.join(stream);  // the combine returns once queued
  return out;
}

LlDispatched Runtime::lowLatencyDispatch(uintptr_t stream, const void* x, const void* idx, bool idx64, int tokens,
                                         int maxTokens, int hidden, int experts, int topk, bool useFp8,
                                         bool defer) {
  State& s = *s_;
  if (s.buf && s.buf->receivePending())  // checked before a new buffer would replace this one
    throw std::invalid_argument("gin_ep: low_latency_dispatch while the last low-latency call's receive hook was "
                                "not called: call the hook first, on every rank");
  if (s.buf && s.shape.tokens != maxTokens) s.buf.reset();  // the packed layout is per maxTokens
  gin::ep::GpuBuffer& buf = s.bufferFor(maxTokens, hidden, experts, topk);
  s.follow(stream);
  const auto* xs = static_cast<const uint16_t*>(x);
  auto h = std::make_shared<gin::ep::GpuLlDispatched>(
      idx64 ? buf.lowLatencyDispatch(xs, static_cast<const int64_t*>(idx), nullptr, tokens, useFp8, defer)
            : buf.lowLatencyDispatch(xs, static_cast<const int32_t*>(idx), nullptr, tokens, useFp8, defer));
  LlDispatched out;
  out.x = useFp8 ? arrayOf(h->xFp8) : arrayOf(h->x);
  out.xScales = arrayOf(h->xScales);
  out.count = arrayOf(h->handle.count);
  out.range = arrayOf(h->handle.range);
  out.srcToken = arrayOf(h->handle.srcToken);
  out.handle = std::shared_ptr<void>(h, &h->handle);
  s.join(stream);
  return out;
}

Array Runtime::lowLatencyCombine(uintptr_t stream, const void* y, const void* idx, bool idx64, const float* weights,
                                 const std::shared_ptr<void>& handle, bool defer) {
  State& s = *s_;
  const auto* h = static_cast<const gin::ep::GpuLlHandle*>(handle.get());
  if (!h || !s.buf || !s.ll)
    throw std::invalid_argument("gin_ep: low_latency_combine needs a handle of this buffer's low_latency_dispatch");
  s.follow(stream);
  const auto* ys = static_cast<const uint16_t*>(y);
  Array out = arrayOf(idx64 ? s.buf->lowLatencyCombine(ys, static_cast<const int64_t*>(idx), weights, *h, defer)
                            : s.buf->lowLatencyCombine(ys, static_cast<const int32_t*>(idx), weights, *h, defer));
  s.join(stream);
  return out;
}

Array Runtime::lowLatencyCombineBuffer(const std::shared_ptr<void>& handle) {
  State& s = *s_;
  const auto* h = static_cast<const gin::ep::GpuLlHandle*>(handle.get());
  const size_t L = size_t(s.shape.localExperts()), R = size_t(s.shape.ranks);
  if (!h || !s.buf || !s.ll || h->srcToken.size() != L * R * size_t(s.shape.tokens))
    throw std::invalid_argument("gin_ep: get_next_low_latency_combine_buffer needs a handle of this buffer's "
                                "low_latency_dispatch (with the current num_max_dispatch_tokens_per_rank)");
  Array a;
  a.ptr = s.buf->lowLatencyCombineBuffer();
  a.count = h->srcToken.size() * size_t(s.shape.hidden);
  return a;
}

void Runtime::receive(uintptr_t stream) {
  State& s = *s_;
  if (!s.buf) throw std::invalid_argument("gin_ep: a receive hook with no low-latency call before it");
  s.follow(stream);
  s.buf->receive();
  s.join(stream);
}

}  // namespace gin_ep_rt
