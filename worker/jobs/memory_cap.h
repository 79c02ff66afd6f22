// Work run under a cap on the process's address space, as a benchmark cell runs under
// `benchmark.memory_cap_mb`: what needs more than the cap fails to allocate, and that
// failure is the cell's result ("OOM"), not the job's end.
//
// Two things keep one cell's failure from reaching the cells after it:
//   - CPU blocks the cache (cpu_block_cache.h) kept go back before the cap is set, and
//     again after a failure, so the cap counts only the cell's own memory;
//   - the work runs on a thread of its own. oneDNN builds its JIT kernels with Xbyak in
//     no-exception mode, which keeps a failed code-buffer allocation as a thread-local
//     error that nothing clears: on the thread that saw it, every later kernel build
//     fails too ("could not create a primitive"), so every later cell would be OOM,
//     however small.
#pragma once

#include <exception>
#include <functional>

namespace trainyard {

// Runs `work` with the address space capped `headroom_mb` above what the process uses
// now (no cap when headroom_mb <= 0, or when the cap cannot be set), on a thread of its
// own that knows the job's intra-op thread count, and waits for it. Throws what `work`
// threw. `*capped` says whether the cap was in force.
void RunCapped(double headroom_mb, const std::function<void()>& work, bool* capped);

// Whether `e` is an allocation failure. `capped`: the work ran under RunCapped's cap;
// oneDNN reports a failed allocation of its own (JIT code, a scratchpad) only as a
// primitive it could not create, and under the cap that is the cap speaking.
bool IsOutOfMemory(const std::exception& e, bool capped);

// A "Vm..." line of /proc/self/status ("VmSize:", "VmRSS:", "VmHWM:"), in MB.
double ProcStatusMb(const char* key);

}  // namespace trainyard
