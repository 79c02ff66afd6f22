#include "worker/kernels/parallel_slices.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace trainyard {

void ParallelSlices(int64_t slices, int threads, const std::function<void(int64_t)>& body) {
#ifdef _OPENMP
  if (threads > 1 && slices > 1 && omp_in_parallel() == 0) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t s = 0; s < slices; ++s) body(s);
    return;
  }
#endif
  for (int64_t s = 0; s < slices; ++s) body(s);
}

bool ParallelSlicesAreParallel() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

}  // namespace trainyard
