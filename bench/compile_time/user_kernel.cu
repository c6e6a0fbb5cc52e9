// The smallest user kernel bench/compile_time.sh times: include gin, put a
// block to the next rank with a SignalInc and wait for the one from the
// previous rank. GIN_CT_BACKENDS picks the transports the kernel instantiates
// (default: gin::kBackendLsa, one transport; gin::kBackendAll for all three).
// GIN_CT_DEVICE_ONLY includes gin/device.hpp alone (a kernel-only unit, the
// host set-up compiled in another one).
#ifdef GIN_CT_DEVICE_ONLY
#include "gin/device.hpp"
#else
#include "gin/gin.hpp"
#endif

#ifndef GIN_CT_BACKENDS
#define GIN_CT_BACKENDS gin::kBackendLsa
#endif

__global__ void userKernel(gin::DevComm dc, gin::Window win, size_t bytes) {
  gin::Net<GIN_CT_BACKENDS> net(dc, 0);
  const int next = (dc.rank + 1) % dc.nRanks;
  net.put(gin::teamWorld(dc), next, win, bytes, win, 0, bytes, gin::SignalInc{0}, gin::None{}, gin::CoopBlock{});
  net.waitSignal(gin::CoopBlock{}, 0, 1);
}
