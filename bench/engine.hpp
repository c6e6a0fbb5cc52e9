// bench/engine.hpp — the engines: what one rank does for each op, on its GPU
// (GpuEngine, under __CUDACC__) or on its CPU thread (CpuEngine), behind one
// interface the ops call.
#pragma once

#include "common.hpp"
#include "kernels.hpp"

namespace bench {

using gin::Window;

// ---------------------------------------------------------------------------
// Engines: what one rank does, on its GPU or on its CPU thread.

struct PingResult {
  double seconds;     // cudaEvents / chrono around the whole run
  uint64_t steadyNs;  // in-run clock, round trips 2..iters (rank 0)
};

// moe: one rank's layer of gin::ep (gin::ep::CpuLayer or gin::ep::GpuLayer).
// Collective: every rank calls the same methods in the same order.
struct MoeTimes {
  double dispatchS, combineS;
};
class MoeRunner {
 public:
  virtual ~MoeRunner() = default;
  // One layer on `in` (kept for timed()); returns this rank's out[T][H].
  virtual std::vector<float> run(const gin::ep::Inputs& in) = 0;
  // One more layer on the last inputs, timed by phase on this rank: dispatch
  // (from the layer's start until every token sent to this rank is here) and
  // combine (experts, the returns, the weighted sums).
  virtual MoeTimes timed() = 0;
};

class Engine {
 public:
  explicit Engine(gin::Comm& c) : comm_(c) {}
  virtual ~Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  virtual bool gpu() const = 0;
  virtual std::string where() const = 0;
  virtual int maxCtas() const = 0;
  virtual void fill(Window w, size_t bytes, uint64_t seed) = 0;
  virtual void poison(Window w, size_t bytes) = 0;
  virtual void resetSignal(uint32_t sig) = 0;
  virtual uint64_t readSignal(uint32_t sig) = 0;
  // Wait until `sig` reaches `least` (bounded by the communicator's timeout);
  // false when the wait gave up. A check of a signal's count waits for it
  // first: neither a put's return nor a flush says the puts have arrived.
  virtual bool waitSignal(uint32_t sig, uint64_t least) = 0;
  // Wait for `least` on `sig`, then compare the window with the pattern. The
  // GPU version only launches; endReceiveCheck() returns the bad count.
  virtual void beginReceiveCheck(Window dst, size_t bytes, uint64_t seed, uint32_t sig, uint64_t least) = 0;
  virtual uint64_t endReceiveCheck() = 0;
  virtual uint64_t checkLocal(Window dst, size_t bytes, uint64_t seed) = 0;
  // Seconds for `iters` puts of `bytes` to rank 1 in shape `sh`.
  virtual double put(CoopKind k, Shape sh, Window dst, Window src, size_t bytes, int iters, uint32_t sig) = 0;
  // Seconds for `iters` copies with the copy engine (CPU: memcpy).
  virtual double copyToPeer(void* peerDst, Window src, size_t bytes, int iters) = 0;
  virtual PingResult pingPong(int iters, uint64_t base, int mode) = 0;
  virtual uint64_t barrierCheck(Window w, int ctas, int iters, uint64_t base) = 0;
  virtual double barrierTime(int ctas, int iters) = 0;
  // msg-rate: seconds for `ctas` x `threads`/32 producers to push `count`
  // descriptors each and see them consumed; throws if a flush gave up.
  virtual double msgRate(int ctas, int threads, int peer, int count) = 0;
  // msg-rate latency: mean ns from a push to its consumption, over `iters`,
  // and mean ns of the push alone (*pushNs).
  virtual double msgLatencyNs(int peer, int iters, double* pushNs) = 0;
  // Mean ns of one rawEcho round trip through words where the rings live.
  virtual double rawEchoNs(int iters) = 0;
  // msg-rate over ibgda: seconds for `ctas` x `threads` producer threads to
  // post `count` WQEs each and see them completed; throws if a flush gave up.
  // batch > 0: through PostBatches of that many slots (one per warp).
  virtual double postRate(int ctas, int threads, int peer, int count, int batch) = 0;
  // Its baseline: seconds for the same threads to store `count` 64-byte
  // records each with plain stores (GPU only; 0 on CPU ranks).
  virtual double storeRate(int, int, int) { return 0; }
  // The posting path alone (GPU only; 0 on CPU ranks): postRate's kernel on
  // copies of the QPs whose queues no NIC reads and whose completions are
  // granted in advance, so no post waits for room or for the NIC.
  virtual double postRateNoNic(int, int, int, int, int) { return 0; }
  // allreduce: fill `count` floats of rank `rank` at p (this rank's memory);
  // count the wrong floats at p and the disturbed guard bytes after them;
  // seconds for `iters` AllReduces of plan.count floats from send to recv.
  virtual void arFill(void* p, size_t count, int rank, uint64_t seed) = 0;
  virtual uint64_t arCheck(const void* p, size_t count, int nRanks, uint64_t seed, size_t guard) = 0;
  virtual double arRun(const gin::coll::RingWorkspace& ws, const gin::coll::RingPlan& plan, Window send, Window recv,
                       int iters) = 0;
  // sendrecv: seconds for `iters` ring shifts of `bytes` (see shiftSend) over
  // `nCh` channels of `fifo`; throws if a send or recv gave up.
  virtual double ringShift(const gin::p2p::Fifo& fifo, Window src, Window dst, size_t bytes, int nCh, int iters) = 0;
  // moe: a layer of shape `sh` on this rank (collective).
  virtual std::unique_ptr<MoeRunner> moeLayer(const gin::ep::Shape& sh, bool lowLatency) = 0;

 protected:
  gin::Comm& comm_;
  // Every peer through the proxy (--transport proxy): device bodies use
  // Net<kBackendProxy>; otherwise Net<kBackendLsa>.
  bool proxy() const { return comm_.devComm().proxyAll != 0; }
  // Every peer through ibgda (--transport ibgda): Net<kBackendIbgda>.
  bool ibgda() const { return comm_.devComm().ibgdaAll != 0; }
};

class CpuMoe final : public MoeRunner {
 public:
  CpuMoe(gin::Comm& c, const gin::ep::Shape& sh, bool ll) : layer_(c, sh, ll) {}
  std::vector<float> run(const gin::ep::Inputs& in) override {
    in_ = in;
    return layer_.run(in_);
  }
  MoeTimes timed() override {
    (void)layer_.run(in_);
    return {layer_.timing().dispatchS, layer_.timing().combineS};
  }

 private:
  gin::ep::CpuLayer layer_;
  gin::ep::Inputs in_;
};

class CpuEngine final : public Engine {
 public:
  using Engine::Engine;
  bool gpu() const override { return false; }
  std::string where() const override { return "CPU thread"; }
  int maxCtas() const override { return kCpuCtas; }
  void fill(Window w, size_t bytes, uint64_t seed) override {
    auto* p = static_cast<uint8_t*>(comm_.localPointer(w));
    for (size_t i = 0; i < bytes; ++i) p[i] = patternByte(seed, i);
  }
  void poison(Window w, size_t bytes) override { std::memset(comm_.localPointer(w), kPoison, bytes); }
  void resetSignal(uint32_t sig) override { net().resetSignal(sig); }
  uint64_t readSignal(uint32_t sig) override { return net().readSignal(sig); }
  bool waitSignal(uint32_t sig, uint64_t least) override { return net().waitSignal(gin::CoopThread{}, sig, least); }
  void beginReceiveCheck(Window dst, size_t bytes, uint64_t seed, uint32_t sig, uint64_t least) override {
    // A CPU rank is its own thread: wait here while rank 0's thread puts.
    // A wait that gave up becomes a verification failure every rank agrees
    // on (not an exception on this rank alone, which would leave the others
    // waiting for it).
    const bool ok = net().waitSignal(gin::CoopThread{}, sig, least);
    pendingBad_ = ok ? checkLocal(dst, bytes, seed) : ~0ull;
  }
  uint64_t endReceiveCheck() override { return pendingBad_; }
  uint64_t checkLocal(Window dst, size_t bytes, uint64_t seed) override {
    const auto* p = static_cast<const uint8_t*>(comm_.localPointer(dst));
    uint64_t bad = 0;
    for (size_t i = 0; i < bytes + kGuard; ++i) bad += p[i] != (i < bytes ? patternByte(seed, i) : kPoison);
    return bad;
  }
  double put(CoopKind k, Shape sh, Window dst, Window src, size_t bytes, int iters, uint32_t sig) override {
    const gin::DevComm& dc = comm_.devComm();
    const auto t0 = Clock::now();
    // A CPU rank runs the CTAs of a GPU launch one after another; on the host
    // every coop is one thread doing the whole coop's share.
    for (int i = 0; i < iters; ++i)
      for (int part = 0; part < sh.ctas; ++part) {
        if (proxy())
          putShare<gin::kBackendProxy>(dc, dst, src, bytes, part, sh.ctas, sig, gin::CoopThread{});
        else if (k == CoopKind::Thread)
          putShare<gin::kBackendLsa>(dc, dst, src, bytes, part, sh.ctas, sig, gin::CoopThread{});
        else if (k == CoopKind::Warp)
          putShare<gin::kBackendLsa>(dc, dst, src, bytes, part, sh.ctas, sig, gin::CoopWarp{});
        else
          putShare<gin::kBackendLsa>(dc, dst, src, bytes, part, sh.ctas, sig, gin::CoopBlock{});
      }
    const double s = seconds(t0);
    comm_.check();
    return s;
  }
  double copyToPeer(void* peerDst, Window src, size_t bytes, int iters) override {
    const void* s = comm_.localPointer(src);
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      std::memcpy(peerDst, s, bytes);
      std::atomic_signal_fence(std::memory_order_seq_cst);  // keep repeated copies from being merged
    }
    return seconds(t0);
  }
  PingResult pingPong(int iters, uint64_t base, int mode) override {
    uint64_t ns = 0;
    const auto t0 = Clock::now();
    const bool ok = pingPong_(iters, base, &ns, mode);
    const double s = seconds(t0);
    comm_.check();
    if (!ok) throw gin::Error("signal ping-pong: a wait gave up without a device error record");
    return {s, ns};
  }
  uint64_t barrierCheck(Window w, int ctas, int iters, uint64_t base) override {
    const gin::DevComm& dc = comm_.devComm();
    auto bars = openBarriers(ctas);
    uint64_t bad = 0;
    // The CTAs of a GPU launch become barrier indices visited in order; every
    // rank visits them in the same order, so this cannot deadlock.
    for (int i = 0; i < iters; ++i)
      for (int b = 0; b < ctas; ++b) {
        const uint64_t v = base + uint64_t(i) + 1;
        barrierWrite(dc, w, uint32_t(b), uint32_t(ctas), v, gin::CoopBlock{});
        bad += bars[size_t(b)]->sync(gin::CoopBlock{}) ? 0 : 1;
        bad += barrierRead(dc, w, uint32_t(b), uint32_t(ctas), v, gin::CoopBlock{});
      }
    bars.clear();
    comm_.check();
    return bad;
  }
  double barrierTime(int ctas, int iters) override {
    auto bars = openBarriers(ctas);
    bool ok = true;
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i)
      for (int b = 0; b < ctas; ++b) ok = bars[size_t(b)]->sync(gin::CoopBlock{}) && ok;
    const double s = seconds(t0);
    bars.clear();
    comm_.check();
    if (!ok) throw gin::Error("barrier: a wait gave up without a device error record");
    return s;
  }
  // A CPU rank has one producer thread: the warps of a launch run in turn.
  double msgRate(int ctas, int threads, int peer, int count) override {
    const gin::DevComm& dc = comm_.devComm();
    const int warps = ctas * std::max(1, threads / 32);
    bool ok = true;
    const auto t0 = Clock::now();
    for (int w = 0; w < warps; ++w) ok = msgBurst(dc, w % dc.nContexts, peer, count) && ok;
    const double s = seconds(t0);
    comm_.check();
    if (!ok) throw gin::Error("msg-rate: a flush gave up without a device error record");
    return s;
  }
  // A CPU rank has one producer thread: the launch's threads run in turn.
  double postRate(int ctas, int threads, int peer, int count, int batch) override {
    const gin::DevComm& dc = comm_.devComm();
    const int producers = ctas * threads;
    bool ok = true;
    const auto t0 = Clock::now();
    for (int t = 0; t < producers; ++t) ok = postBurst(dc, postContext(t, dc.nContexts), peer, count, batch) && ok;
    const double s = seconds(t0);
    comm_.check();
    if (!ok) throw gin::Error("msg-rate: an ibgda flush gave up without a device error record");
    return s;
  }
  double msgLatencyNs(int peer, int iters, double* pushNs) override {
    uint64_t ns = 0, push = 0;
    const bool ok = msgLatency(comm_.devComm(), peer, iters, &ns, &push);
    comm_.check();
    if (!ok) throw gin::Error("msg-rate: a flush gave up without a device error record");
    *pushNs = double(push) / iters;
    return double(ns) / iters;
  }
  double rawEchoNs(int iters) override {
    alignas(64) uint64_t ping = 0;
    alignas(64) uint64_t pong = 0;
    std::thread echo(rawEchoResponder, &ping, &pong, iters);
    const uint64_t ns = rawEcho(&ping, &pong, iters);
    echo.join();
    return double(ns) / iters;
  }
  void arFill(void* p, size_t count, int rank, uint64_t seed) override {
    float* f = static_cast<float*>(p);
    for (size_t i = 0; i < count; ++i) f[i] = arInput(seed, rank, i);
  }
  uint64_t arCheck(const void* p, size_t count, int nRanks, uint64_t seed, size_t guard) override {
    const float* f = static_cast<const float*>(p);
    uint64_t bad = 0;
    for (size_t i = 0; i < count; ++i) bad += f[i] != arExpected(seed, nRanks, i);
    const uint8_t* g = reinterpret_cast<const uint8_t*>(f + count);
    for (size_t i = 0; i < guard; ++i) bad += g[i] != kPoison;
    return bad;
  }
  double arRun(const gin::coll::RingWorkspace& ws, const gin::coll::RingPlan& plan, Window send, Window recv,
               int iters) override {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i)
      gin::coll::runRingAllReduce<float, gin::coll::Sum>(comm_, ws, plan, send, 0, recv, 0);
    return seconds(t0);
  }
  // One thread per rank: each channel's share with sendRecv, channel after
  // channel (every rank visits them in the same order).
  double ringShift(const gin::p2p::Fifo& fifo, Window src, Window dst, size_t bytes, int nCh, int iters) override {
    const gin::DevComm& dc = comm_.devComm();
    bool ok = true;
    const auto t0 = Clock::now();
    for (int i = 0; i < iters && ok; ++i)
      for (int c = 0; c < nCh && ok; ++c) {
        if (ibgda())
          ok = shiftSendRecv<gin::kBackendIbgda>(dc, fifo, src, dst, bytes, c, nCh, gin::CoopThread{});
        else if (proxy())
          ok = shiftSendRecv<gin::kBackendProxy>(dc, fifo, src, dst, bytes, c, nCh, gin::CoopThread{});
        else
          ok = shiftSendRecv<gin::kBackendLsa>(dc, fifo, src, dst, bytes, c, nCh, gin::CoopThread{});
      }
    const double s = seconds(t0);
    comm_.check();
    if (!ok) throw gin::Error("sendrecv: a send or recv gave up without a device error record");
    return s;
  }
  std::unique_ptr<MoeRunner> moeLayer(const gin::ep::Shape& sh, bool ll) override {
    return std::make_unique<CpuMoe>(comm_, sh, ll);
  }

 private:
  using Clock = std::chrono::steady_clock;
  using Bar = gin::LsaBarrierSession<gin::CoopBlock>;
  uint64_t pendingBad_ = 0;

  static double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
  gin::Net<gin::kBackendLsa> net() const { return gin::Net<gin::kBackendLsa>(comm_.devComm(), 0); }
  bool pingPong_(int iters, uint64_t base, uint64_t* ns, int mode) {
    if (ibgda()) return bench::pingPong<gin::kBackendIbgda>(comm_.devComm(), iters, base, ns, mode);
    return proxy() ? bench::pingPong<gin::kBackendProxy>(comm_.devComm(), iters, base, ns, mode)
                   : bench::pingPong<gin::kBackendLsa>(comm_.devComm(), iters, base, ns, mode);
  }
  std::vector<std::unique_ptr<Bar>> openBarriers(int ctas) {
    std::vector<std::unique_ptr<Bar>> bars;
    for (int b = 0; b < ctas; ++b)
      bars.push_back(std::make_unique<Bar>(gin::CoopBlock{}, comm_.devComm(), uint32_t(b)));
    return bars;
  }
};

#if defined(__CUDACC__)
#define BENCH_CUDA(call) GIN_CUDA_CHECK(call)

// gin::ep::GpuLayer on the rank's stream; cudaEvents split the layer into its
// dispatch and combine phases (GpuLayer::launch records `dispatched`).
class GpuMoe final : public MoeRunner {
 public:
  GpuMoe(gin::Comm& c, const gin::ep::Shape& sh, bool ll, cudaStream_t st) : st_(st), layer_(c, sh, ll, st) {
    for (cudaEvent_t* e : {&e0_, &e1_, &e2_}) BENCH_CUDA(cudaEventCreate(e));
  }
  ~GpuMoe() override {
    (void)cudaStreamSynchronize(st_);
    for (cudaEvent_t e : {e0_, e1_, e2_}) (void)cudaEventDestroy(e);
  }
  std::vector<float> run(const gin::ep::Inputs& in) override { return layer_.run(in); }
  MoeTimes timed() override {
    layer_.rearm();
    BENCH_CUDA(cudaEventRecord(e0_, st_));
    layer_.launch(e1_);
    BENCH_CUDA(cudaEventRecord(e2_, st_));
    layer_.wait();
    float d = 0, c = 0;
    BENCH_CUDA(cudaEventElapsedTime(&d, e0_, e1_));
    BENCH_CUDA(cudaEventElapsedTime(&c, e1_, e2_));
    return {double(d) * 1e-3, double(c) * 1e-3};
  }

 private:
  cudaStream_t st_;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr, e2_ = nullptr;
  gin::ep::GpuLayer layer_;
};

class GpuEngine final : public Engine {
 public:
  explicit GpuEngine(gin::Comm& c) : Engine(c) {
    comm_.makeCurrent();
    dev_ = comm_.cudaDevice();
    cudaDeviceProp p{};
    BENCH_CUDA(cudaGetDeviceProperties(&p, dev_));
    name_ = p.name;
    BENCH_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev_));
    BENCH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    BENCH_CUDA(cudaEventCreate(&e0_));
    BENCH_CUDA(cudaEventCreate(&e1_));
    BENCH_CUDA(cudaMalloc(&scratch_, kScratchWords * sizeof(unsigned long long)));
    // Load every kernel now: with lazy loading, a kernel's first launch may
    // wait for the device to go idle, which must not happen while another
    // kernel spins on a peer, nor inside a timed region.
    cudaFuncAttributes a{};
    BENCH_CUDA(cudaFuncGetAttributes(&a, putKernel<gin::kBackendLsa, gin::CoopThread>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, putKernel<gin::kBackendLsa, gin::CoopWarp>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, putKernel<gin::kBackendLsa, gin::CoopBlock>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, putKernel<gin::kBackendProxy, gin::CoopThread>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, putKernel<gin::kBackendProxy, gin::CoopWarp>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, putKernel<gin::kBackendProxy, gin::CoopBlock>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, pingKernel<gin::kBackendProxy>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, pingKernel<gin::kBackendIbgda>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, msgBurstKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, msgLatencyKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, fillKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, verifyKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, waitSignalKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, resetSignalKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, readSignalKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, pingKernel<gin::kBackendLsa>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, ginBarrierKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, ginBarrierCheckKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, arFillKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, arCheckKernel));
    {
      using gin::coll::ringAllReduceKernel, gin::coll::Sum;
      using namespace gin;
      BENCH_CUDA(cudaFuncGetAttributes(&a, ringAllReduceKernel<float, Sum, true, kBackendLsa, coll::kPathRing>));
      BENCH_CUDA(cudaFuncGetAttributes(&a, ringAllReduceKernel<float, Sum, false, kBackendLsa, coll::kPathRing>));
      BENCH_CUDA(cudaFuncGetAttributes(&a, ringAllReduceKernel<float, Sum, true, kBackendLsa, coll::kPathLl>));
      BENCH_CUDA(cudaFuncGetAttributes(&a, ringAllReduceKernel<float, Sum, true, kBackendLsa, coll::kPathDirect>));
      BENCH_CUDA(cudaFuncGetAttributes(&a, ringAllReduceKernel<float, Sum, true, kBackendLsa, coll::kPathShot>));
      BENCH_CUDA(cudaFuncGetAttributes(&a, ringAllReduceKernel<float, Sum, true, kBackendAll, coll::kPathRing>));
    }
    BENCH_CUDA(cudaFuncGetAttributes(&a, ringShiftKernel<gin::kBackendLsa>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, ringShiftKernel<gin::kBackendProxy>));
    BENCH_CUDA(cudaFuncGetAttributes(&a, ringShiftKernel<gin::kBackendIbgda>));
#if GIN_BENCH_NCCL
    BENCH_CUDA(cudaFuncGetAttributes(&a, ncclBarrierKernel));
    BENCH_CUDA(cudaFuncGetAttributes(&a, ncclBarrierCheckKernel));
#endif
  }
  ~GpuEngine() override {
    cudaSetDevice(dev_);
    cudaStreamSynchronize(stream_);
    cudaFree(scratch_);
    cudaFree(storeRing_);
    for (void* p : noNicMem_) cudaFree(p);
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
    cudaStreamDestroy(stream_);
  }
  bool gpu() const override { return true; }
  std::string where() const override { return fmt("GPU %d (%s, %d SMs)", dev_, name_.c_str(), sms_); }
  int maxCtas() const override { return sms_; }

  void fill(Window w, size_t bytes, uint64_t seed) override {
    fillKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<uint8_t*>(comm_.localPointer(w)), bytes, seed);
    launched();
    sync();
  }
  void poison(Window w, size_t bytes) override {
    BENCH_CUDA(cudaMemsetAsync(comm_.localPointer(w), kPoison, bytes, stream_));
    sync();
  }
  void resetSignal(uint32_t sig) override {
    resetSignalKernel<<<1, 1, 0, stream_>>>(comm_.devComm(), sig);
    launched();
    sync();
  }
  uint64_t readSignal(uint32_t sig) override {
    readSignalKernel<<<1, 1, 0, stream_>>>(comm_.devComm(), sig, scratch_);
    launched();
    return fetch(0);
  }
  bool waitSignal(uint32_t sig, uint64_t least) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_ + 1, 0, sizeof(unsigned long long), stream_));
    waitSignalKernel<<<1, 1, 0, stream_>>>(comm_.devComm(), sig, least, scratch_ + 1);
    launched();
    return fetch(1) == 0;
  }
  void beginReceiveCheck(Window dst, size_t bytes, uint64_t seed, uint32_t sig, uint64_t least) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, 2 * sizeof(unsigned long long), stream_));
    waitSignalKernel<<<1, 1, 0, stream_>>>(comm_.devComm(), sig, least, scratch_ + 1);
    launched();
    verifyKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<const uint8_t*>(comm_.localPointer(dst)), bytes, kGuard,
                                                seed, scratch_);
    launched();
  }
  uint64_t endReceiveCheck() override {
    // No comm.check() here: a wait that gave up becomes a verification
    // failure every rank agrees on (see CpuEngine).
    BENCH_CUDA(cudaStreamSynchronize(stream_));
    unsigned long long h[2] = {0, 0};
    BENCH_CUDA(cudaMemcpy(h, scratch_, sizeof h, cudaMemcpyDeviceToHost));
    return h[1] ? ~0ull : h[0];
  }
  uint64_t checkLocal(Window dst, size_t bytes, uint64_t seed) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    verifyKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<const uint8_t*>(comm_.localPointer(dst)), bytes, kGuard,
                                                seed, scratch_);
    launched();
    return fetch(0);
  }
  double put(CoopKind k, Shape sh, Window dst, Window src, size_t bytes, int iters, uint32_t sig) override {
    const gin::DevComm dc = comm_.devComm();
    if (proxy()) return putWith<gin::kBackendProxy>(k, sh, dc, dst, src, bytes, iters, sig);
    return putWith<gin::kBackendLsa>(k, sh, dc, dst, src, bytes, iters, sig);
  }
  void setPeerDevice(int d) { peerDev_ = d; }
  double copyToPeer(void* peerDst, Window src, size_t bytes, int iters) override {
    const void* s = comm_.localPointer(src);
    return timed([&] {
      for (int i = 0; i < iters; ++i) BENCH_CUDA(cudaMemcpyPeerAsync(peerDst, peerDev_, s, dev_, bytes, stream_));
    });
  }
  PingResult pingPong(int iters, uint64_t base, int mode) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, 2 * sizeof(unsigned long long), stream_));
    const double s = timed([&] {
      if (ibgda())
        pingKernel<gin::kBackendIbgda><<<1, 1, 0, stream_>>>(comm_.devComm(), iters, base, mode, scratch_);
      else if (proxy())
        pingKernel<gin::kBackendProxy><<<1, 1, 0, stream_>>>(comm_.devComm(), iters, base, mode, scratch_);
      else
        pingKernel<gin::kBackendLsa><<<1, 1, 0, stream_>>>(comm_.devComm(), iters, base, mode, scratch_);
    });
    unsigned long long h[2] = {0, 0};
    BENCH_CUDA(cudaMemcpy(h, scratch_, sizeof h, cudaMemcpyDeviceToHost));
    if (!h[0]) throw gin::Error("signal ping-pong: a wait gave up without a device error record");
    return {s, h[1]};
  }
  uint64_t barrierCheck(Window w, int ctas, int iters, uint64_t base) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    ginBarrierCheckKernel<<<ctas, kBarrierThreads, 0, stream_>>>(comm_.devComm(), w, iters, base, scratch_);
    launched();
    return fetch(0);
  }
  double barrierTime(int ctas, int iters) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    const double s =
        timed([&] { ginBarrierKernel<<<ctas, kBarrierThreads, 0, stream_>>>(comm_.devComm(), iters, scratch_); });
    if (fetch(0)) throw gin::Error("barrier: a wait gave up without a device error record");
    return s;
  }

  double msgRate(int ctas, int threads, int peer, int count) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    const double s =
        timed([&] { msgBurstKernel<<<ctas, threads, 0, stream_>>>(comm_.devComm(), peer, count, scratch_); });
    if (fetch(0)) throw gin::Error("msg-rate: a flush gave up without a device error record");
    return s;
  }
  void arFill(void* p, size_t count, int rank, uint64_t seed) override {
    arFillKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<float*>(p), count, rank, seed);
    launched();
    sync();
  }
  uint64_t arCheck(const void* p, size_t count, int nRanks, uint64_t seed, size_t guard) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    arCheckKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<const float*>(p), count, nRanks, seed, guard, scratch_);
    launched();
    return fetch(0);
  }
  double arRun(const gin::coll::RingWorkspace& ws, const gin::coll::RingPlan& plan, Window send, Window recv,
               int iters) override {
    return timed([&] {
      for (int i = 0; i < iters; ++i)
        gin::coll::launchRingAllReduce<float, gin::coll::Sum>(comm_, ws, plan, send, 0, recv, 0, stream_);
    });
  }
  void poisonBytes(void* p, size_t bytes) {
    BENCH_CUDA(cudaMemsetAsync(p, kPoison, bytes, stream_));
    sync();
  }
  // The byte pattern of `seed` at p (device memory), and its mismatches
  // (plus `guard` bytes after it that must still hold the poison).
  void fillBytes(void* p, size_t bytes, uint64_t seed) {
    if (bytes == 0) return;
    fillKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<uint8_t*>(p), bytes, seed);
    launched();
    sync();
  }
  uint64_t checkBytes(const void* p, size_t bytes, uint64_t seed, size_t guard = 0) {
    if (bytes + guard == 0) return 0;
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    verifyKernel<<<sms_ * 4, 256, 0, stream_>>>(static_cast<const uint8_t*>(p), bytes, guard, seed, scratch_);
    launched();
    return fetch(0);
  }
  double ringShift(const gin::p2p::Fifo& fifo, Window src, Window dst, size_t bytes, int nCh, int iters) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    const gin::DevComm dc = comm_.devComm();
    const double s = timed([&] {
      for (int i = 0; i < iters; ++i) {
        if (ibgda())
          ringShiftKernel<gin::kBackendIbgda>
              <<<2 * nCh, kSrThreads, 0, stream_>>>(dc, fifo, src, dst, bytes, nCh, scratch_);
        else if (proxy())
          ringShiftKernel<gin::kBackendProxy>
              <<<2 * nCh, kSrThreads, 0, stream_>>>(dc, fifo, src, dst, bytes, nCh, scratch_);
        else
          ringShiftKernel<gin::kBackendLsa>
              <<<2 * nCh, kSrThreads, 0, stream_>>>(dc, fifo, src, dst, bytes, nCh, scratch_);
      }
    });
    if (fetch(0)) throw gin::Error("sendrecv: a send or recv gave up without a device error record");
    return s;
  }
  std::unique_ptr<MoeRunner> moeLayer(const gin::ep::Shape& sh, bool ll) override {
    return std::make_unique<GpuMoe>(comm_, sh, ll, stream_);
  }
  void copyLocal(void* dst, const void* src, size_t bytes) {
    BENCH_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    sync();
  }
#if GIN_BENCH_NCCL
  double ncclAllReduceTime(ncclComm_t nc, const void* send, void* recv, size_t count, int iters) {
    ncclResult_t r = ncclSuccess;
    const double t = timed([&] {
      for (int i = 0; i < iters && r == ncclSuccess; ++i)
        r = ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, nc, stream_);
    });
    if (r != ncclSuccess) throw gin::Error(std::string("ncclAllReduce failed: ") + ncclGetErrorString(r));
    return t;
  }
  // One ncclGroupStart/End per iteration holding an ncclSend of sends[i]
  // bytes at send + sendOff[i] to peer i and an ncclRecv of recvs[i] at
  // recv + recvOff[i] from peer i, for every peer with bytes (this rank
  // included: NCCL copies to itself). Zero-byte pairs are left out on both
  // sides (the sizes are symmetric).
  double ncclExchange(ncclComm_t nc, const uint8_t* send, const std::vector<size_t>& sendOff,
                      const std::vector<size_t>& sends, uint8_t* recv, const std::vector<size_t>& recvOff,
                      const std::vector<size_t>& recvs, int iters) {
    ncclResult_t r = ncclSuccess;
    const char* what = "";
    auto step = [&](ncclResult_t x, const char* call) {
      if (x != ncclSuccess && r == ncclSuccess) r = x, what = call;
    };
    const double t = timed([&] {
      for (int i = 0; i < iters && r == ncclSuccess; ++i) {
        step(ncclGroupStart(), "ncclGroupStart");
        for (size_t p = 0; p < sends.size(); ++p) {
          if (sends[p]) step(ncclSend(send + sendOff[p], sends[p], ncclUint8, int(p), nc, stream_), "ncclSend");
          if (recvs[p]) step(ncclRecv(recv + recvOff[p], recvs[p], ncclUint8, int(p), nc, stream_), "ncclRecv");
        }
        step(ncclGroupEnd(), "ncclGroupEnd");
      }
    });
    if (r != ncclSuccess) throw gin::Error(std::string(what) + " failed: " + ncclGetErrorString(r));
    return t;
  }
#endif
  double postRate(int ctas, int threads, int peer, int count, int batch) override {
    return timedPostBurst(comm_.devComm(), ctas, threads, peer, count, batch,
                          "an ibgda flush gave up without a device error record");
  }
  double postRateNoNic(int ctas, int threads, int peer, int count, int batch) override {
    if (!noNic_) noNic_ = noNicComm();
    return timedPostBurst(*noNic_, ctas, threads, peer, count, batch, "a post to the NIC-free queues failed");
  }
  double storeRate(int ctas, int threads, int count) override {
    if (!storeRing_) BENCH_CUDA(cudaMalloc(&storeRing_, size_t(kStoreRingSlots) * 64));
    return timed([&] { storeWqesKernel<<<ctas, threads, 0, stream_>>>(storeRing_, count); });
  }
  double msgLatencyNs(int peer, int iters, double* pushNs) override {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, 3 * sizeof(unsigned long long), stream_));
    msgLatencyKernel<<<1, 1, 0, stream_>>>(comm_.devComm(), peer, iters, scratch_);
    launched();
    sync();
    unsigned long long h[3] = {0, 0, 0};
    BENCH_CUDA(cudaMemcpy(h, scratch_, sizeof h, cudaMemcpyDeviceToHost));
    if (!h[0]) throw gin::Error("msg-rate: a flush gave up without a device error record");
    *pushNs = double(h[2]) / iters;
    return double(h[1]) / iters;
  }
  // The words sit in mapped pinned host memory, like the rings.
  double rawEchoNs(int iters) override {
    uint64_t* words = nullptr;
    BENCH_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&words), 128, cudaHostAllocMapped | cudaHostAllocPortable));
    words[0] = words[8] = 0;
    uint64_t* dev = nullptr;
    BENCH_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), words, 0));
    std::thread echo(rawEchoResponder, words, words + 8, iters);
    rawEchoKernel<<<1, 1, 0, stream_>>>(dev, dev + 8, iters, scratch_);
    launched();
    sync();
    echo.join();
    unsigned long long ns = 0;
    BENCH_CUDA(cudaMemcpy(&ns, scratch_, sizeof ns, cudaMemcpyDeviceToHost));
    BENCH_CUDA(cudaFreeHost(words));
    return double(ns) / iters;
  }

#if GIN_BENCH_NCCL
  uint64_t ncclBarrierCheck(const ncclDevComm& ndc, Window w, int ctas, int iters, uint64_t base) {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    ncclBarrierCheckKernel<<<ctas, kBarrierThreads, 0, stream_>>>(ndc, comm_.devComm(), w, iters, base, scratch_);
    launched();
    return fetch(0);
  }
  double ncclBarrierTime(const ncclDevComm& ndc, int ctas, int iters) {
    return timed([&] { ncclBarrierKernel<<<ctas, kBarrierThreads, 0, stream_>>>(ndc, iters); });
  }
#endif

 private:
  static constexpr int kScratchWords = 8;
  int dev_ = -1, peerDev_ = -1, sms_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
  unsigned long long* scratch_ = nullptr;
  unsigned long long* storeRing_ = nullptr;  // msg-rate's plain-store baseline
  std::optional<gin::DevComm> noNic_;        // msg-rate's NIC-free queues (postRateNoNic)
  std::vector<void*> noNicMem_;

  template <class T>
  T* noNicAlloc(size_t n) {
    void* p = nullptr;
    BENCH_CUDA(cudaMalloc(&p, n * sizeof(T)));
    BENCH_CUDA(cudaMemset(p, 0, n * sizeof(T)));
    noNicMem_.push_back(p);
    return static_cast<T*>(p);
  }
  // The communicator's DevComm with ibgda pointing at copies of its QPs in
  // fresh device memory: queues of 2^15 WQEs, doorbell records, UAR word and
  // state of their own, `done` far ahead (every slot free), so posts never
  // wait; nothing reads what they write. Keys and the NIC's placement
  // (GPU-scope or system-scope doorbells) stay the communicator's.
  gin::DevComm noNicComm() {
    gin::DevComm dc = comm_.devComm();
    gin::IbgdaDev ib{};
    BENCH_CUDA(cudaMemcpy(&ib, dc.ibgda, sizeof ib, cudaMemcpyDeviceToHost));
    const size_t nQps = size_t(dc.nContexts) * size_t(dc.nRanks);
    std::vector<gin::IbgdaQpDev> qps(nQps);
    BENCH_CUDA(cudaMemcpy(qps.data(), ib.qps, nQps * sizeof(gin::IbgdaQpDev), cudaMemcpyDeviceToHost));
    constexpr uint32_t kDepth = 1u << 15;
    for (gin::IbgdaQpDev& q : qps) {
      q.nWqe = q.nCqe = kDepth;
      q.sq = noNicAlloc<uint8_t>(size_t(kDepth) * 64);
      q.dbrec = noNicAlloc<uint32_t>(2);
      q.uar = noNicAlloc<uint64_t>(1);
      q.cq = noNicAlloc<gin::mlx5::Cqe64>(kDepth);  // never read: no post waits
      q.cqDbrec = noNicAlloc<uint32_t>(2);
      q.counterOf = noNicAlloc<uint32_t>(kDepth);
      q.state = noNicAlloc<gin::IbgdaQpState>(1);
      gin::IbgdaQpState st{};
      st.done = uint64_t(1) << 62;  // every slot complete, for 2^62 WQEs
      BENCH_CUDA(cudaMemcpy(q.state, &st, sizeof st, cudaMemcpyHostToDevice));
    }
    ib.qps = noNicAlloc<gin::IbgdaQpDev>(nQps);
    BENCH_CUDA(cudaMemcpy(ib.qps, qps.data(), nQps * sizeof(gin::IbgdaQpDev), cudaMemcpyHostToDevice));
    gin::IbgdaDev* devIb = noNicAlloc<gin::IbgdaDev>(1);
    BENCH_CUDA(cudaMemcpy(devIb, &ib, sizeof ib, cudaMemcpyHostToDevice));
    dc.ibgda = devIb;
    return dc;
  }

  void launched() { BENCH_CUDA(cudaGetLastError()); }
  // Seconds for postBurstKernel over dc's QPs; throws `failure` if a producer failed.
  double timedPostBurst(const gin::DevComm& dc, int ctas, int threads, int peer, int count, int batch,
                        const char* failure) {
    BENCH_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(unsigned long long), stream_));
    const double s = timed([&] { postBurstKernel<<<ctas, threads, 0, stream_>>>(dc, peer, count, batch, scratch_); });
    if (fetch(0)) throw gin::Error(std::string("msg-rate: ") + failure);
    return s;
  }
  template <unsigned B>
  double putWith(CoopKind k, Shape sh, const gin::DevComm& dc, Window dst, Window src, size_t bytes, int iters,
                 uint32_t sig) {
    return timed([&] {
      if (k == CoopKind::Thread)
        putKernel<B, gin::CoopThread><<<1, 1, 0, stream_>>>(dc, dst, src, bytes, iters, sig);
      else if (k == CoopKind::Warp)
        putKernel<B, gin::CoopWarp><<<1, 32, 0, stream_>>>(dc, dst, src, bytes, iters, sig);
      else
        putKernel<B, gin::CoopBlock><<<sh.ctas, sh.threads, 0, stream_>>>(dc, dst, src, bytes, iters, sig);
    });
  }
  // Wait for this rank's work; a device-side failure (a wait that timed out)
  // becomes the gin::Error that names it.
  void sync() {
    const cudaError_t e = cudaStreamSynchronize(stream_);
    comm_.check();
    BENCH_CUDA(e);
  }
  uint64_t fetch(int word) {
    sync();
    unsigned long long h = 0;
    BENCH_CUDA(cudaMemcpy(&h, scratch_ + word, sizeof h, cudaMemcpyDeviceToHost));
    return h;
  }
  template <class Launch>
  double timed(Launch launch) {
    BENCH_CUDA(cudaEventRecord(e0_, stream_));
    launch();
    launched();
    BENCH_CUDA(cudaEventRecord(e1_, stream_));
    sync();
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, e0_, e1_));
    return double(ms) * 1e-3;
  }
};
#endif  // __CUDACC__

}  // namespace bench
