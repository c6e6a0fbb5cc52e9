// bench/ops/barrier.hpp — gin-bench barrier: barrier latency of gin and, on GPUs, of NCCL.
#pragma once

#include "../common.hpp"
#include "../engine.hpp"
#include "../nccl.hpp"

namespace bench {

using gin::Window;

void runBarrier(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                const std::vector<std::string>& where) {
  const int me = comm.rank(), n = comm.nRanks();
  const bool gpu = e.gpu();
  const int K = o.iters ? int(o.iters) : (gpu ? 10000 : 1000);
  const int checkIters = std::min(K, gpu ? 1000 : 200);
  const int warm = std::min(K, gpu ? 1000 : 100);
  const int nB = comm.config().nBarriers;
  std::vector<int> ctaCounts;
  for (int c : kBarrierCtas)
    if (c <= nB) ctaCounts.push_back(c);
  Window w = comm.allocWindow(2 * size_t(kBarrierCtas[2]) * size_t(n) * sizeof(uint64_t));
  uint64_t checkBase = 0;  // values differ between checks, so a stale slot never passes

  // NCCL's device barrier runs over any gin transport: only the GPU and the build matter.
  std::string ncclReason = ncclSkipReason(o, gpu, /*anyTransport=*/true);
#if GIN_BENCH_NCCL
  NcclSide nccl;
  const bool withNccl = nccl.start(comm, ncclReason, kBarrierCtas[2]);
#else
  const bool withNccl = false;
#endif

  struct Result {
    int ctas;
    double ginUs, ncclUs;
    std::vector<double> ginRuns, ncclRuns;
  };
  std::vector<Result> results;

  // Every rank times its own run, from its own start to the common end: the
  // rank that started last has no start skew in its time, so a run counts
  // the smallest time over the ranks. Reported: median over runs.
  auto timeRuns = [&](const std::function<double(int)>& once) {
    comm.bootstrap().barrier();
    once(warm);
    std::vector<double> runs;
    for (int r = 0; r < kBarRuns; ++r) {
      comm.bootstrap().barrier();
      const double t = once(K);
      const auto all = allGather(comm, t);
      runs.push_back(*std::min_element(all.begin(), all.end()) / K * 1e6);
    }
    return runs;
  };
  auto verify = [&](const char* which, int ctas, const std::function<uint64_t(uint64_t)>& check) {
    checkBase += 1ull << 32;
    comm.bootstrap().barrier();
    const uint64_t bad = check(checkBase);
    const auto all = allGather(comm, bad);
    for (int r = 0; r < n; ++r)
      if (all[size_t(r)])
        throw Failure(fmt("barrier verification failed: %s barrier, %d CTAs: rank %d saw %" PRIu64
                          " stale or missing peer writes after a sync",
                          which, ctas, r, all[size_t(r)]));
  };

  for (int ctas : ctaCounts) {
    Result res{ctas, 0, 0, {}, {}};
    verify("gin", ctas, [&](uint64_t b) { return e.barrierCheck(w, ctas, checkIters, b); });
    res.ginRuns = timeRuns([&](int it) { return e.barrierTime(ctas, it); });
    res.ginUs = median(res.ginRuns);
#if GIN_BENCH_NCCL
    if (withNccl) {
      auto& ge = static_cast<GpuEngine&>(e);
      verify("nccl", ctas, [&](uint64_t b) { return ge.ncclBarrierCheck(nccl.dev, w, ctas, checkIters, b); });
      res.ncclRuns = timeRuns([&](int it) { return ge.ncclBarrierTime(nccl.dev, ctas, it); });
      res.ncclUs = median(res.ncclRuns);
    }
#endif
    results.push_back(std::move(res));
  }
  comm.bootstrap().barrier();
#if GIN_BENCH_NCCL
  nccl.close();
#endif
  comm.deregisterWindow(w);
  if (me != 0) return;

  rep->head = headLines(o, s, where);
  rep->method = {
      "every rank opens gin::LsaBarrierSession<CoopBlock>(CoopBlock{}, devComm, blockIdx.x) in each CTA (its own",
      "  barrier index) and calls sync(CoopBlock{}) ITERS times (default memory order: acq_rel)",
      gpu ? fmt("launch: 1, 32 and 132 CTAs x %d threads, one kernel per rank, all ranks started after a host "
                "barrier",
                kBarrierThreads)
          : "launch: 1, 32 and 132 'CTAs' (barrier indices), one call per rank thread, all ranks started after a "
            "host barrier",
      fmt("ITERS = %d; warm-up: one run of %d syncs; then %d timed runs", K, warm, kBarRuns),
      fmt("timer: %s around each rank's run; per run the smallest time over the ranks", timerName(gpu).c_str()),
      "  (the rank that started last, whose time has no start skew) / ITERS; reported: median of runs",
      fmt("verified first (%d syncs per CTA): before each sync every rank writes the iteration's value into its slot "
          "at",
          checkIters),
      "  every peer (Net::putValue); after the sync every peer's value must be there (slots alternate by parity)",
  };
  if (withNccl)
    rep->method.push_back(
        "nccl: the same kernels with ncclLsaBarrierSession<ncclCoopCta>(ncclCoopCta(), devComm, ncclTeamTagLsa(), "
        "blockIdx.x).sync(coop, acq_rel), verified the same way (writes to peers' gin window, NCCL barrier between)");
  if (!gpu)
    rep->method.push_back(
        "CPU emulation: each rank is one thread; per iteration it syncs barrier indices 0..CTAS-1 one after another, "
        "so 'per iteration' covers CTAS syncs");
  if (gpu) {
    rep->table.header = {"CTAs", "gin us/sync", "gin min", "gin max", "nccl us/sync", "gin/nccl"};
  } else {
    rep->table.header = {"CTAs", "us/iteration", "min", "max", "us per barrier index"};
  }
  J rows = J::arr();
  for (auto& r : results) {
    const double mn = *std::min_element(r.ginRuns.begin(), r.ginRuns.end());
    const double mx = *std::max_element(r.ginRuns.begin(), r.ginRuns.end());
    if (gpu)
      rep->table.rows.push_back({std::to_string(r.ctas), fmt("%.3f", r.ginUs), fmt("%.3f", mn), fmt("%.3f", mx),
                                 withNccl ? fmt("%.3f", r.ncclUs) : std::string("-"),
                                 withNccl && r.ncclUs > 0 ? fmt("%.2f", r.ginUs / r.ncclUs) : std::string("-")});
    else
      rep->table.rows.push_back({std::to_string(r.ctas), fmt("%.3f", r.ginUs), fmt("%.3f", mn), fmt("%.3f", mx),
                                 fmt("%.3f", r.ginUs / r.ctas)});
    J row = J::obj();
    row.set("ctas", double(r.ctas)).set("threads_per_cta", double(kBarrierThreads));
    J gr = J::arr();
    for (double x : r.ginRuns) gr.push(J::num(x));
    row.set(gpu ? "gin_us_per_sync" : "gin_us_per_iteration", r.ginUs).set("gin_runs_us", std::move(gr));
    if (withNccl) {
      J nr = J::arr();
      for (double x : r.ncclRuns) nr.push(J::num(x));
      row.set("nccl_us_per_sync", r.ncclUs).set("nccl_runs_us", std::move(nr));
    }
    rows.push(std::move(row));
  }
  rep->notes.push_back(withNccl ? "nccl: measured (ncclLsaBarrierSession, same launch shapes)"
                                : "nccl: not measured (" + ncclReason + ")");
  commonJson(*rep, o, s, where);
  rep->json.set("method",
                J::obj()
                    .set("operation", "LsaBarrierSession<CoopBlock>::sync, one barrier index per CTA")
                    .set("threads_per_cta", double(kBarrierThreads))
                    .set("iters", double(K))
                    .set("warmup_iters", double(warm))
                    .set("runs", double(kBarRuns))
                    .set("statistic", "median over runs of the smallest per-rank time (the last rank to start)")
                    .set("timer", timerName(gpu)));
  rep->json.set("verified", J::boolean(true));
  rep->json.set("results", std::move(rows));
  rep->json.set("nccl", withNccl ? J::obj().set("measured", J::boolean(true))
                                 : J::obj().set("measured", J::boolean(false)).set("reason", ncclReason));
}

}  // namespace bench
