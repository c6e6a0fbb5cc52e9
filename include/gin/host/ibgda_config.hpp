// gin/host/ibgda_config.hpp — IbgdaConfig (CommConfig::ibgda): which NIC
// carries the ibgda transport's queues, where the queues live, their depth and
// limits; GIN_IBGDA_DEVICE and GIN_IBGDA_QUEUES, which override it; and the
// checks IbgdaTransport (ibgda.hpp) makes of it before it builds anything.
#pragma once

#include <cstdint>
#include <string>

#include "gin/core/error.hpp"
#include "gin/device/mlx5/prm.hpp"
#include "gin/host/env.hpp"

namespace gin {

struct IbgdaConfig {
  // Auto: GIN_IBGDA_DEVICE from the environment (soft, soft-sink, gpu-soft,
  // gpu-soft-sink, mlx5), else a real mlx5 device. The *Sink NICs only
  // complete WQEs (posting-cost benchmarks; nothing is written anywhere).
  enum class Device { Auto, Soft, SoftSink, Mlx5, GpuSoft, GpuSoftSink };
  Device device = Device::Auto;
  // Where each QP's send queue, doorbell records and CQ live. Host: pinned
  // host memory (mapped into the GPU on GPU ranks); the soft NIC needs it.
  // Gpu: GPU memory: the GPU NIC's default; on an mlx5 device, DEVX objects
  // (QP, CQ, doorbell records) on a umem of GPU memory (host memory on CPU
  // ranks) and a UAR per context, as NVSHMEM's IBGDA builds them; the soft
  // NIC refuses it. Auto: GIN_IBGDA_QUEUES (host, gpu), else Gpu for the
  // GPU NIC and Host for the others (the mlx5 device included: its DEVX
  // path has run only against a model, docs/design/ibgda.md).
  enum class Queues { Auto, Host, Gpu };
  Queues queues = Queues::Auto;
  uint32_t qpDepth = 256;  // WQEs per QP (and CQEs per CQ): a power of two in [2, 2^15]
  // Bytes one RDMA WRITE carries; larger puts are split. Below 2^31 (bit 31
  // of a data segment's byte count means inline data); on an mlx5 device,
  // lowered to the port's max_msg_sz where that is smaller (config() tells).
  uint32_t maxWqeBytes = 1u << 20;
  uint32_t maxWindows = 64;  // windows registered at once
  // Posts only publish their WQEs; flush, waitCounter, readCounter and
  // producers waiting for room ring the doorbell (one ring covers a batch).
  // A peer waiting for a signal sees nothing until the sender flushes.
  bool deferDoorbell = false;
  // The GPU NIC: CTAs of 4 warps (GIN_IBGDA_GPU_NIC_CTAS overrides), and how
  // long its kernel stays without work before it ends until the next doorbell
  // (GIN_IBGDA_GPU_NIC_IDLE_US overrides; 0: it stays until the Comm ends).
  int gpuNicCtas = 2;
  uint64_t gpuNicIdleUs = 10000;
};

namespace detail {
inline IbgdaConfig::Device ibgdaDevice(IbgdaConfig::Device d) {
  if (d != IbgdaConfig::Device::Auto) return d;
  const auto v = env::choice("GIN_IBGDA_DEVICE");
  if (v == "soft") return IbgdaConfig::Device::Soft;
  if (v == "soft-sink") return IbgdaConfig::Device::SoftSink;
  if (v == "gpu-soft") return IbgdaConfig::Device::GpuSoft;
  if (v == "gpu-soft-sink") return IbgdaConfig::Device::GpuSoftSink;
  return IbgdaConfig::Device::Mlx5;
}
inline bool gpuNicDevice(IbgdaConfig::Device d) {
  return d == IbgdaConfig::Device::GpuSoft || d == IbgdaConfig::Device::GpuSoftSink;
}
inline IbgdaConfig::Queues ibgdaQueues(IbgdaConfig::Queues q, IbgdaConfig::Device d) {
  if (q != IbgdaConfig::Queues::Auto) return q;
  const auto v = env::choice("GIN_IBGDA_QUEUES");
  if (v == "gpu") return IbgdaConfig::Queues::Gpu;
  if (v == "host") return IbgdaConfig::Queues::Host;
  return gpuNicDevice(d) ? IbgdaConfig::Queues::Gpu : IbgdaConfig::Queues::Host;
}
// Throws gin::Error unless qpDepth, maxWqeBytes and maxWindows are in range.
inline void checkIbgdaConfig(const IbgdaConfig& cfg) {
  if (cfg.qpDepth < 2 || (cfg.qpDepth & (cfg.qpDepth - 1)) || cfg.qpDepth > (1u << 15) || cfg.maxWqeBytes == 0 ||
      cfg.maxWindows == 0)
    throw Error(
        "CommConfig::ibgda: qpDepth must be a power of two in [2, 2^15], maxWqeBytes and maxWindows > 0 "
        "(got " +
        std::to_string(cfg.qpDepth) + ", " + std::to_string(cfg.maxWqeBytes) + ", " + std::to_string(cfg.maxWindows) +
        ")");
  if (cfg.maxWqeBytes > mlx5::kMaxDataSegBytes)
    throw Error("CommConfig::ibgda.maxWqeBytes = " + std::to_string(cfg.maxWqeBytes) +
                " is 2^31 or more: one mlx5 WQE's data segment describes at most 2^31 - 1 bytes (bit 31 of its "
                "byte count marks inline data). Set it below 2^31; the default is 1 MiB, and ConnectX ports report "
                "at most 1 GiB per message (max_msg_sz)");
}
// Throws gin::Error when `queues` (resolved) is Gpu for the host soft NIC,
// a host thread, which needs them in host memory (the GPU NIC and the mlx5
// device take both placements; the caller has set the GPU NIC aside).
inline void checkIbgdaQueues(IbgdaConfig::Queues queues, IbgdaConfig::Device device) {
  if (queues == IbgdaConfig::Queues::Gpu && device != IbgdaConfig::Device::Mlx5)
    throw Error(
        "ibgda queues in GPU memory (IbgdaConfig::queues = Gpu, GIN_IBGDA_QUEUES=gpu) are for the GPU NIC "
        "(GIN_IBGDA_DEVICE=gpu-soft) and an mlx5 device; the soft NIC, a host thread, needs them in host memory: "
        "use GIN_IBGDA_QUEUES=host");
}
}  // namespace detail

}  // namespace gin
