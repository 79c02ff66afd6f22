#include "common/open_file_limit.h"

#include <sys/resource.h>

#include <algorithm>

namespace trainyard {

void RaiseOpenFileLimit(size_t wanted) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t target = std::min<rlim_t>(limit.rlim_max, rlim_t(wanted));
  if (limit.rlim_cur >= target) return;
  limit.rlim_cur = target;
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

}  // namespace trainyard
