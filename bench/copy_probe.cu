// gin-copy-probe: which copies of one thread wait for another thread's copy
// queued behind a spinning kernel (docs/design/progress.md, "pageable").
// Thread A queues a kernel that spins until a device flag is set (1 s at
// most), then a copy on the same stream and waits for it; 20 ms later
// thread B makes a copy of its own on another stream, then launches the
// kernel that sets the flag. "BLOCKED": A's spin ran to its limit, so B's
// copy waited for A's. Run with CUDA_DEVICE_MAX_CONNECTIONS=32 so the two
// streams do not share a hardware queue. Needs one GPU.
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
#include <cuda_runtime.h>
__device__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
__global__ void spinA(volatile int* flag, unsigned long long* waited, unsigned long long limit) {
  const unsigned long long s = now();
  while (*flag == 0 && now() - s < limit) {}
  *waited = now() - s;
}
__global__ void setB(volatile int* flag) { __threadfence_system(); *flag = 1; }
int main() {
  int* flag; unsigned long long* waited;
  cudaMalloc(&flag, 4); cudaMalloc(&waited, 8);
  const size_t n = 1 << 20;
  char *dA, *dB, *pin;
  cudaMalloc(&dA, n); cudaMalloc(&dB, n); cudaHostAlloc(&pin, n, 0);
  std::vector<char> pa(n), pb(n);
  cudaStream_t a, b;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  setB<<<1, 1, 0, b>>>(flag); spinA<<<1, 1, 0, a>>>(flag, waited, 1); cudaDeviceSynchronize();
  const char* aops[] = {"D2H pageable", "H2D pageable", "D2H pinned+sync"};
  const char* bops[] = {"none", "D2H pageable", "H2D pageable", "D2H pinned", "H2D pinned", "D2D", "memset"};
  for (int ao = 0; ao < 3; ++ao)
    for (int bo = 0; bo < 7; ++bo) {
      cudaMemset(flag, 0, 4); cudaDeviceSynchronize();
      spinA<<<1, 1, 0, a>>>(flag, waited, 1000000000ull);
      std::thread ta([&] {
        if (ao == 0) cudaMemcpyAsync(pa.data(), dA, n, cudaMemcpyDeviceToHost, a);
        if (ao == 1) cudaMemcpyAsync(dA, pa.data(), n, cudaMemcpyHostToDevice, a);
        if (ao == 2) cudaMemcpyAsync(pin, dA, n, cudaMemcpyDeviceToHost, a);
        cudaStreamSynchronize(a);
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      auto t = std::chrono::steady_clock::now();
      switch (bo) {
        case 1: cudaMemcpyAsync(pb.data(), dB, n, cudaMemcpyDeviceToHost, b); break;
        case 2: cudaMemcpyAsync(dB, pb.data(), n, cudaMemcpyHostToDevice, b); break;
        case 3: cudaMemcpyAsync(pin, dB, n, cudaMemcpyDeviceToHost, b); break;
        case 4: cudaMemcpyAsync(dB, pin, n, cudaMemcpyHostToDevice, b); break;
        case 5: cudaMemcpyAsync(dB, dA, n, cudaMemcpyDeviceToDevice, b); break;
        case 6: cudaMemsetAsync(dB, 1, n, b); break;
      }
      const double host = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
      setB<<<1, 1, 0, b>>>(flag);
      ta.join();
      cudaDeviceSynchronize();
      unsigned long long w = 0; cudaMemcpy(&w, waited, 8, cudaMemcpyDeviceToHost);
      printf("A: spin, %-16s | B: %-13s (host %8.3f ms), set: A waited %9.3f ms%s\n", aops[ao], bops[bo], host, w / 1e6,
             w > 900000000ull ? "  <-- BLOCKED" : "");
    }
}
