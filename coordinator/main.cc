// coordinator: the Trainyard daemon. Queues jobs durably in SQLite and answers jobctl.
// Exit codes: 0 after SIGINT/SIGTERM, 2 for bad options or a corrupt state database.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <csignal>

#include "coordinator/server.h"

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Trainyard coordinator: a crash-safe job queue (SQLite, WAL) behind a ZeroMQ socket.\n"
               "Submit and inspect jobs with jobctl. Worker pools are not built yet: queued jobs wait."};
  trainyard::ServerOptions o;
  app.add_option("--listen", o.listen, "ZeroMQ endpoint to bind (default tcp://127.0.0.1:5555: loopback only)");
  app.add_option("--state", o.state_path, "SQLite state database (created if missing; default trainyard.db)");
  app.add_option("--runs", o.runs_dir,
                 "folder for runs/<job id>/attempt-<n>/ (default runs); unused until worker pools exist");
  app.add_flag("--fresh", o.fresh, "set a corrupt state database aside (<state>.corrupt) and start empty");
  app.add_option("--max-message-bytes", o.max_message_bytes, "largest message accepted (default 16 MiB)")
      ->check(CLI::Range(int64_t(1024), int64_t(1) << 32));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  spdlog::set_pattern("[%H:%M:%S] %v");
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);
  try {
    trainyard::Server server(o);
    spdlog::info("coordinator listening on {} (state {})", server.endpoint(), o.state_path);
    server.Run(g_stop);
    spdlog::info("coordinator stopping; {} bad frames dropped", server.bad_frames());
    return 0;
  } catch (const trainyard::StoreError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const zmq::error_t& e) {
    std::fprintf(stderr, "error: cannot listen on %s: %s\n", o.listen.c_str(), e.what());
    return 2;
  }
}
