// gin/core/config.hpp — compilation-target macros shared by every gin header.
//
// GIN_HD marks a function that compiles as host and as device code; under a
// plain C++ compiler it expands to nothing, which is what lets the whole device
// API run on CPU ranks. GIN_DEVICE_CODE is 1 only in nvcc's device pass.
#pragma once

#include <cstddef>
#include <cstdint>

#define GIN_VERSION_MAJOR 0
#define GIN_VERSION_MINOR 1
#define GIN_VERSION_PATCH 0

#if defined(__CUDACC__)
#define GIN_HD __host__ __device__
#define GIN_DEVICE __device__
#define GIN_INLINE __forceinline__
#define GIN_NOINLINE __noinline__
#else
#define GIN_HD
#define GIN_DEVICE
#define GIN_INLINE inline
#define GIN_NOINLINE __attribute__((noinline))
#endif

// Loop unrolling hint for nvcc's device pass; host compilers unroll on their own.
#if defined(__CUDA_ARCH__)
#define GIN_UNROLL _Pragma("unroll")
#else
#define GIN_UNROLL
#endif

#if defined(__CUDA_ARCH__)
#define GIN_DEVICE_CODE 1
#else
#define GIN_DEVICE_CODE 0
#endif

// GIN_WITH_CUDA: host code may call the CUDA runtime (cudaMalloc, IPC handles).
// It defaults to "the runtime's header is on the include path"; define it to 0 to
// build a CPU-only program on a machine that has the toolkit.
#ifndef GIN_WITH_CUDA
#if defined(__CUDACC__) || __has_include(<cuda_runtime_api.h>)
#define GIN_WITH_CUDA 1
#else
#define GIN_WITH_CUDA 0
#endif
#endif

namespace gin {
inline constexpr int kVersionMajor = GIN_VERSION_MAJOR;
inline constexpr int kVersionMinor = GIN_VERSION_MINOR;
inline constexpr int kVersionPatch = GIN_VERSION_PATCH;
}  // namespace gin
