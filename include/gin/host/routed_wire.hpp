// gin/host/routed_wire.hpp — which wire reaches a peer: GIN_PROXY_WIRE as a
// ProxyWire and back to its name (detail::envProxyWire, proxyWireName), and
// RoutedWire, the engine's wire that sends each peer's operations to the
// local, tcp or verbs wire chosen for it.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "gin/device/transport/proxy.hpp"
#include "gin/host/env.hpp"
#include "gin/host/proxy_config.hpp"
#include "gin/host/wire.hpp"

namespace gin {

namespace detail {
inline ProxyWire envProxyWire(ProxyWire fallback) {
  const auto v = env::choice("GIN_PROXY_WIRE");
  if (!v) return fallback;
  if (*v == "local") return ProxyWire::Local;
  if (*v == "tcp") return ProxyWire::Tcp;
  if (*v == "verbs") return ProxyWire::Verbs;
  return ProxyWire::Auto;
}
inline const char* proxyWireName(ProxyWire w) {
  switch (w) {
    case ProxyWire::Auto: return "auto";
    case ProxyWire::Local: return "local";
    case ProxyWire::Tcp: return "tcp";
    case ProxyWire::Verbs: return "verbs";
  }
  return "?";
}
}  // namespace detail

// The engine's wire when some peers are reached by a copy and others over a
// network wire (tcp, verbs).
class RoutedWire final : public Wire {
 public:
  // kinds[r]: ProxyWire::Local, Tcp or Verbs for each peer the proxy reaches;
  // tcp and verbs may be null when no peer uses them.
  RoutedWire(std::unique_ptr<Wire> local, Wire* tcp, Wire* verbs, std::vector<uint8_t> kinds)
      : local_(std::move(local)), tcp_(tcp), verbs_(verbs), kinds_(std::move(kinds)) {}
  bool put(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* src, uint64_t bytes,
           WireReject* why) override {
    return pick(peer).put(peer, dstWindow, dstOffset, src, bytes, why);
  }
  bool putInline(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* bytes, uint64_t n,
                 WireReject* why) override {
    return pick(peer).putInline(peer, dstWindow, dstOffset, bytes, n, why);
  }
  bool signal(int peer, uint32_t id, ProxyAction op, uint64_t value, WireReject* why) override {
    return pick(peer).signal(peer, id, op, value, why);
  }
  // Every wire: the engine's "everything before is complete" covers every peer.
  void complete() override {
    local_->complete();
    if (tcp_) tcp_->complete();
    if (verbs_) verbs_->complete();
  }

 private:
  std::unique_ptr<Wire> local_;
  Wire* tcp_;
  Wire* verbs_;
  std::vector<uint8_t> kinds_;
  Wire& pick(int peer) {
    const auto k = peer >= 0 && size_t(peer) < kinds_.size() ? ProxyWire(kinds_[size_t(peer)]) : ProxyWire::Local;
    if (k == ProxyWire::Tcp && tcp_) return *tcp_;
    if (k == ProxyWire::Verbs && verbs_) return *verbs_;
    return *local_;
  }
};

}  // namespace gin
