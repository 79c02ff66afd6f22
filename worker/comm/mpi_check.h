// TY_MPI_CHECK(call): throws std::runtime_error with file:line, the call and MPI's own
// error text when an MPI call does not return MPI_SUCCESS.
#pragma once

#include <mpi.h>

#include <stdexcept>
#include <string>

namespace trainyard {

inline void ThrowMpiError(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + call +
                           " failed: " + std::string(text, static_cast<size_t>(length)));
}

}  // namespace trainyard

#define TY_MPI_CHECK(call)                                                                                \
  do {                                                                                                    \
    int ty_mpi_code_ = (call);                                                                            \
    if (ty_mpi_code_ != MPI_SUCCESS) ::trainyard::ThrowMpiError(ty_mpi_code_, #call, __FILE__, __LINE__); \
  } while (0)
