// The GPU AllReduce suite's kernels for int32_t and int64_t (allreduce_cases.cuh).
#include "allreduce_cases.cuh"

namespace gputest::ar {
GIN_AR_ALLOPS(int32_t);
GIN_AR_ALLOPS(int64_t);
}  // namespace gputest::ar
