// The whole proxy suite (tests/device/proxy.cpp) again with the Comm's verbs
// wire carrying every peer (GIN_PROXY_WIRE=verbs, set by meson), over
// tests/common/fake_verbs.hpp, the in-process model of RC queue pairs (this
// executable does not link libibverbs). It proves the Comm's wiring of the
// verbs wire (window registration, routing, completion before signals,
// teardown); nothing about a real NIC.
#include "../common/fake_verbs.hpp"  // first: defines the ibv_* functions

#define GIN_COMM_VERBS 1
#include "../device/proxy.cpp"
