#include "worker/jobs/memory_cap.h"

#include <ATen/Parallel.h>
#include <sys/resource.h>

#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "worker/kernels/cpu_block_cache.h"

namespace trainyard {
namespace {

// Caps the process's address space `headroom_mb` above what it uses now, for the
// lifetime of the object.
class AddressSpaceCap {
 public:
  explicit AddressSpaceCap(double headroom_mb) {
    if (headroom_mb <= 0) return;
    getrlimit(RLIMIT_AS, &previous_);
    rlimit cap = previous_;
    cap.rlim_cur = static_cast<rlim_t>((ProcStatusMb("VmSize:") + headroom_mb) * 1048576.0);
    active_ = setrlimit(RLIMIT_AS, &cap) == 0;
  }
  ~AddressSpaceCap() {
    if (active_) setrlimit(RLIMIT_AS, &previous_);
  }
  AddressSpaceCap(const AddressSpaceCap&) = delete;
  AddressSpaceCap& operator=(const AddressSpaceCap&) = delete;
  bool active() const { return active_; }

 private:
  rlimit previous_{};
  bool active_ = false;
};

void DropKeptBlocks() {
  if (CpuBlockCache* cache = CpuBlockCache::Installed()) cache->Drop();
}

}  // namespace

double ProcStatusMb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(std::strlen(key) + 1)) / 1024.0;
  return 0.0;
}

void RunCapped(double headroom_mb, const std::function<void()>& work, bool* capped) {
  *capped = false;
  std::exception_ptr failure;
  std::thread thread([&] {
    at::init_num_threads();  // runtime.threads for this thread's parallel regions too
    try {
      DropKeptBlocks();
      AddressSpaceCap cap(headroom_mb);
      *capped = cap.active();
      work();
    } catch (...) {
      failure = std::current_exception();
    }
  });
  thread.join();
  if (!failure) return;
  DropKeptBlocks();  // what the failed work held goes back now, not only before the next
  std::rethrow_exception(failure);
}

bool IsOutOfMemory(const std::exception& e, bool capped) {
  const std::string what = e.what();
  return what.find("out of memory") != std::string::npos || what.find("can't allocate memory") != std::string::npos ||
         what.find("std::bad_alloc") != std::string::npos ||
         (capped && what.find("could not create a primitive") != std::string::npos);
}

}  // namespace trainyard
