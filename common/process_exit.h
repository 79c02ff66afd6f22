// Ending a process whose work is done.
#pragma once

namespace trainyard {

// Flushes the logs and stdio, then exits with `code` without running static destructors.
// A process linked with libtorch spends about 0.3 s of its exit unregistering libtorch's
// operators one by one: a third of `worker --help` on two cores, paid by every rank of
// every job. The caller has finished with everything it wrote; only static objects are
// skipped, and none of ours holds unwritten data. Sanitized builds exit normally, so
// LeakSanitizer still runs.
[[noreturn]] void ExitSkippingStaticDestructors(int code);

}  // namespace trainyard
