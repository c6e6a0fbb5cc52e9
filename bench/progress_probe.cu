// gin-progress-probe: which ways of writing GPU memory from a host thread make
// progress while a kernel of the same process spins waiting for that write.
// This is the measurement behind gin's progress rule (docs/design/progress.md):
// run it as `gin-progress-probe` and again with CUDA_DEVICE_MAX_CONNECTIONS=1.
//
// For each method a kernel (1 block, or 264 blocks of 1024 threads) spins on a
// word in device memory for at most 3 s, with a second kernel queued behind it
// on its stream, as a real program would have; 50 ms after the launch a host
// thread writes the word by the method and waits for its write to complete.
// "the write" means the kernel saw it; "TIMEOUT" means the write only ran
// after the spinning kernel gave up. Then the latency of a side-context
// launch (what gin uses) is measured with the GPU idle and with a kernel
// spinning. Last, what a persistent kernel (a GPU NIC's, say: launched first
// on a non-blocking stream of its own, nothing queued behind it) does to the
// program around it: which later CUDA calls of another thread return while
// it runs, and which wait for it to end.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {
#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) std::printf("  %s -> %s\n", #x, cudaGetErrorString(e_)); \
  } while (0)

bool dk(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  std::printf("  %s -> %s\n", what, s ? s : "?");
  return false;
}

__global__ void spin(volatile unsigned* flag, unsigned target, unsigned* out, long long ns) {
  long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    if (*flag >= target) {
      if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = 1;
      return;
    }
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > ns) {
      if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = 2;
      return;
    }
  }
}
__global__ void setWord(unsigned* flag, unsigned v) {
  *(volatile unsigned*)flag = v;
  __threadfence_system();
}
__global__ void nothing() {}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Env {
  CUcontext primary = nullptr, side = nullptr;
  CUstream sideStream = nullptr;
  CUgreenCtx green = nullptr;
  CUstream greenStream = nullptr;
};

// One method against one spinning kernel; prints one line.
void tryMethod(Env& env, const std::string& m, int blocks, int threads) {
  const bool managed = m == "managed-cpu-store";
  unsigned* flag = nullptr;
  if (managed)
    CK(cudaMallocManaged(&flag, 4096));
  else
    CK(cudaMalloc(&flag, 4096));
  CK(cudaMemset(flag, 0, 4096));
  unsigned *out = nullptr, *one = nullptr, *devOne = nullptr;
  CK(cudaHostAlloc(&out, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  CK(cudaHostAlloc(&one, 64, cudaHostAllocPortable));
  one[0] = 1;
  out[0] = 0;
  CK(cudaMalloc(&devOne, 64));
  CK(cudaMemcpy(devOne, one, 4, cudaMemcpyHostToDevice));
  cudaStream_t user, other;
  CK(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  CK(cudaDeviceSynchronize());
  spin<<<blocks, threads, 0, user>>>(flag, 1, out, 3'000'000'000LL);
  nothing<<<1, 1, 0, user>>>();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double t0 = now();
  if (managed) {
    *(volatile unsigned*)flag = 1;
  } else if (m == "memcpy-h2d-other-stream") {
    CK(cudaMemcpyAsync(flag, one, 4, cudaMemcpyHostToDevice, other));
    CK(cudaStreamSynchronize(other));
  } else if (m == "memcpy-d2d-other-stream") {
    CK(cudaMemcpyAsync(flag, devOne, 4, cudaMemcpyDeviceToDevice, other));
    CK(cudaStreamSynchronize(other));
  } else if (m == "kernel-other-stream") {
    setWord<<<1, 1, 0, other>>>(flag, 1);
    CK(cudaStreamSynchronize(other));
  } else if (m == "memcpy-second-context") {
    cuCtxSetCurrent(env.side);
    if (dk(cuMemcpyHtoDAsync(CUdeviceptr(flag), one, 4, env.sideStream), "cuMemcpyHtoDAsync"))
      dk(cuStreamSynchronize(env.sideStream), "cuStreamSynchronize");
    cuCtxSetCurrent(env.primary);
  } else if (m == "kernel-second-context") {
    cuCtxSetCurrent(env.side);
    setWord<<<1, 1, 0, cudaStream_t(env.sideStream)>>>(flag, 1);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(cudaStream_t(env.sideStream)));
    cuCtxSetCurrent(env.primary);
  } else if (m == "kernel-second-context-during-cudaFree") {
    // Another thread of the process frees memory (which synchronizes the
    // user's context, so it waits for the spinning kernel) while this one
    // writes the word from the second context.
    void* junk = nullptr;
    CK(cudaMalloc(&junk, 1 << 20));
    std::thread freer([junk] { CK(cudaFree(junk)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    cuCtxSetCurrent(env.side);
    setWord<<<1, 1, 0, cudaStream_t(env.sideStream)>>>(flag, 1);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(cudaStream_t(env.sideStream)));
    cuCtxSetCurrent(env.primary);
    freer.join();
  } else if (m == "memcpy-green-context") {
    if (dk(cuMemcpyHtoDAsync(CUdeviceptr(flag), one, 4, env.greenStream), "cuMemcpyHtoDAsync"))
      dk(cuStreamSynchronize(env.greenStream), "cuStreamSynchronize");
  } else if (m == "kernel-green-context") {
    setWord<<<1, 1, 0, cudaStream_t(env.greenStream)>>>(flag, 1);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(cudaStream_t(env.greenStream)));
  }
  const double t1 = now();
  CK(cudaDeviceSynchronize());
  const char* conns = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("%-38s %4d x %4d  conns=%-7s  write done after %8.4f s, kernel saw %s\n", m.c_str(), blocks, threads,
              conns ? conns : "default", t1 - t0,
              out[0] == 1   ? "the write"
              : out[0] == 2 ? "TIMEOUT"
                            : "nothing");
  cudaFree(flag);
  cudaFree(devOne);
  cudaFreeHost(out);
  cudaFreeHost(one);
  cudaStreamDestroy(user);
  cudaStreamDestroy(other);
}

// Latency of launch + synchronize in the second context, GPU idle or busy.
void sideLatency(Env& env, int blocks, int threads) {
  const int n = 200;
  unsigned* flag = nullptr;
  unsigned* out = nullptr;
  CK(cudaMalloc(&flag, 4096));
  CK(cudaMemset(flag, 0, 4096));
  CK(cudaHostAlloc(&out, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  out[0] = 0;
  cudaStream_t user;
  CK(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
  CK(cudaDeviceSynchronize());
  if (blocks > 0) spin<<<blocks, threads, 0, user>>>(flag, n, out, 20'000'000'000LL);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<double> lat;
  cuCtxSetCurrent(env.side);
  for (int i = 1; i <= n; ++i) {
    const double t0 = now();
    setWord<<<1, 1, 0, cudaStream_t(env.sideStream)>>>(flag, unsigned(i));
    cuStreamSynchronize(env.sideStream);
    lat.push_back(now() - t0);
  }
  cuCtxSetCurrent(env.primary);
  CK(cudaDeviceSynchronize());
  std::sort(lat.begin(), lat.end());
  std::printf("side-context launch+sync, %s: p50 %.1f us, p90 %.1f us, max %.1f us%s\n",
              blocks ? (std::to_string(blocks) + " x " + std::to_string(threads) + " spinning").c_str() : "GPU idle",
              lat[n / 2] * 1e6, lat[n * 9 / 10] * 1e6, lat.back() * 1e6,
              blocks && out[0] != 1 ? " (the spinning kernel missed writes!)" : "");
  cudaFree(flag);
  cudaFreeHost(out);
  cudaStreamDestroy(user);
}

// A persistent kernel: every block marks itself started (mapped host word),
// then polls a mapped host stop word.
__global__ void persistentUntil(volatile unsigned* stop, unsigned* started) {
  if (threadIdx.x == 0) {
    atomicAdd_system(started, 1u);
    __threadfence_system();
  }
  while (*stop == 0) __nanosleep(2000);
}
__global__ void bump(unsigned* word) { atomicAdd(word, 1u); }

// One CUDA call made by another thread while a persistent kernel of `blocks`
// blocks runs: does it return within 1 s, or only once the kernel ends?
void tryBesidePersistent(const std::string& m, int blocks) {
  unsigned *ctl = nullptr, *ctlDev = nullptr;
  CK(cudaHostAlloc(&ctl, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(ctl, 0, 64);
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&ctlDev), ctl, 0));
  unsigned* word = nullptr;
  void* pre = nullptr;
  std::vector<char> host(1 << 20, 1);
  CK(cudaMalloc(&word, 1 << 20));
  CK(cudaMalloc(&pre, 1 << 20));
  cudaStream_t nic, other, blocking;
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  CK(cudaStreamCreateWithPriority(&nic, cudaStreamNonBlocking, hi));
  CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  CK(cudaStreamCreate(&blocking));
  CK(cudaDeviceSynchronize());
  persistentUntil<<<blocks, 128, 0, nic>>>(ctlDev, ctlDev + 1);
  CK(cudaGetLastError());
  const double ts = now();
  while (*(volatile unsigned*)(ctl + 1) < unsigned(blocks) && now() - ts < 2) std::this_thread::yield();
  const bool allStarted = *(volatile unsigned*)(ctl + 1) == unsigned(blocks);
  volatile bool done = false;
  double took = 0;
  std::thread t([&] {
    const double t0 = now();
    if (m == "kernel-other-stream") {
      bump<<<1, 1, 0, other>>>(word);
      CK(cudaStreamSynchronize(other));
    } else if (m == "kernel-legacy-stream") {
      bump<<<1, 1>>>(word);
      CK(cudaStreamSynchronize(0));
    } else if (m == "kernel-blocking-stream") {
      bump<<<1, 1, 0, blocking>>>(word);
      CK(cudaStreamSynchronize(blocking));
    } else if (m == "two-kernels-other-stream") {
      bump<<<132, 256, 0, other>>>(word);
      bump<<<132, 256, 0, other>>>(word);
      CK(cudaStreamSynchronize(other));
    } else if (m == "cudaMemcpy-h2d") {
      CK(cudaMemcpy(word, host.data(), host.size(), cudaMemcpyHostToDevice));
    } else if (m == "cudaMemcpyAsync-other-stream") {
      CK(cudaMemcpyAsync(word, host.data(), host.size(), cudaMemcpyHostToDevice, other));
      CK(cudaStreamSynchronize(other));
    } else if (m == "cudaMemset") {
      CK(cudaMemset(word, 0, 4096));
    } else if (m == "cudaMalloc") {
      void* p = nullptr;
      CK(cudaMalloc(&p, 64 << 20));
      pre = p;  // freed below, after the kernel
    } else if (m == "cudaFree") {
      CK(cudaFree(pre));
      pre = nullptr;
    } else if (m == "cudaHostAlloc+cudaFreeHost") {
      void* p = nullptr;
      CK(cudaHostAlloc(&p, 1 << 20, cudaHostAllocMapped));
      CK(cudaFreeHost(p));
    } else if (m == "cudaEventSynchronize-other-stream") {
      cudaEvent_t e;
      CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      bump<<<1, 1, 0, other>>>(word);
      CK(cudaEventRecord(e, other));
      CK(cudaEventSynchronize(e));
      CK(cudaEventDestroy(e));
    } else if (m == "cudaDeviceSynchronize") {
      CK(cudaDeviceSynchronize());
    }
    took = now() - t0;
    done = true;
  });
  const double t0 = now();
  while (!done && now() - t0 < 1.0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  const bool returned = done;
  *(volatile unsigned*)ctl = 1;  // stop the persistent kernel
  t.join();
  CK(cudaDeviceSynchronize());
  const char* conns = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("beside a persistent kernel (%3d x 128, %s): %-34s conns=%-7s %s (%.4f s)\n", blocks,
              allStarted ? "started" : "NOT STARTED", m.c_str(), conns ? conns : "default",
              returned ? "returned" : "WAITED FOR IT", took);
  if (pre) CK(cudaFree(pre));
  CK(cudaFree(word));
  CK(cudaFreeHost(ctl));
  CK(cudaStreamDestroy(nic));
  CK(cudaStreamDestroy(other));
  CK(cudaStreamDestroy(blocking));
}
}  // namespace

int main(int argc, char** argv) {
  // `gin-progress-probe persistent`: only the persistent-kernel rows.
  const bool onlyPersistent = argc > 1 && std::strcmp(argv[1], "persistent") == 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no GPU\n");
    return 77;
  }
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, 0);
  int drv = 0;
  cudaDriverGetVersion(&drv);
  std::printf("%s, driver API %d\n", p.name, drv);
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  Env env;
  cuCtxGetCurrent(&env.primary);
  CUdevice d;
  cuDeviceGet(&d, 0);
  dk(cuCtxCreate(&env.side, nullptr, 0, d), "cuCtxCreate");
  dk(cuStreamCreate(&env.sideStream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  nothing<<<1, 1, 0, cudaStream_t(env.sideStream)>>>();  // loads the module in the second context
  cuStreamSynchronize(env.sideStream);
  cuCtxSetCurrent(env.primary);
  CUdevResource res, split[1], rest;
  unsigned groups = 1;
  if (dk(cuDeviceGetDevResource(d, &res, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource") &&
      dk(cuDevSmResourceSplitByCount(split, &groups, &res, &rest, 0, 8), "cuDevSmResourceSplitByCount")) {
    CUdevResourceDesc desc;
    if (dk(cuDevResourceGenerateDesc(&desc, split, 1), "cuDevResourceGenerateDesc") &&
        dk(cuGreenCtxCreate(&env.green, desc, d, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate"))
      dk(cuGreenCtxStreamCreate(&env.greenStream, env.green, CU_STREAM_NON_BLOCKING, 0), "cuGreenCtxStreamCreate");
  }
  for (const char* m : {"memcpy-h2d-other-stream", "memcpy-d2d-other-stream", "kernel-other-stream",
                        "memcpy-second-context", "kernel-second-context", "kernel-second-context-during-cudaFree",
                        "memcpy-green-context",
                        "kernel-green-context", "managed-cpu-store"}) {
    if (onlyPersistent) break;
    if (std::strstr(m, "green") && !env.greenStream) continue;
    for (int blocks : {1, 264}) tryMethod(env, m, blocks, blocks == 1 ? 32 : 1024);
  }
  if (!onlyPersistent) {
    sideLatency(env, 0, 1);
    sideLatency(env, 1, 32);
    sideLatency(env, 264, 1024);
  }
  for (const char* m : {"kernel-other-stream", "kernel-legacy-stream", "kernel-blocking-stream",
                        "two-kernels-other-stream", "cudaMemcpy-h2d", "cudaMemcpyAsync-other-stream", "cudaMemset",
                        "cudaMalloc", "cudaFree", "cudaHostAlloc+cudaFreeHost", "cudaEventSynchronize-other-stream",
                        "cudaDeviceSynchronize"})
    for (int blocks : {2, 16}) tryBesidePersistent(m, blocks);
  return 0;
}
