// The GPU AllReduce suite's kernels for float and gin::coll::Half (allreduce_cases.cuh).
#include "allreduce_cases.cuh"

namespace gputest::ar {
GIN_AR_ALLOPS(float);
GIN_AR_ALLOPS(gin::coll::Half);
}  // namespace gputest::ar
