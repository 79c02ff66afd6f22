// The loops behind gemv.h, torch-free so they compile with their own flags (-O3, and one
// clone per vector width chosen at load time). x is [rows, k] row-major throughout.
#pragma once

#include <cstdint>

namespace trainyard::gemv {

// out[m, :] += x[m, k0:k1] @ w[k0:k1, :] for every m < rows; w is [k, n] row-major,
// out is [rows, n]. Reads rows k0..k1 of w once, front to back.
void AccumulateWeightRows(const float* x, int64_t rows, int64_t k, const float* w, int64_t k0, int64_t k1, int64_t n,
                          float* out);

// out[m, j] = dot(x[m, :], w[j, :]) for j in [j0, j1) and every m < rows; w is [n, k]
// row-major, out is [rows, n]. Reads rows j0..j1 of w once, front to back.
void DotWeightRows(const float* x, int64_t rows, int64_t k, const float* w, int64_t j0, int64_t j1, int64_t n,
                   float* out);

}  // namespace trainyard::gemv
