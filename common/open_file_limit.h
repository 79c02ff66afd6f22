// A process that holds a connection per peer (the coordinator's agents, a server's
// clients) needs a descriptor per connection, and a login's soft limit is often 1024.
#pragma once

#include <cstddef>

namespace trainyard {

// Raises this process's soft RLIMIT_NOFILE to `wanted` descriptors, or to the hard limit
// if that is lower; never lowers it. Best effort: a refusal leaves the limit as it was.
void RaiseOpenFileLimit(size_t wanted);

}  // namespace trainyard
