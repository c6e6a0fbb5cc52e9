// gin-bench — gin's benchmark program: bandwidth of puts, signal round-trip
// latency and barrier latency over the lsa transport, the proxy's descriptor
// rate, the ring AllReduce, p2p send/recv and the MoE dispatch/combine of
// gin::ep, between GPUs of one host (one process, one thread and one
// gin::Comm per GPU) or between CPU ranks (threads) running the same device API.
//
//   gin-bench OP [--transport lsa|proxy|ibgda] [--ranks N] [--emulate] [--sizes MIN:MAX]
//                [--iters K] [--json FILE] [--no-nccl] [--channels N] [--channel-bytes B] [--contexts C]
//                [--qp-depth D] [--defer-doorbell] [--post-batch B]
//                [--mode normal|ll|both] [--tokens T] [--hidden H] [--batch B] [--slots S]
//   OP: put-bw | signal-lat | barrier | msg-rate | allreduce | sendrecv | moe
//
// Every op first checks that what it times did the right thing (bytes,
// signal values, barrier ordering) and exits 1 if not, so a fast wrong number
// is never printed. The kernels' bodies are GIN_HD functions, so the CPU
// emulation times the same gin code the GPUs run (only the clock differs).
//
// This file is compiled by nvcc (GPU + CPU paths) and, through
// gin_bench_cpu.cpp, by a plain C++ compiler (CPU path only): everything that
// touches CUDA sits under __CUDACC__.
//
// Layout: common.hpp (includes, options, report, shared helpers), json.hpp
// (the JSON writer), kernels.hpp (device bodies and kernels), engine.hpp (the
// CPU and GPU engines), nccl.hpp (the NCCL baseline) and one header per op
// under ops/; this file holds the command line and the driver.
#include "common.hpp"
#include "engine.hpp"
#include "ops/allreduce.hpp"
#include "ops/barrier.hpp"
#include "ops/moe.hpp"
#include "ops/msg_rate.hpp"
#include "ops/put_bw.hpp"
#include "ops/sendrecv.hpp"
#include "ops/signal_lat.hpp"

namespace bench {

// ---------------------------------------------------------------------------
// Command line.

const char* kUsage =
    "usage: gin-bench OP [--transport lsa|proxy|ibgda] [--ranks N] [--emulate] [--sizes MIN:MAX] [--iters K]\n"
    "                    [--json FILE] [--no-nccl] [--contexts C] [--qp-depth D] [--defer-doorbell]\n"
    "                    [--post-batch B]\n"
    "  OP            put-bw | signal-lat | barrier | msg-rate (descriptors/s into the proxy) |\n"
    "                allreduce (ring AllReduce, float sum, next to ncclAllReduce on GPUs) |\n"
    "                sendrecv (p2p send/recv ring shift, next to ncclSend/ncclRecv on GPUs) |\n"
    "                moe (gin::ep dispatch and combine, next to an NCCL send/recv all-to-all)\n"
    "  --transport   lsa (default) or proxy (every peer through the proxy engine; msg-rate\n"
    "                uses it unless told ibgda). With proxy, ranks may share a GPU (--ranks > GPUs)\n"
    "                ibgda: msg-rate (the WQE post rate into the soft NIC in sink mode),\n"
    "                sendrecv and signal-lat (through the soft NIC); GIN_IBGDA_DEVICE picks another NIC\n"
    "  --ranks N     GPUs: default all visible (one host thread + gin::Comm per GPU);\n"
    "                --emulate: CPU ranks as threads, default 2\n"
    "  --emulate     run CPU ranks (threads) through the same gin device API; also the\n"
    "                fallback when no GPU is visible. Numbers are CPU numbers.\n"
    "  --sizes A:B   put-bw, allreduce, sendrecv: powers of two from A to B bytes (suffixes K, M, G =\n"
    "                KiB, MiB, GiB); put-bw default 8:1G on GPUs, 8:16M emulated; allreduce and\n"
    "                sendrecv 4K:1G, 4K:1M emulated\n"
    "  --iters K     put-bw: at most K puts per timed kernel (default 1000); allreduce, sendrecv:\n"
    "                operations per timed run (default by size); moe: timed layers (default 20,\n"
    "                emulated 3); signal-lat: round trips\n"
    "                per run (default 10000, emulated 2000); barrier: syncs per run (default\n"
    "                10000, emulated 1000)\n"
    "  --json FILE   also write the results as JSON\n"
    "  --no-nccl     do not set up NCCL for the barrier, allreduce, sendrecv and moe comparisons\n"
    "  --channels N  sendrecv: the most p2p channels (CTA pairs) a transfer is spread over (default\n"
    "                32, emulated 2); moe: channels of the normal mode (default 132 / (1 + ranks),\n"
    "                at most 64; half that over proxy or ibgda; emulated 2)\n"
    "  --channel-bytes B  sendrecv: one channel per B bytes of the message (suffixes K/M; default 16K)\n"
    "  --ll-bytes B  sendrecv: a channel's share of up to B bytes goes as one LL16 step over lsa\n"
    "                (p2p::Config::llMaxBytes; default 16K; 0: always the FIFO)\n"
    "  --contexts C  network contexts (QPs per peer; CommConfig::nContexts, default 4); msg-rate\n"
    "                puts the producers of warp w on context w % C\n"
    "  --qp-depth D  ibgda: WQEs per QP (IbgdaConfig::qpDepth, a power of two from 2 to 32768;\n"
    "                default 256)\n"
    "  --defer-doorbell  ibgda: posts only publish; flush rings (IbgdaConfig::deferDoorbell)\n"
    "  --post-batch B  msg-rate --transport ibgda: each warp posts through a PostBatch of B slots\n"
    "                (gin/device/batch.hpp; clamped to half the queue depth less one)\n"
    "  --mode M      moe: normal (4096 tokens per rank), ll (low latency, 128 tokens) or both (default)\n"
    "  --tokens T    moe: tokens per rank (default by mode; emulated 256 normal, 32 ll)\n"
    "  --hidden H    moe: hidden size in bf16 elements (default 7168, emulated 1024)\n"
    "  --batch B     moe: normal mode advances ring tails and heads every B slots (default 1:\n"
    "                every step; at most the ring's slots are useful)\n"
    "  --slots S     moe: normal mode's ring slots per (source, channel) (default 32, emulated 4)\n";

[[noreturn]] void usageError(const std::string& msg) {
  std::fprintf(stderr, "gin-bench: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

bool parseInt(const std::string& s, long lo, long hi, long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (errno || !end || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parseSize(const std::string& s, uint64_t* out) {
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno) return false;
  std::string suf(end);
  for (auto& ch : suf) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  int shift = 0;
  if (suf == "" || suf == "B")
    shift = 0;
  else if (suf == "K" || suf == "KB" || suf == "KIB")
    shift = 10;
  else if (suf == "M" || suf == "MB" || suf == "MIB")
    shift = 20;
  else if (suf == "G" || suf == "GB" || suf == "GIB")
    shift = 30;
  else
    return false;
  if (v == 0 || v > (~0ull >> (shift + 1))) return false;
  *out = uint64_t(v) << shift;
  return true;
}

Options parseArgs(int argc, char** argv) {
  Options o;
  bool haveOp = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], val;
    bool inlineVal = false;
    if (a.rfind("--", 0) == 0) {
      const size_t eq = a.find('=');
      if (eq != std::string::npos) {
        val = a.substr(eq + 1);
        a = a.substr(0, eq);
        inlineVal = true;
      }
    }
    auto value = [&]() -> std::string {
      if (inlineVal) return val;
      if (i + 1 >= argc) usageError(a + " needs a value");
      return argv[++i];
    };
    auto noValue = [&] {
      if (inlineVal) usageError(a + " takes no value");
    };
    if (a == "-h" || a == "--help") {
      std::printf("%s", kUsage);
      std::exit(0);
    } else if (a == "--transport") {
      o.transport = value();
      if (o.transport != "lsa" && o.transport != "proxy" && o.transport != "ibgda")
        usageError("--transport " + o.transport + ": expected lsa, proxy or ibgda");
      o.transportGiven = true;
    } else if (a == "--ranks") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 1024, &n)) usageError("--ranks " + v + ": expected a whole number from 1 to 1024");
      o.ranks = int(n);
    } else if (a == "--emulate") {
      noValue();
      o.emulate = true;
    } else if (a == "--sizes") {
      const std::string v = value();
      const size_t c = v.find(':');
      if (c == std::string::npos || !parseSize(v.substr(0, c), &o.minSize) || !parseSize(v.substr(c + 1), &o.maxSize))
        usageError("--sizes " + v + ": expected MIN:MAX in bytes, e.g. 8:1G or 4K:64M (suffixes K, M, G)");
      if (o.minSize > o.maxSize) usageError("--sizes " + v + ": MIN is larger than MAX");
      o.sizesGiven = true;
    } else if (a == "--iters") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 100000000, &n)) usageError("--iters " + v + ": expected a whole number from 1 to 100000000");
      o.iters = n;
    } else if (a == "--json") {
      o.json = value();
      if (o.json.empty()) usageError("--json needs a file name");
    } else if (a == "--no-nccl") {
      noValue();
      o.noNccl = true;
    } else if (a == "--channels") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 64, &n)) usageError("--channels " + v + ": expected a whole number from 1 to 64");
      o.channels = int(n);
    } else if (a == "--channel-bytes") {
      const std::string v = value();
      if (!parseSize(v, &o.channelBytes) || o.channelBytes == 0)
        usageError("--channel-bytes " + v + ": expected a size of at least 1 byte (suffixes K, M, G)");
    } else if (a == "--ll-bytes") {
      const std::string v = value();
      uint64_t b = 0;
      if (v != "0" && (!parseSize(v, &b) || b > (1u << 20)))
        usageError("--ll-bytes " + v + ": expected a size from 0 to 1M (suffixes K, M)");
      o.llBytes = int64_t(b);
    } else if (a == "--batch") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 1024, &n)) usageError("--batch " + v + ": expected a whole number from 1 to 1024");
      o.batch = int(n);
    } else if (a == "--slots") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 1024, &n)) usageError("--slots " + v + ": expected a whole number from 1 to 1024");
      o.slots = int(n);
    } else if (a == "--mode") {
      o.mode = value();
      if (o.mode != "normal" && o.mode != "ll" && o.mode != "both")
        usageError("--mode " + o.mode + ": expected normal, ll or both");
      o.modeGiven = true;
    } else if (a == "--tokens") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 0, 1 << 20, &n)) usageError("--tokens " + v + ": expected a whole number from 0 to 1048576");
      o.tokens = int(n);
      o.tokensGiven = true;
    } else if (a == "--contexts") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 64, &n)) usageError("--contexts " + v + ": expected a whole number from 1 to 64");
      o.contexts = int(n);
    } else if (a == "--qp-depth") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 2, 1 << 15, &n) || (n & (n - 1)))
        usageError("--qp-depth " + v + ": expected a power of two from 2 to 32768");
      o.qpDepth = int(n);
    } else if (a == "--defer-doorbell") {
      o.deferDoorbell = true;
    } else if (a == "--post-batch") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, (1 << 15) - 1, &n))
        usageError("--post-batch " + v + ": expected a whole number from 1 to 32767");
      o.postBatch = int(n);
    } else if (a == "--hidden") {
      long n = 0;
      const std::string v = value();
      if (!parseInt(v, 1, 1 << 16, &n)) usageError("--hidden " + v + ": expected a whole number from 1 to 65536");
      o.hidden = int(n);
    } else if (!a.empty() && a[0] == '-') {
      usageError("unknown option " + a);
    } else {
      if (haveOp) usageError("more than one OP given (" + o.opName + " and " + a + ")");
      haveOp = true;
      o.opName = a;
      if (a == "put-bw")
        o.op = Op::PutBw;
      else if (a == "signal-lat")
        o.op = Op::SignalLat;
      else if (a == "barrier")
        o.op = Op::Barrier;
      else if (a == "msg-rate")
        o.op = Op::MsgRate;
      else if (a == "allreduce")
        o.op = Op::AllReduce;
      else if (a == "sendrecv")
        o.op = Op::SendRecv;
      else if (a == "moe")
        o.op = Op::Moe;
      else
        usageError("unknown OP " + a + " (expected put-bw, signal-lat, barrier, msg-rate, allreduce, sendrecv or moe)");
    }
  }
  if (!haveOp) usageError("no OP given");
  if (o.op == Op::MsgRate && o.transport != "ibgda") o.transport = "proxy";
  if (o.transport == "ibgda" && o.op != Op::MsgRate && o.op != Op::SendRecv && o.op != Op::SignalLat)
    usageError(
        "--transport ibgda measures msg-rate (the post rate into a sink NIC), sendrecv and signal-lat (through the "
        "soft NIC, or the GPU NIC with GIN_IBGDA_DEVICE=gpu-soft) only: no ConnectX device was available to "
        "measure put-bw, barrier, allreduce or moe over a real NIC");
  if ((o.qpDepth || o.deferDoorbell) && o.transport != "ibgda")
    usageError("--qp-depth and --defer-doorbell apply to --transport ibgda");
  if (o.postBatch && (o.transport != "ibgda" || o.op != Op::MsgRate))
    usageError("--post-batch applies to msg-rate --transport ibgda");
  if (o.sizesGiven && o.op != Op::PutBw && o.op != Op::AllReduce && o.op != Op::SendRecv)
    usageError("--sizes applies to put-bw, allreduce and sendrecv");
  if (o.channels && o.op != Op::SendRecv && o.op != Op::Moe) usageError("--channels applies to sendrecv and moe");
  if (o.channelBytes && o.op != Op::SendRecv) usageError("--channel-bytes applies to sendrecv");
  if (o.llBytes >= 0 && o.op != Op::SendRecv) usageError("--ll-bytes applies to sendrecv");
  if ((o.modeGiven || o.tokensGiven || o.hidden || o.batch != 1 || o.slots) && o.op != Op::Moe)
    usageError("--mode, --tokens, --hidden, --batch and --slots apply to moe");
  if (o.op == Op::AllReduce && o.sizesGiven && o.minSize < 4)
    usageError("allreduce sizes are bytes of floats: MIN must be at least 4");
  if (o.op == Op::SignalLat && o.iters == 1) usageError("signal-lat needs --iters of at least 2");
  return o;
}

// ---------------------------------------------------------------------------
// Driver.

int visibleGpus() {
#if defined(__CUDACC__)
  return gin::cudaDeviceCountOrZero();
#else
  return 0;
#endif
}

// --transport into the Comm's config. ibgda: the soft NIC as a sink unless
// GIN_IBGDA_DEVICE names another NIC.
void setTransport(const Options& o, gin::CommConfig* cfg) {
  if (o.contexts) cfg->nContexts = o.contexts;
  if (o.transport == "ibgda") {
    cfg->transport = gin::TransportChoice::Ibgda;
    // msg-rate measures posting only (sink); sendrecv and signal-lat move data (the full soft NIC).
    const auto soft = o.op == Op::MsgRate ? gin::IbgdaConfig::Device::SoftSink : gin::IbgdaConfig::Device::Soft;
    cfg->ibgda.device = gin::env::choice("GIN_IBGDA_DEVICE") ? gin::IbgdaConfig::Device::Auto : soft;
    if (o.qpDepth) cfg->ibgda.qpDepth = uint32_t(o.qpDepth);
    cfg->ibgda.deferDoorbell = o.deferDoorbell;
  } else {
    cfg->transport = o.transport == "proxy" ? gin::TransportChoice::Proxy : gin::TransportChoice::Lsa;
  }
}

// sendrecv's FIFOs and moe's layer take more signal ids than the default
// may hold (2 x channels x ranks; gin::ep::signalsNeeded).
void sizeSignals(const Options& o, int ranks, bool gpu, gin::CommConfig* cfg) {
  uint64_t need = 0;
  if (o.op == Op::SendRecv) {
    gin::p2p::Config pc;
    pc.nChannels = uint32_t(srMaxChannels(o, gpu));
    need = gin::p2p::signalsNeeded(pc, ranks);
  } else if (o.op == Op::Moe) {
    for (const bool ll : moeModes(o))
      need = std::max<uint64_t>(need, gin::ep::signalsNeeded(moeShape(o, ranks, gpu, ll)));
  }
  cfg->nSignals = int(std::max<uint64_t>(uint64_t(cfg->nSignals), need + 8));
}

Setup decide(const Options& o) {
  Setup s;
  const bool needsTwo = o.op == Op::PutBw || o.op == Op::SignalLat;
  // Over the proxy the GPUs never address each other, so ranks may share one.
  const bool mayShare = o.transport != "lsa" && o.op != Op::PutBw;
  const int gpus = o.emulate ? 0 : visibleGpus();
  if (!o.emulate && gpus == 0) {
#if defined(__CUDACC__)
    s.whyEmulated = "no CUDA device is visible: running CPU emulation instead (same as --emulate)";
#else
    s.whyEmulated = "this gin-bench was built without nvcc: running CPU emulation (same as --emulate)";
#endif
  }
  if (gpus > 0) {
    s.gpu = true;
    s.ranks = o.ranks ? o.ranks : (o.op == Op::MsgRate ? 1 : gpus);
    if (needsTwo && mayShare && s.ranks < 2 && !o.ranks) s.ranks = 2;
    s.gpus = gpus;
    if (s.ranks > gpus && !mayShare) {
      std::fprintf(stderr, "gin-bench: --ranks %d, but only %d GPU%s visible; one rank per GPU\n", s.ranks, gpus,
                   gpus == 1 ? " is" : "s are");
      std::exit(2);
    }
    if (needsTwo && s.ranks < 2) {
      std::fprintf(
          stderr,
          "gin-bench: %s needs 2 ranks on 2 GPUs (rank 0 on one GPU talks to rank 1 on another), but %s. Run it on a "
          "machine with at least 2 GPUs, or use --emulate for CPU ranks.\n",
          o.opName.c_str(),
          o.ranks ? ("--ranks is " + std::to_string(o.ranks)).c_str()
                  : (std::to_string(gpus) + " GPU is visible").c_str());
      std::exit(2);
    }
  } else {
    s.gpu = false;
    s.ranks = o.ranks ? o.ranks : (o.op == Op::MsgRate ? 1 : 2);
    if (needsTwo && s.ranks < 2) {
      std::fprintf(stderr, "gin-bench: %s needs at least 2 ranks (rank 0 talks to rank 1); --ranks is %d\n",
                   o.opName.c_str(), s.ranks);
      std::exit(2);
    }
  }
  return s;
}

std::unique_ptr<Engine> makeEngine(gin::Comm& comm, const Setup& s) {
#if defined(__CUDACC__)
  if (s.gpu) return std::make_unique<GpuEngine>(comm);
#endif
  (void)s;
  return std::make_unique<CpuEngine>(comm);
}

void runOp(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* mine,
           const std::vector<std::string>& where) {
  switch (o.op) {
    case Op::PutBw: runPutBw(comm, e, o, s, mine, where); break;
    case Op::SignalLat: runSignalLat(comm, e, o, s, mine, where); break;
    case Op::Barrier: runBarrier(comm, e, o, s, mine, where); break;
    case Op::MsgRate: runMsgRate(comm, e, o, s, mine, where); break;
    case Op::AllReduce: runAllReduce(comm, e, o, s, mine, where); break;
    case Op::SendRecv: runSendRecv(comm, e, o, s, mine, where); break;
    case Op::Moe: runMoe(comm, e, o, s, mine, where); break;
  }
}

// One thread per rank, each with its own Comm (and, on GPUs, its own device).
// Failures are collected; a verification failure is raised on every rank at
// the same point, so all threads end.
int run(const Options& o, const Setup& s, Report& rep) {
  gin::InProcessGroup group(s.ranks);
  std::vector<std::string> errors(size_t(s.ranks)), where(size_t(s.ranks));
  std::vector<bool> verifyFailed(size_t(s.ranks), false);
  std::vector<std::thread> threads;
  for (int r = 0; r < s.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        gin::CommConfig cfg;
        cfg.device = s.gpu ? gin::DeviceKind::Gpu : gin::DeviceKind::Cpu;
        if (s.gpu) cfg.cudaDevice = r % s.gpus;
        setTransport(o, &cfg);
        sizeSignals(o, s.ranks, s.gpu, &cfg);
        gin::Comm comm(group.rank(r), cfg);
        comm.makeCurrent();
        std::unique_ptr<Engine> e = makeEngine(comm, s);
        where[size_t(r)] = e->where();
        comm.bootstrap().barrier();  // every rank's description is in place
        Report* mine = r == 0 ? &rep : nullptr;
        runOp(comm, *e, o, s, mine, where);
        e.reset();
      } catch (const Failure& f) {
        errors[size_t(r)] = f.what();
        verifyFailed[size_t(r)] = true;
      } catch (const std::exception& ex) {
        errors[size_t(r)] = ex.what();
      }
    });
  for (auto& t : threads) t.join();
  std::vector<std::string> shown;
  bool any = false, verify = false;
  for (int r = 0; r < s.ranks; ++r) {
    if (errors[size_t(r)].empty()) continue;
    any = true;
    verify = verify || verifyFailed[size_t(r)];
    if (std::find(shown.begin(), shown.end(), errors[size_t(r)]) != shown.end()) continue;
    shown.push_back(errors[size_t(r)]);
    std::fprintf(stderr, "gin-bench: rank %d: %s\n", r, errors[size_t(r)].c_str());
  }
  if (verify) std::fprintf(stderr, "gin-bench: FAILED: what was to be timed gave wrong results; no numbers reported\n");
  return any ? 1 : 0;
}

// One rank in this process, the others in theirs: started by a launcher
// (torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, Slurm, Open MPI). The
// same ops run; rank 0 prints. Collectives keep the ranks in step, and a
// failure on one rank is reported by it (the others stop at the next
// collective, within the bootstrap's timeout).
int runProcess(const Options& o, Setup s, Report& rep) {
  std::unique_ptr<gin::TcpBootstrap> bs = gin::TcpBootstrap::fromEnvironment();
  s.ranks = bs->nRanks();
  const bool needsTwo = o.op == Op::PutBw || o.op == Op::SignalLat;
  if (needsTwo && s.ranks < 2) {
    std::fprintf(stderr, "gin-bench: %s needs at least 2 ranks; WORLD_SIZE is %d\n", o.opName.c_str(), s.ranks);
    return 2;
  }
  gin::CommConfig cfg;
  cfg.device = s.gpu ? gin::DeviceKind::Gpu : gin::DeviceKind::Cpu;
  setTransport(o, &cfg);
  sizeSignals(o, s.ranks, s.gpu, &cfg);
  const int r = bs->rank();
  try {
    gin::Comm comm(*bs, cfg);  // GPU: LOCAL_RANK (modulo the visible GPUs)
    comm.makeCurrent();
    std::unique_ptr<Engine> e = makeEngine(comm, s);
    struct Where {
      char text[192];
    };
    std::vector<Where> all(size_t(s.ranks));
    std::snprintf(all[size_t(r)].text, sizeof all[size_t(r)].text, "%s, pid %d", e->where().c_str(), int(::getpid()));
    comm.bootstrap().allGather(all.data(), sizeof(Where));
    std::vector<std::string> where;
    for (auto& w : all) where.push_back(w.text);
    s.gpus = std::max(s.gpus, 1);
    Report* mine = r == 0 ? &rep : nullptr;
    runOp(comm, *e, o, s, mine, where);
    e.reset();
  } catch (const Failure& f) {
    std::fprintf(stderr, "gin-bench: rank %d: %s\ngin-bench: FAILED: what was to be timed gave wrong results\n", r,
                 f.what());
    return 1;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "gin-bench: rank %d: %s\n", r, ex.what());
    return 1;
  }
  if (r != 0) return 3;  // success, but only rank 0 prints
  rep.head.insert(rep.head.begin() + 1, fmt("  one process per rank (%s launch variables), %d processes",
                                            gin::detectLaunch().source.c_str(), s.ranks));
  return 0;
}

void print(const Report& rep) {
  for (auto& l : rep.head) std::printf("%s\n", l.c_str());
  std::printf("method:\n");
  for (auto& l : rep.method) std::printf("  %s\n", l.c_str());
  std::printf("\n");
  rep.table.print();
  std::printf("\n");
  for (auto& l : rep.notes) std::printf("%s\n", l.c_str());
  std::fflush(stdout);
}

}  // namespace bench

int main(int argc, char** argv) {
  const bench::Options o = bench::parseArgs(argc, argv);
  bool launched = false;
  try {
    launched = gin::detectLaunch().source != "single";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gin-bench: %s\n", e.what());
    return 2;
  }
  bench::Setup s;
  if (launched) {  // one rank here; each process takes its own GPU (LOCAL_RANK)
    s.gpus = o.emulate ? 0 : bench::visibleGpus();
    s.gpu = s.gpus > 0;
    if (!s.gpu && !o.emulate)
      s.whyEmulated = "no CUDA device is visible (or no nvcc build): running CPU ranks instead (same as --emulate)";
  } else {
    s = bench::decide(o);
  }
  bench::Report rep;
  int rc = 1;
  try {
    rc = launched ? bench::runProcess(o, s, rep) : bench::run(o, s, rep);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gin-bench: %s\n", e.what());
    return 1;
  }
  if (rc == 3) return 0;  // a rank other than 0 of a launched job
  if (rc != 0) return rc;
  bench::print(rep);
  if (!o.json.empty()) {
    std::string text;
    rep.json.write(text, 0);
    text += "\n";
    std::ofstream f(o.json);
    f << text;
    f.close();
    if (!f) {
      std::fprintf(stderr, "gin-bench: cannot write %s\n", o.json.c_str());
      return 1;
    }
    std::printf("results written to %s\n", o.json.c_str());
  }
  return 0;
}
