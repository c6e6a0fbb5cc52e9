// The GPU AllReduce suite's kernels for gin::coll::BFloat16 and double (allreduce_cases.cuh).
#include "allreduce_cases.cuh"

namespace gputest::ar {
GIN_AR_ALLOPS(gin::coll::BFloat16);
GIN_AR_ALLOPS(double);
}  // namespace gputest::ar
