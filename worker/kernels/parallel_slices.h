// Work split into slices and run on libtorch's intra-op threads.
//
// Why not at::parallel_for: with libtorch's OpenMP backend, at::parallel_for is an inline
// template whose `#pragma omp parallel` is compiled into the caller. Our translation
// units are not built with -fopenmp (libtorch's headers do not ask for it), so there it
// silently runs on one thread. This file is compiled with -fopenmp and linked to the
// libgomp that libtorch loads (CMakeLists.txt), so these threads are torch's own pool.
#pragma once

#include <cstdint>
#include <functional>

namespace trainyard {

// Calls body(s) for every s in [0, slices), spread over up to `threads` threads; inline
// when threads <= 1 or when already inside a parallel region. body must not throw.
void ParallelSlices(int64_t slices, int threads, const std::function<void(int64_t)>& body);

// Whether ParallelSlices really runs on several threads in this build.
bool ParallelSlicesAreParallel();

}  // namespace trainyard
