#include "common/process_exit.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace trainyard {

void ExitSkippingStaticDestructors(int code) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  std::exit(code);
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  std::exit(code);
#endif
#endif
  spdlog::shutdown();
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace trainyard
