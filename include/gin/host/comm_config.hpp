// gin/host/comm_config.hpp — CommConfig, what a communicator is built with,
// and the environment variables that override it (GIN_TIMEOUT_MS,
// GIN_TRANSPORT, GIN_PROXY_WIRE, GIN_DEBUG). resolveCommConfig checks a
// config and applies the environment; it is local (ranks compare the result
// when they build the Comm).
#pragma once

#include <cstdint>
#include <string>

#include "gin/core/error.hpp"
#include "gin/device/comm.hpp"
#include "gin/host/env.hpp"
#include "gin/host/ibgda_config.hpp"
#include "gin/host/proxy.hpp"
#include "gin/host/tcp_wire.hpp"

namespace gin {

enum class DeviceKind { Auto, Cpu, Gpu };

// How peers are reached. Auto: lsa for every peer load/store reaches (the
// ranks of this host), the proxy for the others (ranks on other hosts, over
// the tcp wire). Lsa: lsa only (ranks on several hosts are refused). Proxy:
// every peer through the proxy engine, lsa members included (testing,
// debugging). Ibgda: the peers of this host through GPU-posted mlx5 work
// requests, lsa members included (on the soft NIC, or on an mlx5 device
// when built with GIN_IBGDA_MLX5=1: CommConfig::ibgda).
// GIN_TRANSPORT=auto|lsa|proxy|ibgda overrides; which wire the proxy uses per
// peer: CommConfig::proxy.wire / GIN_PROXY_WIRE.
enum class TransportChoice { Auto, Lsa, Proxy, Ibgda };

struct CommConfig {
  int nContexts = 4;    // network contexts (queue pairs per peer on network transports)
  int nSignals = 256;   // signal ids 0..nSignals-1
  int nCounters = 256;  // counter ids 0..nCounters-1
  int nBarriers = 132;  // barrier indices per kind (lsa, world): one per CTA of an H100/H200
  // Bound on every device-side wait; 0 takes GIN_TIMEOUT_MS from the
  // environment, else 30 s.
  uint64_t timeoutNs = 0;
  // Auto: the GPU when one is visible (and GIN_DEVICE is not "cpu"), else CPU ranks.
  DeviceKind device = DeviceKind::Auto;
  // GPU to use; -1: LOCAL_RANK from the launcher, else this rank's index among
  // the ranks of its host (modulo the number of visible GPUs).
  int cudaDevice = -1;
  TransportChoice transport = TransportChoice::Auto;
  ProxyConfig proxy;  // rings and engine of the proxy transport
  IbgdaConfig ibgda;  // queue pairs and NIC of the ibgda transport
};

namespace detail {
inline uint64_t envTimeoutNs() {
  if (auto ms = env::integer("GIN_TIMEOUT_MS")) return uint64_t(*ms) * 1000000ull;
  return 30'000'000'000ull;
}
inline TransportChoice envTransport(TransportChoice fallback) {
  const auto v = env::choice("GIN_TRANSPORT");
  if (!v) return fallback;
  if (*v == "lsa") return TransportChoice::Lsa;
  if (*v == "proxy") return TransportChoice::Proxy;
  if (*v == "ibgda") return TransportChoice::Ibgda;
  return TransportChoice::Auto;
}
inline const char* choiceName(TransportChoice c) {
  switch (c) {
    case TransportChoice::Auto: return "auto";
    case TransportChoice::Lsa: return "lsa";
    case TransportChoice::Proxy: return "proxy";
    case TransportChoice::Ibgda: return "ibgda";
  }
  return "?";
}
inline bool envDebug() { return env::flag("GIN_DEBUG").value_or(false); }
inline const char* transportName(Transport t) {
  switch (t) {
    case Transport::None: return "none";
    case Transport::Lsa: return "lsa";
    case Transport::Proxy: return "proxy";
    case Transport::Ibgda: return "ibgda";
  }
  return "?";
}

// The resolved config, one line (GIN_DEBUG).
inline std::string describeConfig(const CommConfig& c) {
  return "CommConfig: nContexts=" + std::to_string(c.nContexts) + " nSignals=" + std::to_string(c.nSignals) +
         " nCounters=" + std::to_string(c.nCounters) + " nBarriers=" + std::to_string(c.nBarriers) +
         " timeoutMs=" + std::to_string(c.timeoutNs / 1000000ull) + " transport=" + choiceName(c.transport) +
         " proxy.wire=" + proxyWireName(c.proxy.wire) + " proxy.ringSlots=" + std::to_string(c.proxy.ringSlots) +
         " proxy.batch=" + std::to_string(c.proxy.batch) + " proxy.threads=" + std::to_string(c.proxy.threads) +
         " proxy.producerStores=" + std::to_string(c.proxy.producerStores) +
         " proxy.cpus=" + (c.proxy.cpus.empty() ? std::string("(default)") : c.proxy.cpus) +
         " ibgda.qpDepth=" + std::to_string(c.ibgda.qpDepth);
}

// `cfg` checked (throws gin::Error naming the bad fields), with the timeout,
// transport and proxy wire the environment asks for.
inline CommConfig resolveCommConfig(CommConfig cfg) {
  if (cfg.nContexts < 1 || cfg.nSignals < 0 || cfg.nCounters < 0 || cfg.nBarriers < 1)
    throw Error("CommConfig: nContexts and nBarriers must be >= 1, nSignals and nCounters >= 0 (got " +
                std::to_string(cfg.nContexts) + ", " + std::to_string(cfg.nBarriers) + ", " +
                std::to_string(cfg.nSignals) + ", " + std::to_string(cfg.nCounters) + ")");
  if (cfg.proxy.ringSlots < 2 || (cfg.proxy.ringSlots & (cfg.proxy.ringSlots - 1)) != 0 ||
      cfg.proxy.ringSlots > kProxyMaxSlots || cfg.proxy.batch < 1 || cfg.proxy.threads < 1)
    throw Error("CommConfig::proxy: ringSlots must be a power of two in [2, 2^15], batch and threads >= 1 (got " +
                std::to_string(cfg.proxy.ringSlots) + ", " + std::to_string(cfg.proxy.batch) + ", " +
                std::to_string(cfg.proxy.threads) + ")");
  if (cfg.timeoutNs == 0) cfg.timeoutNs = envTimeoutNs();
  cfg.transport = envTransport(cfg.transport);
  cfg.proxy.wire = envProxyWire(cfg.proxy.wire);
  return cfg;
}
}  // namespace detail

}  // namespace gin
