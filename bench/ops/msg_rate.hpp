// bench/ops/msg_rate.hpp — gin-bench msg-rate: descriptors per second into the proxy and, over
// ibgda, the WQE post rate.
#pragma once

#include "../common.hpp"
#include "../engine.hpp"

namespace bench {

using gin::Window;

// One shape's rates (msg-rate over the proxy and over ibgda).
struct RateRes {
  std::string name;
  int producers;
  uint64_t each;
  std::vector<double> rates;
};

// A table row per shape (median, min, max in millions per second) and the
// JSON rows, the median under `key`.
J rateRows(Report* rep, const std::vector<RateRes>& res, const char* key) {
  J rows = J::arr();
  for (const RateRes& r : res) {
    const double m = median(r.rates);
    rep->table.rows.push_back({r.name, fmt("%" PRIu64, r.each), fmt("%.2f", m),
                               fmt("%.2f", *std::min_element(r.rates.begin(), r.rates.end())),
                               fmt("%.2f", *std::max_element(r.rates.begin(), r.rates.end()))});
    rows.push(
        J::obj().set("producers", r.name).set("count", double(r.producers)).set("each", double(r.each)).set(key, m));
  }
  return rows;
}

void runPostRate(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                 const std::vector<std::string>& where);

void runMsgRate(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                const std::vector<std::string>& where) {
  if (o.transport == "ibgda") return runPostRate(comm, e, o, s, rep, where);
  const int me = comm.rank(), n = comm.nRanks(), peer = 1 % n;
  const bool gpu = e.gpu();
  if (!gin::test::CommAccess::proxyEngine(comm))
    throw gin::Error("msg-rate measures the proxy transport, which this communicator lacks");
  const int sms = bcast(comm, e.maxCtas(), 0);
  struct ShapeRow {
    std::string name;
    int ctas, threads;
  };
  std::vector<ShapeRow> shapes = {{"1 warp", 1, 32}};
  if (gpu) {
    shapes.push_back({"1 CTA (32 warps)", 1, 1024});
    shapes.push_back({fmt("1 warp per SM (%d warps)", sms), sms, 32});
    shapes.push_back({fmt("every warp (%d x 32 warps)", sms), sms, 1024});
  }
  const uint64_t perShape = o.iters ? uint64_t(o.iters) : (gpu ? (4ull << 20) : (200ull << 10));
  const int latIters = gpu ? 10000 : 2000;
  uint64_t pushed = 0;  // descriptors rank 0 pushed so far = the peer's signal
  std::vector<RateRes> res;
  // The peer waits for the count, then reads it (more would be a descriptor
  // run twice): a flush says the engine consumed the descriptors, not that
  // their signals reached the peer (over a network wire they may still travel).
  const auto verify = [&](const char* what) {
    const bool arrived = bcast(comm, me == peer ? uint64_t(e.waitSignal(kSigMsg, pushed)) : uint64_t(1), peer) != 0;
    const uint64_t g = bcast(comm, me == peer ? e.readSignal(kSigMsg) : uint64_t(0), peer);
    if (!arrived || g != pushed)
      throw Failure(fmt(
          "msg-rate verification failed after %s: rank %d's signal is %" PRIu64 ", expected %" PRIu64 "%s", what, peer,
          g, pushed, arrived ? "" : " (waitSignal gave up after the communicator's timeout, GIN_TIMEOUT_MS)"));
  };
  for (const ShapeRow& sh : shapes) {
    const int producers = sh.ctas * (sh.threads / 32);
    const int each = int(std::max<uint64_t>(16, perShape / uint64_t(producers)));
    RateRes r{sh.name, producers, uint64_t(each), {}};
    for (int run = -1; run < kLatRuns; ++run) {
      comm.bootstrap().barrier();
      if (me == 0) {
        const double t = e.msgRate(sh.ctas, sh.threads, peer, run < 0 ? std::min(each, 64) : each);
        if (run >= 0) r.rates.push_back(double(producers) * each / t / 1e6);
      }
      pushed += uint64_t(producers) * uint64_t(run < 0 ? std::min(each, 64) : each);
    }
    verify(sh.name.c_str());
    res.push_back(std::move(r));
  }
  std::vector<double> lat, pushLat, echo;
  for (int run = -1; run < kLatRuns; ++run) {
    comm.bootstrap().barrier();
    if (me == 0) {
      double push = 0;
      const double ns = e.msgLatencyNs(peer, latIters, &push);
      const double raw = e.rawEchoNs(latIters);
      if (run >= 0) {
        lat.push_back(ns / 1e3);
        pushLat.push_back(push / 1e3);
        echo.push_back(raw / 1e3);
      }
    }
    pushed += uint64_t(latIters);
  }
  verify("the latency runs");
  comm.bootstrap().barrier();
  if (me != 0) return;

  rep->head = headLines(o, s, where);
  const gin::ProxyConfig pc = comm.config().proxy;
  rep->method = {
      fmt("producers: lane 0 of every warp of the launch (CPU: one thread runs the warps in turn) pushes EACH "
          "SignalAdd(+1) descriptors to rank %d on context (warp index %% %d), alreadyReleased, then flush()es",
          peer, comm.devComm().nContexts),
      fmt("rings: %d contexts x %u slots in %s; one engine thread (spin %u polls, then yield, then sleep %u us)",
          comm.devComm().nContexts, pc.ringSlots, gpu ? "mapped pinned host memory" : "host memory", pc.spinPolls,
          pc.sleepUs),
      fmt("rate = producers x EACH / time, time = %s around the launch, which ends when every flush saw its "
          "descriptors consumed (so it is the rate the engine sustains)",
          timerName(gpu).c_str()),
      fmt("warm-up: one launch of up to 64 descriptors per producer; then %d timed runs: median, min, max", kLatRuns),
      fmt("latency: one thread, %d times: push one descriptor, flush; mean of (flush return - push start) "
          "(%s); %d runs, median",
          latIters, gpu ? "%globaltimer" : "steady_clock", kLatRuns),
      "verified: after each shape, the target's signal equals every descriptor pushed so far (none lost, none run "
      "twice)",
      fmt("raw echo (the floor, no gin code): the producer stores i into a word %s (system-scope release), a host "
          "thread spinning on it stores i into a second word, the producer polls that (system-scope acquire); "
          "mean of %d round trips",
          gpu ? "in mapped pinned host memory" : "in host memory", latIters),
  };
  rep->table.header = {"producers", "descriptors each", "median M desc/s", "min", "max"};
  J rows = rateRows(rep, res, "mdesc_per_s_median");
  const auto latRow = [&](const std::string& name, const std::vector<double>& v) {
    rep->table.rows.push_back({name, "1", fmt("%.3f", median(v)), fmt("%.3f", *std::min_element(v.begin(), v.end())),
                               fmt("%.3f", *std::max_element(v.begin(), v.end()))});
  };
  latRow("post-to-consume latency, us", lat);
  latRow("  of which the push, us", pushLat);
  latRow("raw echo through host memory, us", echo);
  rep->notes.push_back(fmt("post-to-consume / raw echo = %.2f", median(lat) / median(echo)));
  commonJson(*rep, o, s, where);
  rep->json.set("rates", std::move(rows));
  rep->json.set("latency_us_median", median(lat));
  rep->json.set("push_us_median", median(pushLat));
  rep->json.set("raw_echo_us_median", median(echo));
}

// ---- msg-rate over ibgda: the WQE post rate ----

// The WQEs that `signals` one-WQE posts become when groups of `lanes` lanes
// each post `count` through PostBatches of batchSlots() slots (`batch` 0:
// none; already clamped to the queue): every reservation holds `slots` of
// the group's WQEs (the last one what is left) and is slots+1 WQEs, NOPs
// filling the rest.
inline uint64_t batchedWqes(uint64_t signals, int lanes, int count, int batch) {
  if (batch <= 0) return signals;
  const uint64_t slots = batchSlots(batch, lanes, count), perGroup = uint64_t(lanes) * uint64_t(count);
  const uint64_t groups = signals / perGroup;
  return groups * ((perGroup + slots - 1) / slots) * (slots + 1);
}

void runPostRate(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                 const std::vector<std::string>& where) {
  const int me = comm.rank(), n = comm.nRanks(), peer = 1 % n;
  const bool gpu = e.gpu();
  gin::IbgdaTransport* ib = gin::test::CommAccess::ibgda(comm);
  if (!ib) throw gin::Error("msg-rate --transport ibgda: this communicator has no ibgda transport");
  const int sms = bcast(comm, e.maxCtas(), 0);
  struct ShapeRow {
    std::string name;
    int ctas, threads;
  };
  std::vector<ShapeRow> shapes = {{"1 thread", 1, 1}, {"1 warp (32 threads)", 1, 32}};
  if (gpu) {
    shapes.push_back({"1 SM (1 CTA x 256 threads)", 1, 256});
    shapes.push_back({fmt("one warp per SM (%d CTAs x 32 threads)", sms), sms, 32});
    shapes.push_back({fmt("the whole GPU (%d CTAs x 256 threads)", sms), sms, 256});
  }
  // --post-batch clamped as the batch clamps it on these QPs, so the NIC-free
  // queues (deeper) post in the same batches.
  const uint32_t mostSlots = gin::ibgda::batchMostSlots(ib->config().qpDepth);
  const int batch = o.postBatch > 0 ? int(std::min<uint32_t>(uint32_t(o.postBatch), mostSlots)) : 0;
  // The sink consumes a few million WQEs/s: 256 Ki per run keeps the op under a minute.
  const uint64_t perShape = o.iters ? uint64_t(o.iters) : (gpu ? (256ull << 10) : (64ull << 10));
  std::vector<RateRes> res, stores, noNic;
  for (const ShapeRow& sh : shapes) {
    const int producers = sh.ctas * sh.threads;
    const int each = int(std::max<uint64_t>(1, perShape / uint64_t(producers)));
    RateRes r{sh.name, producers, uint64_t(each), {}};
    RateRes st{"  plain 64-byte stores, " + sh.name, producers, uint64_t(each), {}};
    RateRes nn{"  posting alone (no NIC), " + sh.name, producers, uint64_t(each), {}};
    for (int run = -1; run < kLatRuns; ++run) {
      comm.bootstrap().barrier();
      if (me == 0) {
        const int count = run < 0 ? std::min(each, 16) : each;
        const uint64_t before = ib->nicExecuted();
        const double t = e.postRate(sh.ctas, sh.threads, peer, count, batch);
        const uint64_t done = ib->nicExecuted() - before, want = uint64_t(producers) * uint64_t(count);
        // Every flush returned, so the NIC completed every WQE: exactly that many
        // (with the batches' NOPs).
        const uint64_t posted =
            batchedWqes(want, gpu ? std::min(sh.threads, 32) : 1, count, batch);
        if (ib->softNic() && done != posted)
          throw Failure(fmt("msg-rate verification failed (%s): the NIC completed %" PRIu64 " WQEs, %" PRIu64
                            " were posted",
                            sh.name.c_str(), done, posted));
        if (run >= 0) r.rates.push_back(double(want) / t / 1e6);
        const double ts = e.storeRate(sh.ctas, sh.threads, count);  // 0 on CPU ranks: no baseline row
        if (run >= 0 && ts > 0) st.rates.push_back(double(want) / ts / 1e6);
        const double tn = e.postRateNoNic(sh.ctas, sh.threads, peer, count, batch);  // 0 on CPU ranks
        if (run >= 0 && tn > 0) nn.rates.push_back(double(want) / tn / 1e6);
      }
    }
    if (me == 0)
      std::fprintf(stderr, "gin-bench msg-rate (ibgda): %s done: median %.3f M WQE/s\n", sh.name.c_str(),
                   median(r.rates));
    res.push_back(std::move(r));
    if (!st.rates.empty()) stores.push_back(std::move(st));
    if (!nn.rates.empty()) noNic.push_back(std::move(nn));
  }
  comm.bootstrap().barrier();
  if (me != 0) return;
  rep->head = headLines(o, s, where);
  const gin::IbgdaConfig& ic = ib->config();
  rep->method = {
      fmt("producers: every thread of the launch posts EACH SignalAdd(+1) WQEs (mlx5 atomic fetch-add, "
          "alreadyReleased) to rank %d on context (warp index %% %d), then flush()es (polls its CQ up to its "
          "last WQE)",
          peer, comm.devComm().nContexts),
      batch > 0 ? fmt("posted through a PostBatch per warp of %d slots (--post-batch %d, at most half the queue), or "
                      "as many as the warp posts if fewer (gin/device/batch.hpp): one reservation, fence and doorbell "
                      "per slots+1 WQEs; the slots the calls leave become NOPs, which the rates do not count (WQEs = "
                      "the signals)",
                      batch, o.postBatch)
                : std::string("posted one call at a time (Net::signal; a warp's converged lanes share one "
                              "reservation per call)"),
      fmt("queues: %d contexts x %d peers QPs of %u WQEs in %s; doorbell %s; NIC: %s", comm.devComm().nContexts, n,
          ic.qpDepth,
          ib->gpuNic() ? "the place the NIC's name says" : gpu ? "mapped pinned host memory" : "host memory",
          ic.deferDoorbell ? "deferred to flush" : "rung per post", ib->nicName().c_str()),
      "the sink NIC only completes: it reads each WQE's control segment and writes a CQE where the WQE asks for "
      "one (the last of each post: one per warp when the warp's lanes post together), nothing else, so the "
      "rate is gin's own posting cost (slot reservation, WQE build, in-order publication, doorbell record and "
      "UAR write, CQ polling) plus the sink's consumption",
      fmt("rate = WQEs / (%s around the launch); warm-up launch of up to 16 WQEs per producer; %d timed runs: "
          "median, min, max",
          timerName(gpu).c_str(), kLatRuns),
      ib->softNic() ? "verified: after each launch the NIC completed exactly the WQEs posted (none lost, none run "
                      "twice)"
                    : "verified: every flush returned (a real NIC does not report a count to check)",
  };
  rep->table.header = {"producers", "WQEs each", "median M WQE/s", "min", "max"};
  J rows = rateRows(rep, res, "mwqe_per_s_median");
  J alone = rateRows(rep, noNic, "mwqe_per_s_median");
  J base = rateRows(rep, stores, "mstores_per_s_median");
  for (size_t i = 0; i < stores.size() && i < res.size() && i < noNic.size(); ++i)
    rep->notes.push_back(fmt("%s: plain stores / posts = %.1fx; plain stores / posting alone = %.1fx",
                             res[i].name.c_str(), median(stores[i].rates) / median(res[i].rates),
                             median(stores[i].rates) / median(noNic[i].rates)));
  if (!noNic.empty())
    rep->method.push_back(
        "posting alone rows (GPU): the same kernel on copies of the QPs in fresh GPU memory (queues of 2^15 WQEs, "
        "their own doorbell records, UAR word and state) that no NIC reads, every completion granted in advance: "
        "no post waits for room or for a NIC, so the row is the posting path's own cost (reservation, WQE build, "
        "in-order publication, doorbell writes and their fences)");
  if (!stores.empty())
    rep->method.push_back(
        "baseline rows (GPU): the same threads store as many 64-byte records with plain stores into a ring of "
        "2^14 slots in device memory (no reservation, publication, doorbell or completion): what posting would "
        "cost if writing the WQEs were all of it");
  commonJson(*rep, o, s, where);
  rep->json.set("rates", std::move(rows));
  rep->json.set("plain_store_rates", std::move(base));
  rep->json.set("posting_alone_rates", std::move(alone));
}

}  // namespace bench
