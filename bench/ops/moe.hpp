// bench/ops/moe.hpp — gin-bench moe: gin::ep dispatch and combine, next to an NCCL send/recv
// all-to-all of the same bytes per peer on GPUs.
#pragma once

#include "../common.hpp"
#include "../engine.hpp"
#include "../nccl.hpp"

namespace bench {

using gin::Window;

// The layer the op runs: E = 8 experts per rank, top-8 (top-E when E < 8),
// hidden 7168 bf16 (1024 emulated); normal mode 4096 tokens per rank (256
// emulated) over up to 64 channels with rings of 32 slots (2 and 4
// emulated), low latency 128 (32 emulated). Normal-mode dispatch time falls
// with the channels and with slots up to 16 (one H100, 1 rank, 2026-11-25:
// 263 / 194 / 191 us with 32 channels and 8 / 16 / 32 slots, 166 / 139 / 143
// with 64; --batch made no difference there). The dispatch kernel's C + R x C
// CTAs must all be resident (GpuLayer checks; two fit per SM), and they spin:
// C x (1 + R) stays within one per SM (132 on an H100/H200), and within half
// that over the proxy or ibgda, whose ranks may share a GPU.
gin::ep::Shape moeShape(const Options& o, int ranks, bool gpu, bool ll) {
  gin::ep::Shape sh;
  sh.ranks = ranks;
  sh.experts = kMoeExpertsPerRank * ranks;
  sh.topk = std::min(kMoeTopk, sh.experts);
  sh.hidden = o.hidden ? o.hidden : gpu ? 7168 : 1024;
  sh.tokens = o.tokensGiven ? o.tokens : ll ? (gpu ? 128 : 32) : (gpu ? 4096 : 256);
  const int ctas = o.transport == "lsa" ? 132 : 66;
  sh.channels = o.channels ? o.channels : gpu ? std::min(64, std::max(1, ctas / (1 + ranks))) : 2;
  sh.slots = o.slots ? o.slots : gpu ? 32 : 4;
  sh.batch = o.batch;
  return sh;
}

std::vector<bool> moeModes(const Options& o) {  // low latency?
  if (o.mode == "normal") return {false};
  if (o.mode == "ll") return {true};
  return {false, true};
}

int moeIters(const Options& o, bool gpu) { return o.iters ? int(o.iters) : gpu ? 20 : 3; }

void runMoe(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
            const std::vector<std::string>& where) {
  const int me = comm.rank(), n = comm.nRanks();
  const bool gpu = e.gpu();
  const int K = moeIters(o, gpu);

  std::string ncclReason = ncclSkipReason(o, gpu);
#if GIN_BENCH_NCCL
  NcclSide nccl;
  const bool withNccl = nccl.start(comm, ncclReason, 0);
#else
  const bool withNccl = false;
#endif

  struct Row {
    bool ll;
    const char* phase;
    gin::ep::Shape sh;
    double crossBytes, allBytes;    // per rank (mean over ranks): to other ranks; including itself
    std::vector<double> gin, nccl;  // seconds, per timed layer (smallest over the ranks)
    std::vector<double> ginMax;     // seconds, per timed layer (largest over the ranks)
  };
  std::vector<Row> rows;
  uint64_t seed = 100;
  for (const bool ll : moeModes(o)) {
    const gin::ep::Shape sh = moeShape(o, n, gpu, ll);
    const char* mode = ll ? "low-latency" : "normal";
    std::unique_ptr<MoeRunner> layer = e.moeLayer(sh, ll);
    // Verified first, twice (the second layer reuses the reset signals); the
    // timed layers rerun the second one's inputs.
    gin::ep::Inputs in;
    for (int k = 0; k < 2; ++k) {
      in = gin::ep::makeInputs(sh, me, ++seed);
      const std::vector<float> out = layer->run(in);
      size_t first = 0;
      const size_t bad = gin::ep::mismatches(out, gin::ep::reference(sh, in), &first);
      agreeBad(comm, fmt("moe verification failed: %s mode, %d tokens, against the host reference", mode, sh.tokens),
               bad);
    }
    // Who sends how many units to whom: U[r][d].
    const std::vector<uint64_t> mine = gin::ep::dispatchUnits(sh, in, ll);
    std::vector<uint64_t> U(size_t(n) * size_t(n));
    std::copy(mine.begin(), mine.end(), U.begin() + ptrdiff_t(size_t(me) * size_t(n)));
    comm.bootstrap().allGather(U.data(), size_t(n) * sizeof(uint64_t));
    auto units = [&](int r, int d) { return U[size_t(r) * size_t(n) + size_t(d)]; };
    const size_t du = gin::ep::dispatchUnitBytes(sh, ll), cu = gin::ep::combineUnitBytes(sh);
    double cross = 0, all = 0;
    for (int r = 0; r < n; ++r)
      for (int d = 0; d < n; ++d) {
        all += double(units(r, d));
        cross += r == d ? 0.0 : double(units(r, d));
      }

    Row rd{ll, "dispatch", sh, cross * double(du) / n, all * double(du) / n, {}, {}, {}};
    Row rc{ll, "combine", sh, cross * double(cu) / n, all * double(cu) / n, {}, {}, {}};
    (void)layer->timed();  // warm-up
    for (int k = 0; k < K; ++k) {
      const MoeTimes t = layer->timed();
      const auto ts = allGather(comm, t);
      double dMin = 1e30, dMax = 0, cMin = 1e30, cMax = 0;
      for (const MoeTimes& x : ts) {
        dMin = std::min(dMin, x.dispatchS), dMax = std::max(dMax, x.dispatchS);
        cMin = std::min(cMin, x.combineS), cMax = std::max(cMax, x.combineS);
      }
      rd.gin.push_back(dMin), rd.ginMax.push_back(dMax);
      rc.gin.push_back(cMin), rc.ginMax.push_back(cMax);
    }
    layer.reset();

#if GIN_BENCH_NCCL
    if (withNccl) {
      // The same bytes per peer as one group of ncclSend/ncclRecv (this rank
      // included): dispatch sends U[me][d] units to d and receives U[s][me]
      // from s; combine returns as many rows the other way.
      auto& ge = static_cast<GpuEngine&>(e);
      for (Row* row : {&rd, &rc}) {
        const bool isDispatch = row == &rd;
        const size_t ub = isDispatch ? du : cu;
        const size_t N = size_t(n);
        std::vector<size_t> sends(N, 0), recvs(N, 0), sOff(N, 0), rOff(N, 0);
        size_t sTot = 0, rTot = 0;
        for (int p = 0; p < n; ++p) {
          sends[size_t(p)] = size_t(isDispatch ? units(me, p) : units(p, me)) * ub;
          recvs[size_t(p)] = size_t(isDispatch ? units(p, me) : units(me, p)) * ub;
          sOff[size_t(p)] = sTot, rOff[size_t(p)] = rTot;
          sTot += sends[size_t(p)], rTot += recvs[size_t(p)];
        }
        uint8_t *sb = nullptr, *rb = nullptr;
        BENCH_CUDA(cudaMalloc(&sb, std::max<size_t>(sTot, 16)));
        BENCH_CUDA(cudaMalloc(&rb, std::max<size_t>(rTot, 16)));
        ++seed;
        for (int p = 0; p < n; ++p) ge.fillBytes(sb + sOff[size_t(p)], sends[size_t(p)], srSeed(seed, me * n + p));
        ge.poisonBytes(rb, std::max<size_t>(rTot, 16));
        comm.bootstrap().barrier();
        (void)ge.ncclExchange(nccl.comm, sb, sOff, sends, rb, rOff, recvs, 1);
        uint64_t bad = 0;
        for (int p = 0; p < n; ++p)
          bad += ge.checkBytes(rb + rOff[size_t(p)], recvs[size_t(p)], srSeed(seed, p * n + me));
        agreeBad(comm, fmt("moe verification failed: NCCL all-to-all (%s mode %s bytes)", mode, row->phase), bad);
        comm.bootstrap().barrier();
        (void)ge.ncclExchange(nccl.comm, sb, sOff, sends, rb, rOff, recvs, 1);  // warm-up
        for (int k = 0; k < K; ++k) {
          comm.bootstrap().barrier();
          const double t = ge.ncclExchange(nccl.comm, sb, sOff, sends, rb, rOff, recvs, 1);
          const auto ts = allGather(comm, t);
          row->nccl.push_back(*std::min_element(ts.begin(), ts.end()));
        }
        cudaFree(sb);
        cudaFree(rb);
      }
    }
#endif
    rows.push_back(std::move(rd));
    rows.push_back(std::move(rc));
  }
  comm.bootstrap().barrier();
#if GIN_BENCH_NCCL
  nccl.close();
#endif
  if (me != 0) return;

  const gin::ep::Shape s0 = rows.front().sh;
  rep->head = headLines(o, s, where);
  rep->method = {
      fmt("gin: gin::ep (DeepEP-style) layer, %d experts (%d per rank), top-%d, hidden %d bf16, expert = x * (1 + "
          "e/64)",
          s0.experts, s0.localExperts(), s0.topk, s0.hidden),
      fmt("  normal mode: counts, then %d channels stream tokens through per-(source, channel) rings of %d slots "
          "(tails and heads advanced every %d slot(s)); combine",
          s0.channels, s0.slots, s0.batch),
      fmt("  puts float partials back, the source sums; low latency: per-expert buffers, one put per (token, "
          "expert) from %d sender(s) per expert,",
          s0.llSenders),
      "  combine returns each (token, k) row, the source reduces with the routing weights",
      gpu ? "  kernels of gin::ep::GpuLayer on the rank's stream; dispatch = from the first kernel until every token "
            "sent "
            "to the rank is here"
          : "  gin::ep::CpuLayer on the rank thread; dispatch = from the layer's start until every token sent to the "
            "rank "
            "is here",
      "  (low latency: plus a wait for every count), combine = from there to the end (experts,",
      "  returns, sums)",
      fmt("timer: %s; each timed layer after a host barrier, %d layers after a warm-up one; per layer the smallest",
          timerName(gpu).c_str(), K),
      "  time over the ranks (the last to start); reported: median over layers",
      "bytes: what crosses ranks per rank (mean over the ranks): dispatch = (token, rank) units x (metadata + token)",
      "  (low latency: (token, expert) units x (16 + token)); combine = as many float rows of hidden x 4 bytes back;",
      "  GB/s = those bytes / time (a rank's own units are moved too, but not counted)",
      "verified first, twice per mode: every output equals the host reference (gin::ep::reference, relative 1e-5)",
  };
  if (withNccl)
    rep->method.push_back(
        "nccl: one ncclGroupStart/End of ncclSend + ncclRecv to and from every rank (itself included) with the "
        "layer's bytes per peer, its own buffers, verified (per-peer patterns), timed the same way");
  if (gpu)
    rep->table.header = {"mode",     "phase",   "tokens",    "MB/rank",      "gin us",
                         "gin GB/s", "nccl us", "nccl GB/s", "gin/nccl time"};
  else
    rep->table.header = {"mode", "phase", "tokens", "MB/rank", "us", "GB/s"};
  J jrows = J::arr();
  for (const Row& r : rows) {
    const double g = median(r.gin), c = withNccl ? median(r.nccl) : 0.0;
    const char* mode = r.ll ? "ll" : "normal";
    if (gpu)
      rep->table.rows.push_back(
          {mode, r.phase, std::to_string(r.sh.tokens), fmt("%.2f", r.crossBytes / 1e6), fmt("%.1f", g * 1e6),
           fmt("%.2f", gbs(r.crossBytes, g)), withNccl ? fmt("%.1f", c * 1e6) : "-",
           withNccl ? fmt("%.2f", gbs(r.crossBytes, c)) : "-", withNccl && c > 0 ? fmt("%.2f", g / c) : "-"});
    else
      rep->table.rows.push_back({mode, r.phase, std::to_string(r.sh.tokens), fmt("%.3f", r.crossBytes / 1e6),
                                 fmt("%.1f", g * 1e6), fmt("%.3f", gbs(r.crossBytes, g))});
    J row = J::obj();
    row.set("mode", mode)
        .set("phase", r.phase)
        .set("tokens", double(r.sh.tokens))
        .set("hidden", double(r.sh.hidden))
        .set("topk", double(r.sh.topk))
        .set("experts", double(r.sh.experts))
        .set("channels", double(r.sh.channels))
        .set("cross_bytes_per_rank", r.crossBytes)
        .set("all_bytes_per_rank", r.allBytes)
        .set("gin_us", g * 1e6)
        .set("gin_gbs", gbs(r.crossBytes, g))
        .set("gin_runs_us", runsJson(r.gin))
        .set("gin_max_rank_us", median(r.ginMax) * 1e6);
    if (withNccl)
      row.set("nccl_us", c * 1e6).set("nccl_gbs", gbs(r.crossBytes, c)).set("nccl_runs_us", runsJson(r.nccl));
    jrows.push(std::move(row));
  }
  if (n == 1)
    rep->notes.push_back("1 rank: nothing crosses ranks (MB/rank and GB/s are 0); the times are the local path");
  rep->notes.push_back(withNccl ? "nccl: measured (an ncclSend/ncclRecv all-to-all with the same bytes per peer)"
                                : "nccl: not measured (" + ncclReason + ")");
  commonJson(*rep, o, s, where);
  rep->json.set("method", J::obj()
                              .set("operation", "gin::ep dispatch and combine")
                              .set("layers", double(K))
                              .set("statistic", "median over layers of the smallest per-rank time")
                              .set("gbs", "bytes crossing ranks per rank (mean) / time")
                              .set("timer", timerName(gpu)));
  rep->json.set("verified", J::boolean(true));
  rep->json.set("results", std::move(jrows));
  rep->json.set("nccl", withNccl ? J::obj().set("measured", J::boolean(true))
                                 : J::obj().set("measured", J::boolean(false)).set("reason", ncclReason));
}

}  // namespace bench
