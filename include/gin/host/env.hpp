// gin/host/env.hpp — gin's configuration by environment variable: the table
// of every GIN_* variable gin reads (name, kind, what is allowed, default,
// meaning), the typed readers every read goes through, and the block
// GIN_DEBUG=1 prints. docs/configuration.md is this table (tests/env.cpp
// fails when they disagree, or when a "GIN_..." string in include/ has no row).
//
// The rules, the same for every variable:
//  - A variable that is set but empty counts as unset (job scripts export
//    VAR= to clear one): the default applies.
//  - Values are exact: no surrounding spaces, no "+", no hex. Numbers are
//    decimal; sizes may end in K, M or G (powers of 1024; also k/m/g, KiB,
//    KB, B). A malformed or out-of-range value is a gin::Error naming the
//    variable, the value and what is allowed:
//      gin: GIN_PROXY_THREADS="0" is not allowed: expected an integer from 1
//      to 4096 (proxy engine threads per communicator ...)
//  - Flags are 0 or 1; choices are one of their listed words.
//  - Reading a GIN_* name that has no row here is a gin::Error (a gin bug):
//    a new variable needs its row, and docs/configuration.md its line.
// Launcher variables that are not gin's (RANK, SLURM_*, OMPI_*, MASTER_*,
// LOCAL_RANK) go through the same readers and parser with the range their
// caller gives; they have no row.
#pragma once

#include "gin/core/error.hpp"

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace gin::env {

enum class Kind { Integer, Size, Flag, Choice, Text, List };

struct Var {
  const char* name;
  Kind kind;
  long long lo, hi;    // Integer, Size: the allowed range
  long long step;      // Integer: a multiple of this
  const char* values;  // Choice: "a,b,c"; Text, List: what is allowed, in words
  const char* def;     // what applies when unset, as text
  const char* meaning;
};

// Longer than any job waits; keeps deadline arithmetic far from overflow.
inline constexpr long long kMaxTimeoutMs = 365ll * 24 * 3600 * 1000;
inline constexpr long long kMaxRanks = 1 << 24;

namespace row {
constexpr Var integer(const char* n, long long lo, long long hi, const char* def, const char* meaning,
                      long long step = 1) {
  return {n, Kind::Integer, lo, hi, step, "", def, meaning};
}
constexpr Var size(const char* n, long long lo, long long hi, const char* def, const char* meaning) {
  return {n, Kind::Size, lo, hi, 1, "", def, meaning};
}
constexpr Var flag(const char* n, const char* def, const char* meaning) {
  return {n, Kind::Flag, 0, 1, 1, "", def, meaning};
}
constexpr Var choice(const char* n, const char* values, const char* def, const char* meaning) {
  return {n, Kind::Choice, 0, 0, 1, values, def, meaning};
}
constexpr Var text(const char* n, const char* allowed, const char* def, const char* meaning) {
  return {n, Kind::Text, 0, 0, 1, allowed, def, meaning};
}
constexpr Var list(const char* n, const char* allowed, const char* def, const char* meaning) {
  return {n, Kind::List, 0, 0, 1, allowed, def, meaning};
}
}  // namespace row

// Every GIN_* variable gin reads. Keep docs/configuration.md in step (the
// env test prints the table it expects).
inline constexpr Var kVars[] = {
    // --- communicator
    row::integer("GIN_TIMEOUT_MS", 0, kMaxTimeoutMs, "30000",
                 "bound of every device-side wait, when CommConfig::timeoutNs is 0; 0: waits never give up"),
    row::choice("GIN_DEVICE", "auto,cpu", "auto",
                "cpu: CPU ranks even where GPUs are visible (when CommConfig::device is Auto)"),
    row::choice("GIN_TRANSPORT", "auto,lsa,proxy,ibgda", "CommConfig::transport (auto)",
                "how peers are reached: overrides CommConfig::transport"),
    row::text("GIN_HOST_ID", "any text; netns", "hostname and boot id",
              "host identity that groups ranks into hosts; netns: the host's identity plus the network namespace"),
    row::flag("GIN_DEBUG", "0", "1: rank 0 prints this configuration and the transport per peer for each Comm"),
    // --- bootstrap and launch
    row::integer("GIN_BOOTSTRAP_TIMEOUT_MS", 1, kMaxTimeoutMs, "BootstrapConfig::timeoutNs (60000)",
                 "bound of the bootstrap's collectives; overrides BootstrapConfig::timeoutNs"),
    row::flag("GIN_BOOTSTRAP_SHM", "1",
              "0: TcpBootstrap's collectives always go over TCP; 1: through shared memory when every rank is on "
              "one host"),
    row::text("GIN_BOOTSTRAP_ADDR", "an IPv4 address or host name", "first non-loopback IPv4 address",
              "address makeUniqueId() advertises"),
    row::integer("GIN_BOOTSTRAP_PORT", 1, 65535, "MASTER_PORT; MASTER_PORT + 1 under torchrun",
                 "port rank 0 of a launched job (detectLaunch) listens on; torchrun's agent holds MASTER_PORT"),
    row::integer("GIN_RANK", 0, kMaxRanks, "none",
                 "this process's rank, for detectLaunch() when no other launcher is found (with GIN_NRANKS)"),
    row::integer("GIN_NRANKS", 1, kMaxRanks, "none", "the number of ranks, with GIN_RANK"),
    row::integer("GIN_LOCAL_RANK", 0, kMaxRanks, "GIN_RANK", "this rank's index on its host, with GIN_RANK"),
    row::integer("GIN_LOCAL_SIZE", 1, kMaxRanks, "GIN_NRANKS", "the number of ranks on this host, with GIN_RANK"),
    // --- proxy transport
    row::choice("GIN_PROXY_WIRE", "auto,local,tcp,verbs", "CommConfig::proxy.wire (auto)",
                "the proxy's wire to each peer: overrides CommConfig::proxy.wire"),
    row::integer("GIN_PROXY_THREADS", 1, 4096, "CommConfig::proxy.threads (1)",
                 "proxy engine threads per communicator (clamped to nContexts); overrides CommConfig::proxy.threads"),
    row::flag("GIN_PROXY_PRODUCER_STORES", "CommConfig::proxy.producerStores (1 on GPU ranks, 0 on CPU ranks)",
              "1: producers store puts to peers mapped in this process and the engine applies only the actions"),
    row::list("GIN_PROXY_CPUS", "a CPU list like 0-7,16; none", "CommConfig::proxy.cpus, else the GPU's local CPUs",
              "CPUs every proxy engine thread may run on; none: not pinned"),
    row::text("GIN_PROXY_TCP_ADDR", "an IPv4 address or host name", "the bootstrap's address",
              "address this rank's tcp wire and abort channel advertise to peers"),
    row::text("GIN_IB_DEVICE", "name or name:port", "CommConfig's device, else the first active port",
              "RDMA device (and port) of the verbs wire and of ibgda's mlx5 NIC"),
    row::integer("GIN_IB_GID_INDEX", 0, 65535, "CommConfig's gidIndex, else automatic",
                 "RoCE GID index of the verbs wire and of ibgda's mlx5 NIC (below the port's table length)"),
    // --- ibgda transport
    row::choice("GIN_IBGDA_DEVICE", "soft,soft-sink,gpu-soft,gpu-soft-sink,mlx5",
                "CommConfig::ibgda.device (auto: mlx5)",
                "ibgda's NIC: the soft NIC (a host thread), the GPU NIC (a kernel; GPU ranks), either one "
                "only completing, or an mlx5 device"),
    row::choice("GIN_IBGDA_QUEUES", "host,gpu", "CommConfig::ibgda.queues (auto: gpu for the GPU NIC, else host)",
                "where ibgda's queues live (gpu: GPU memory, for the GPU NIC and, as DEVX objects, an mlx5 device; "
                "the soft NIC refuses it)"),
    row::integer("GIN_IBGDA_GPU_NIC_CTAS", 1, 1024, "CommConfig::ibgda.gpuNicCtas (2)",
                 "the GPU NIC's CTAs of 4 warps (each warp serves its share of the QPs)"),
    row::integer("GIN_IBGDA_GPU_NIC_IDLE_US", 0, 3600000000ll, "CommConfig::ibgda.gpuNicIdleUs (10000)",
                 "microseconds the GPU NIC's kernel stays without work before it ends (0: until the Comm ends)"),
    row::flag("GIN_SOFT_NIC_DEFERRED_COPIES", "0",
              "1 (CPU ranks, tests): the soft NIC's copies land only when it flushes, as on GPU ranks"),
    // --- AllReduce (docs/design/allreduce.md)
    row::size("GIN_ALLREDUCE_RING_CHUNK_SIZE", 1, 16ll << 20, "auto", "ring: bytes per chunk"),
    row::integer("GIN_ALLREDUCE_RING_NUM_CHUNKS", 1, 65536, "auto", "ring: chunks per partition"),
    row::size("GIN_ALLREDUCE_RING_MAX_BDP", 16, 4ll << 30, "32M", "ring: bytes in flight per partition"),
    row::size("GIN_ALLREDUCE_RING_MIN_SHARD_SIZE", 1, 16ll << 20, "16", "ring: smallest chunk"),
    row::size("GIN_ALLREDUCE_RING_BIDIR_AG_MAX_SIZE", -1, 1ll << 40, "4M",
              "ring: the AllGather runs both ways for messages up to this size; 0: never, -1: always"),
    row::integer("GIN_ALLREDUCE_RING_MAX_BLOCKS", 1, 1024, "auto",
                 "ring: at most this many blocks (and the workspace's maxBlocks)"),
    row::integer("GIN_ALLREDUCE_RING_BLOCK_SIZE", 32, 512, "auto", "ring: threads per block", 32),
    row::integer("GIN_ALLREDUCE_RING_NUM_BLOCKS", 1, 1024, "auto",
                 "ring: exactly this many blocks (tuning; still capped by maxBlocks and the units)"),
    row::size("GIN_ALLREDUCE_LL_MAX_SIZE", 0, 1ll << 30, "1M / nRanks (128K on 4 ranks)",
              "messages up to this size take the LL16 path on lsa-only communicators; 0: never"),
    row::integer("GIN_ALLREDUCE_LL_BLOCKS", 1, 32, "RingWorkspaceConfig::llBlocks (32)",
                 "blocks of every LL16 call; read by createRingWorkspace"),
    row::size("GIN_ALLREDUCE_DIRECT_MAX_SIZE", 0, 1ll << 40, "32M",
              "messages above the LL limit and up to this size take the two-shot direct path; 0: never"),
    row::integer("GIN_ALLREDUCE_DIRECT_BLOCKS", 1, 32, "one per 16K of the message", "blocks of a direct call"),
    row::size("GIN_ALLREDUCE_SHOT_MAX_SIZE", 0, 1ll << 30, "1M on 2 and 3 ranks, 512K on 4, else 0",
              "messages above the LL limit and up to this size take the one-shot path (stores to every peer, one "
              "barrier); 0: never; createRingWorkspace makes its window at least this large"),
    row::integer("GIN_ALLREDUCE_SHOT_BLOCKS", 1, 32, "one per 16K of the message",
                 "blocks of a one-shot call (at least what the slots need)"),
    // --- expert parallelism
    row::integer("GIN_EP_BATCH", 1, 1 << 20, "1",
                 "normal mode: tokens per ring tail/head signal of a gin::ep::GpuBuffer made with Shape::batch 0 "
                 "(the PyTorch extension's)"),
    row::integer("GIN_EP_TIMING", 0, 1 << 30, "0",
                 "N > 0: rank 0 of each gin::ep::GpuBuffer prints the phases of every Nth call, in microseconds"),
};
inline constexpr size_t kNumVars = sizeof kVars / sizeof kVars[0];

constexpr const Var* find(std::string_view name) {
  for (const Var& v : kVars)
    if (name == v.name) return &v;
  return nullptr;
}

inline const char* kindName(Kind k) {
  switch (k) {
    case Kind::Integer: return "integer";
    case Kind::Size: return "size";
    case Kind::Flag: return "flag";
    case Kind::Choice: return "choice";
    case Kind::Text: return "text";
    case Kind::List: return "list";
  }
  return "?";
}

// A size as the shortest text the parser reads back (16777216 -> "16M").
inline std::string sizeText(long long v) {
  const char* suf[] = {"", "K", "M", "G"};
  int i = 0;
  while (i < 3 && v != 0 && v % 1024 == 0) v /= 1024, ++i;
  return std::to_string(v) + suf[i];
}

// What `v` allows, in words (error messages, docs).
inline std::string allowed(const Var& v) {
  switch (v.kind) {
    case Kind::Integer: {
      std::string s = "an integer from " + std::to_string(v.lo) + " to " + std::to_string(v.hi);
      if (v.step > 1) s += ", a multiple of " + std::to_string(v.step);
      return s;
    }
    case Kind::Size:
      return "bytes from " + sizeText(v.lo) + " to " + sizeText(v.hi) + " (suffixes K, M, G: powers of 1024)";
    case Kind::Flag: return "0 or 1";
    case Kind::Choice: {
      std::string s = "one of ";
      for (const char* p = v.values; *p; ++p) s += *p == ',' ? std::string(", ") : std::string(1, *p);
      return s;
    }
    case Kind::Text:
    case Kind::List: return v.values;
  }
  return "";
}

namespace detail {
// The row of a GIN_* name (a gin::Error when it has none, or is read as
// another kind); nullptr for other names (launcher variables).
inline const Var* rowOf(const char* name, Kind want, bool anyKind = false) {
  const std::string_view n(name);
  const Var* v = find(n);
  if (n.substr(0, 4) == "GIN_") {
    if (!v)
      throw Error(std::string(name) + " is read but has no row in gin/host/env.hpp's table (a gin bug: add it, "
                                      "and its line in docs/configuration.md)");
    if (!anyKind && v->kind != want && !(want == Kind::Text && v->kind == Kind::List))
      throw Error(std::string(name) + " is read as a " + kindName(want) + " but its row says " + kindName(v->kind) +
                  " (a gin bug)");
  }
  return v;
}
[[noreturn]] inline void bad(const char* name, const std::string& value, const std::string& what,
                             const Var* v = nullptr) {
  std::string s = std::string(name) + "=\"" + value + "\" is not allowed: expected " + what;
  if (v) s += std::string(" (") + v->meaning + "; default: " + v->def + ")";
  throw Error(s);
}
}  // namespace detail

// The variable's value; nullopt when unset or empty. Any name; a GIN_* name
// must have a row.
inline std::optional<std::string> raw(const char* name) {
  (void)detail::rowOf(name, Kind::Text, true);
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return std::nullopt;
  return std::string(e);
}

// The one number parser: decimal, an optional leading '-', with `suffixes` an
// optional K/M/G (powers of 1024), in [lo, hi] and a multiple of `step`.
// Throws gin::Error naming `name`, `value` and `what` is allowed.
inline long long parseNumber(const char* name, const std::string& value, long long lo, long long hi,
                             bool suffixes = false, long long step = 1, const std::string& what = "",
                             const Var* v = nullptr) {
  const std::string expect = !what.empty() ? what
                             : suffixes    ? "bytes from " + sizeText(lo) + " to " + sizeText(hi) +
                                              " (suffixes K, M, G: powers of 1024)"
                                           : "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  size_t i = 0;
  const bool neg = !value.empty() && value[0] == '-';
  if (neg) i = 1;
  if (i >= value.size() || value[i] < '0' || value[i] > '9') detail::bad(name, value, expect, v);
  unsigned long long mag = 0;
  for (; i < value.size() && value[i] >= '0' && value[i] <= '9'; ++i) {
    if (mag > (~0ull - 9) / 10) detail::bad(name, value, expect, v);
    mag = mag * 10 + unsigned(value[i] - '0');
  }
  const std::string suf = value.substr(i);
  int shift = 0;
  if (suf.empty())
    shift = 0;
  else if (!suffixes)
    detail::bad(name, value, expect, v);
  else if (suf == "B" || suf == "b")
    shift = 0;
  else if (suf == "K" || suf == "k" || suf == "KiB" || suf == "KB")
    shift = 10;
  else if (suf == "M" || suf == "m" || suf == "MiB" || suf == "MB")
    shift = 20;
  else if (suf == "G" || suf == "g" || suf == "GiB" || suf == "GB")
    shift = 30;
  else
    detail::bad(name, value, expect, v);
  if (mag > (0x7fffffffffffffffull >> shift)) detail::bad(name, value, expect, v);
  const long long n = (neg ? -1 : 1) * (long long)(mag << shift);
  if (n < lo || n > hi || (step > 1 && n % step != 0)) detail::bad(name, value, expect, v);
  return n;
}

// A whole number in the row's range (GIN_*), or in [lo, hi] (launcher variables).
inline std::optional<long long> integer(const char* name) {
  const Var* v = detail::rowOf(name, Kind::Integer);
  if (!v) throw Error(std::string(name) + ": env::integer(name) needs a GIN_* row (a gin bug)");
  auto s = raw(name);
  if (!s) return std::nullopt;
  return parseNumber(name, *s, v->lo, v->hi, false, v->step, allowed(*v), v);
}
inline std::optional<long long> integer(const char* name, long long lo, long long hi) {
  const Var* v = detail::rowOf(name, Kind::Integer);
  if (v && (v->lo != lo || v->hi != hi))
    throw Error(std::string(name) + " is read with a range its row does not give (a gin bug)");
  auto s = raw(name);
  if (!s) return std::nullopt;
  return parseNumber(name, *s, lo, hi, false, v ? v->step : 1, v ? allowed(*v) : "", v);
}
// A byte count (K/M/G suffixes) in the row's range.
inline std::optional<long long> size(const char* name) {
  const Var* v = detail::rowOf(name, Kind::Size);
  if (!v) throw Error(std::string(name) + ": env::size(name) needs a GIN_* row (a gin bug)");
  auto s = raw(name);
  if (!s) return std::nullopt;
  return parseNumber(name, *s, v->lo, v->hi, true, 1, allowed(*v), v);
}
// 0 or 1.
inline std::optional<bool> flag(const char* name) {
  const Var* v = detail::rowOf(name, Kind::Flag);
  auto s = raw(name);
  if (!s) return std::nullopt;
  if (*s != "0" && *s != "1") detail::bad(name, *s, "0 or 1", v);
  return *s == "1";
}
// One of the row's words.
inline std::optional<std::string> choice(const char* name) {
  const Var* v = detail::rowOf(name, Kind::Choice);
  if (!v) throw Error(std::string(name) + ": env::choice(name) needs a GIN_* row (a gin bug)");
  auto s = raw(name);
  if (!s) return std::nullopt;
  for (std::string_view rest = v->values; !rest.empty();) {
    const size_t comma = rest.find(',');
    if (rest.substr(0, comma) == *s) return s;
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  detail::bad(name, *s, allowed(*v), v);
}
// Free text (addresses, names, lists the caller parses and checks).
inline std::optional<std::string> text(const char* name) {
  (void)detail::rowOf(name, Kind::Text);
  return raw(name);
}

// GIN_DEBUG's block: the GIN_* variables that are set (as set, even when
// malformed: the reader that uses one reports it) and the defaults that apply
// to the others. Lines start with `prefix`.
inline std::string describe(const std::string& prefix = "gin: ") {
  std::string set, defaults;
  int nSet = 0;
  for (const Var& v : kVars) {
    const char* e = std::getenv(v.name);
    if (e && *e) {
      set += (set.empty() ? "" : " ") + std::string(v.name) + "=" + e;
      ++nSet;
    }
  }
  std::string out = prefix + "environment: " + std::to_string(nSet) + " of " + std::to_string(kNumVars) +
                    " GIN_* variables set (empty counts as unset; docs/configuration.md)\n";
  if (nSet) out += prefix + "  set: " + set + "\n";
  std::string line = prefix + "  defaults:";
  for (const Var& v : kVars) {
    const char* e = std::getenv(v.name);
    if (e && *e) continue;
    const std::string item = std::string(" ") + v.name + "=" + v.def + ";";
    if (line.size() + item.size() > 120 && line != prefix + "  defaults:") {
      out += line + "\n";
      line = prefix + "   ";
    }
    line += item;
  }
  if (line != prefix + "  defaults:") out += line + "\n";
  return out;
}

// docs/configuration.md's table, as the header has it.
inline std::string markdownTable() {
  std::string s = "| variable | kind | allowed | default | meaning |\n|---|---|---|---|---|\n";
  for (const Var& v : kVars)
    s += std::string("| `") + v.name + "` | " + kindName(v.kind) + " | " + allowed(v) + " | " + v.def + " | " +
         v.meaning + " |\n";
  return s;
}

}  // namespace gin::env
