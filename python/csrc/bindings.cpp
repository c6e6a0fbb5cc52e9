// python/csrc/bindings.cpp — gin_ep._C: the runtime (runtime.hpp) with
// tensors in and out. Returned device memory is made by PyTorch's allocator
// on the current device (Array::keep owns the tensor), so the tensors the
// module returns are ordinary PyTorch tensors. Calls release the GIL while
// they wait for other ranks.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "runtime.hpp"

namespace {

using gin_ep_rt::Array;

// An Array as a tensor of `type` and `shape` over its memory (which may
// start inside the bytes tensor that owns it: several arrays can share
// one), keeping that owner alive.
torch::Tensor tensorOf(const Array& a, torch::ScalarType type, std::vector<int64_t> shape) {
  const torch::Tensor& bytes = *static_cast<const torch::Tensor*>(a.keep.get());
  std::shared_ptr<void> keep = a.keep;
  return torch::from_blob(a.ptr, shape, [keep](void*) mutable { keep.reset(); }, bytes.options().dtype(type));
}

void need(const torch::Tensor& t, torch::ScalarType type, int64_t dims, const char* what) {
  if (!t.is_cuda() || t.scalar_type() != type || t.dim() != dims || !t.is_contiguous())
    throw std::invalid_argument(std::string("gin_ep: ") + what + " must be a contiguous " + std::to_string(dims) +
                                "-d CUDA tensor of " + std::string(c10::toString(type)));
}

// Top-k indices as low-latency calls take them: a contiguous 2-d CUDA
// tensor of int64 (as torch.topk makes them; returns true) or int32.
bool needIndices(const torch::Tensor& idx) {
  const bool wide = idx.scalar_type() == torch::kInt64;
  if (!wide && idx.scalar_type() != torch::kInt32)
    throw std::invalid_argument(std::string("gin_ep: topk_idx must be int64 or int32, not ") +
                                c10::toString(idx.scalar_type()));
  need(idx, idx.scalar_type(), 2, "topk_idx");
  return wide;
}

class Runtime {
 public:
  Runtime(const py::bytes& id, int rank, int nRanks, int device, bool lowLatency, int channels)
      : device_(device), rt_(std::string(id), rank, nRanks, device, lowLatency, channels) {
    rt_.setAllocator([device](size_t bytes) {
      auto t = std::make_shared<torch::Tensor>(
          torch::empty({int64_t(bytes)}, torch::dtype(torch::kUInt8).device(torch::kCUDA, device)));
      return Array{t->data_ptr(), bytes, t};
    });
  }

  std::string transports() const { return rt_.transports(); }
  void synchronize() {
    py::gil_scoped_release nogil;
    rt_.synchronize();
  }

  // Returns (x, topk_idx, topk_weights, tokens_per_expert, rank_prefix, src_rank, src_token, handle); x is
  // (e4m3 [N][H], scales [N][H / 128]) when scales are given (x then float8_e4m3fn).
  py::tuple dispatch(uint64_t stream, const torch::Tensor& x, const std::optional<torch::Tensor>& scales,
                     const torch::Tensor& idx, const torch::Tensor& w, int experts, int alignment, int worst) {
    need(x, scales ? torch::kFloat8_e4m3fn : torch::kBFloat16, 2, "x");
    const bool idx64 = needIndices(idx);
    need(w, torch::kFloat32, 2, "topk_weights");
    const int T = int(x.size(0)), H = int(x.size(1)), K = int(idx.size(1));
    if (idx.size(0) != T || w.sizes() != idx.sizes())
      throw std::invalid_argument("gin_ep: x, topk_idx and topk_weights must have the same number of tokens");
    if (scales) {
      need(*scales, torch::kFloat32, 2, "x's scales");
      if (H % 128 != 0 || scales->size(0) != T || scales->size(1) != H / 128)
        throw std::invalid_argument("gin_ep: FP8 x needs a hidden size that is a multiple of 128 and scales of "
                                    "tokens x hidden / 128 floats");
    }
    gin_ep_rt::Dispatched d;
    {
      py::gil_scoped_release nogil;
      d = rt_.dispatch(stream, x.data_ptr(), scales ? scales->data_ptr<float>() : nullptr, idx.data_ptr(), idx64,
                       w.data_ptr<float>(), T, H, experts, K, alignment, worst);
    }
    return out(d, H, K, scales.has_value());
  }

  // x bf16, or e4m3 with its scales (the rows then come back as the pair).
  py::tuple cachedDispatch(uint64_t stream, const torch::Tensor& x, const std::optional<torch::Tensor>& scales,
                           const py::capsule& handle) {
    need(x, scales ? torch::kFloat8_e4m3fn : torch::kBFloat16, 2, "x");
    const int H = int(x.size(1));
    if (scales) {
      need(*scales, torch::kFloat32, 2, "x's scales");
      if (H % 128 != 0 || scales->size(0) != x.size(0) || scales->size(1) != H / 128)
        throw std::invalid_argument("gin_ep: FP8 x needs a hidden size that is a multiple of 128 and scales of "
                                    "tokens x hidden / 128 floats");
    }
    gin_ep_rt::Dispatched d;
    {
      py::gil_scoped_release nogil;
      d = rt_.cachedDispatch(stream, x.data_ptr(), scales ? scales->data_ptr<float>() : nullptr, handleOf(handle));
    }
    return out(d, H, 0, scales.has_value());
  }

  torch::Tensor combine(uint64_t stream, const torch::Tensor& y, const py::capsule& handle,
                        const std::optional<torch::Tensor>& b0, const std::optional<torch::Tensor>& b1) {
    need(y, torch::kBFloat16, 2, "x");
    for (const auto* b : {&b0, &b1})
      if (b->has_value()) need(**b, torch::kBFloat16, 2, "bias");
    Array a;
    {
      py::gil_scoped_release nogil;
      a = rt_.combine(stream, y.data_ptr(), handleOf(handle), b0 ? b0->data_ptr() : nullptr,
                      b1 ? b1->data_ptr() : nullptr);
    }
    return tensorOf(a, torch::kBFloat16, {int64_t(a.count) / y.size(1), y.size(1)});
  }

  // Returns (x, count, range, src_token, handle); with useFp8 x is (e4m3 [L][R * Tmax][H], scales
  // [L][R * Tmax][H / 128] over memory laid out [L][H / 128][R * Tmax], as DeepEP's).
  // (The top-k weights are the combine's: a dispatch does not take them.)
  py::tuple lowLatencyDispatch(uint64_t stream, const torch::Tensor& x, const torch::Tensor& idx, int maxTokens,
                               int experts, int ranks, bool useFp8, bool defer) {
    need(x, torch::kBFloat16, 2, "x");
    const bool idx64 = needIndices(idx);
    const int T = int(x.size(0)), H = int(x.size(1)), K = int(idx.size(1));
    if (idx.size(0) != T) throw std::invalid_argument("gin_ep: x and topk_idx must have the same number of tokens");
    gin_ep_rt::LlDispatched d;
    {
      py::gil_scoped_release nogil;
      d = rt_.lowLatencyDispatch(stream, x.data_ptr(), idx.data_ptr(), idx64, T, maxTokens, H, experts, K, useFp8,
                                 defer);
    }
    const int64_t L = experts / ranks, rows = int64_t(ranks) * maxTokens;
    py::object recv = useFp8 ? py::object(py::make_tuple(
                                   tensorOf(d.x, torch::kFloat8_e4m3fn, {L, rows, H}),
                                   tensorOf(d.xScales, torch::kFloat32, {L, H / 128, rows}).transpose(1, 2)))
                             : py::object(py::cast(tensorOf(d.x, torch::kBFloat16, {L, rows, H})));
    return py::make_tuple(recv, tensorOf(d.count, torch::kInt32, {L}),
                          tensorOf(d.range, torch::kInt64, {L, ranks}), tensorOf(d.srcToken, torch::kInt32, {L, rows}),
                          capsuleOf(d.handle));
  }

  torch::Tensor lowLatencyCombine(uint64_t stream, const torch::Tensor& y, const torch::Tensor& idx,
                                  const torch::Tensor& w, const py::capsule& handle, bool defer) {
    need(y, torch::kBFloat16, 3, "x");
    const bool idx64 = needIndices(idx);
    need(w, torch::kFloat32, 2, "topk_weights");
    Array a;
    {
      py::gil_scoped_release nogil;
      a = rt_.lowLatencyCombine(stream, y.data_ptr(), idx.data_ptr(), idx64, w.data_ptr<float>(), handleOf(handle),
                                defer);
    }
    return tensorOf(a, torch::kBFloat16, {int64_t(a.count) / y.size(2), y.size(2)});
  }

  // The zero-copy combine buffer as an [L][rows][H] bf16 tensor over the
  // buffer's own memory (no owner: the buffer keeps it).
  torch::Tensor lowLatencyCombineBuffer(const py::capsule& handle, int64_t L, int64_t rows, int64_t H) {
    const Array a = rt_.lowLatencyCombineBuffer(handleOf(handle));
    if (L < 1 || rows < 1 || H < 1 || size_t(L * rows * H) != a.count)
      throw std::invalid_argument("gin_ep: the combine buffer holds " + std::to_string(a.count) +
                                  " values, not the handle's " + std::to_string(L) + " x " + std::to_string(rows) +
                                  " x " + std::to_string(H));
    return torch::from_blob(a.ptr, {L, rows, H}, torch::dtype(torch::kBFloat16).device(torch::kCUDA, device_));
  }

  // A receive hook (return_recv_hook): the rest of the last deferred low-latency call.
  void receive(uint64_t stream) {
    py::gil_scoped_release nogil;
    rt_.receive(stream);
  }

 private:
  int device_;
  gin_ep_rt::Runtime rt_;

  // A gin handle travels in Python as a capsule that owns a reference.
  static py::capsule capsuleOf(const std::shared_ptr<void>& h) {
    return py::capsule(new std::shared_ptr<void>(h), "gin_ep.handle",
                       [](PyObject* o) { delete static_cast<std::shared_ptr<void>*>(PyCapsule_GetPointer(o, "gin_ep.handle")); });
  }
  static std::shared_ptr<void> handleOf(const py::capsule& c) {
    if (std::string(c.name()) != "gin_ep.handle")
      throw std::invalid_argument("gin_ep: the handle's last element is not a gin_ep handle");
    return *static_cast<std::shared_ptr<void>*>(c.get_pointer());
  }

  py::tuple out(const gin_ep_rt::Dispatched& d, int H, int K, bool fp8 = false) {
    const int64_t N = int64_t(d.srcRank.count);
    const int64_t R = int64_t(std::sqrt(double(d.rankPrefix.count)) + 0.5);
    const torch::Tensor prefix = tensorOf(d.rankPrefix, torch::kInt32, {R, R});  // made on the GPU
    py::object idx = py::none(), w = py::none(), perExpert = py::none();
    if (K > 0) {
      idx = py::cast(tensorOf(d.topkIdx, d.idx64 ? torch::kInt64 : torch::kInt32, {N, K}));
      w = py::cast(tensorOf(d.topkWeights, torch::kFloat32, {N, K}));
      perExpert = py::cast(d.tokensPerExpert);
    }
    py::object x = fp8 ? py::object(py::make_tuple(tensorOf(d.x, torch::kFloat8_e4m3fn, {N, H}),
                                                   tensorOf(d.xScales, torch::kFloat32, {N, H / 128})))
                       : py::object(py::cast(tensorOf(d.x, torch::kBFloat16, {N, H})));
    return py::make_tuple(x, idx, w, perExpert, prefix,
                          tensorOf(d.srcRank, torch::kInt32, {N}), tensorOf(d.srcToken, torch::kInt32, {N}),
                          capsuleOf(d.handle));
  }
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "gin_ep: gin's expert-parallel dispatch and combine (the runtime under gin_ep.Buffer)";
  m.def("unique_id", [] { return py::bytes(gin_ep_rt::Runtime::uniqueId()); });
  py::class_<Runtime>(m, "Runtime")
      .def(py::init<const py::bytes&, int, int, int, bool, int>())
      .def("transports", &Runtime::transports)
      .def("synchronize", &Runtime::synchronize)
      .def("dispatch", &Runtime::dispatch)
      .def("cached_dispatch", &Runtime::cachedDispatch)
      .def("combine", &Runtime::combine)
      .def("low_latency_dispatch", &Runtime::lowLatencyDispatch)
      .def("low_latency_combine", &Runtime::lowLatencyCombine)
      .def("low_latency_combine_buffer", &Runtime::lowLatencyCombineBuffer)
      .def("receive", &Runtime::receive);
}
