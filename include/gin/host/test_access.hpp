// gin/host/test_access.hpp — what gin's tests (and gin-bench's transport
// counters) reach inside a Comm that users do not: its transports' host
// objects, to pause the proxy engine or the soft NIC, count what they
// executed, fence the tcp wire or inject faults into it. Not part of the
// user API; a program that includes it depends on gin's internals.
//
//   gin::test::PauseAccess::pause(*gin::test::CommAccess::proxyEngine(comm), true);
#pragma once

#include "gin/host/comm.hpp"
#include "gin/host/ibgda.hpp"
#include "gin/host/proxy.hpp"
#include "gin/host/soft_nic.hpp"
#include "gin/host/tcp_wire.hpp"

namespace gin::test {

struct CommAccess {
  // The proxy engine, or nullptr when no peer uses the proxy.
  static ProxyEngine* proxyEngine(const Comm& c) { return c.proxy_.engine(); }
  // The tcp wire, or nullptr when no pair of ranks uses it.
  static TcpWire* tcpWire(const Comm& c) { return c.proxy_.tcp(); }
  // The ibgda transport (its soft NIC or mlx5 device), or nullptr when no peer uses ibgda.
  static IbgdaTransport* ibgda(const Comm& c) { return c.ibgda_.get(); }
};

// Pausing a consumer: a paused proxy engine or soft NIC consumes nothing until
// resumed; pause(x, true) returns once its threads have parked.
struct PauseAccess {
  static void pause(ProxyEngine& e, bool p) { e.pause(p); }
  static void pause(SoftNic& nic, bool p) { nic.pause(p); }
};

}  // namespace gin::test
