// serve_frontend: the torch-free front end of a `kind: serve` job (why a process of its
// own: worker/serve/model_link.h). The worker starts it; it is not meant to be run by
// hand. It serves KServe V2 over HTTP and gRPC and /metrics, batches, and hands the
// batches to the model process over the link. It ends on SIGTERM/SIGINT or when the
// worker that started it goes. Exit codes: 0 stopped, 2 bad input (the job file, a port
// that cannot be bound), 1 anything else.
#include <absl/synchronization/mutex.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/atomic_file.h"
#include "common/http/http_server.h"
#include "common/log.h"
#include "common/open_file_limit.h"
#include "common/spec/job_spec.h"
#include "worker/serve/grpc_gate.h"
#include "worker/serve/grpc_service.h"
#include "worker/serve/kserve_http.h"
#include "worker/serve/server_core.h"

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

// Connections cost a socket each, never a thread (common/http/http_server.h); requests
// being answered hold a handler thread while their batch runs. serve.max_queue bounds
// the requests queued for batches, so as many may wait for a handler, and up to
// kMaxHandlerThreads of them run at once.
constexpr int kMaxHandlerThreads = 1024;

trainyard::HttpServerOptions HttpOptions(const trainyard::ServeSpec& serve, int port, size_t max_body,
                                         const char* log_name) {
  trainyard::HttpServerOptions http;
  http.host = serve.host;
  http.port = port;
  http.max_body_bytes = max_body;
  http.max_connections = size_t(serve.max_connections);
  http.log_name = log_name;
  http.idle_timeout_s = serve.keep_alive_s;
  http.request_timeout_s = serve.request_timeout_s;
  http.handler_threads = size_t(std::clamp(serve.max_queue, 16, kMaxHandlerThreads));
  http.max_waiting_requests = size_t(std::max(16, serve.max_queue));
  return http;
}

// A gRPC connection silent this long may be closed to make room for a new one.
constexpr double kMinIdleToEvictS = 1;

trainyard::GrpcServerLimits GrpcLimits(const trainyard::ServeSpec& serve, size_t max_body) {
  trainyard::GrpcServerLimits limits;
  limits.max_message_bytes = int(max_body);
  limits.idle_s = serve.keep_alive_s;
  limits.max_threads = std::clamp(serve.max_queue, 16, kMaxHandlerThreads);
  return limits;
}

// Every connection is a descriptor, a gRPC one two (grpc_gate.h): the limit is raised so
// that both listeners can hold their most at once and HTTP keeps its own whatever gRPC's
// clients do.
void RaiseOpenFileLimitFor(const trainyard::ServeSpec& serve) {
  trainyard::RaiseOpenFileLimit(size_t(2) * serve.max_connections + size_t(2) * serve.grpc_max_connections + 1024);
}

struct Options {
  std::string job_file, source, base_dir, link, endpoints_file;
  int parent = 0;
  int http_port = -1, grpc_port = -1, metrics_port = -1;
};

int Serve(const Options& o) {
  // With --base-dir, the worker's copy of the job as it ran (named in messages as
  // --source); without, a job file of one's own.
  trainyard::JobSpec spec = o.base_dir.empty()
                                ? trainyard::LoadJobSpec(o.job_file)
                                : trainyard::ParseJobSpec(trainyard::ReadJobFile(o.job_file),
                                                          o.source.empty() ? o.job_file : o.source, o.base_dir);
  if (spec.kind != trainyard::JobKind::kServe) throw trainyard::SpecError(o.job_file + ": not a kind: serve job");
  if (o.http_port >= 0) spec.serve.http_port = o.http_port;
  if (o.grpc_port >= 0) spec.serve.grpc_port = o.grpc_port;
  if (o.metrics_port >= 0) spec.serve.metrics_port = o.metrics_port;
  const std::string host = spec.serve.host;
  const size_t max_body = size_t(spec.serve.max_body_mb) << 20;
  RaiseOpenFileLimitFor(spec.serve);

  trainyard::ServerCore core(spec.serve, o.link);
  trainyard::KserveHttp kserve(&core);
  trainyard::HttpServerOptions http_options = HttpOptions(spec.serve, spec.serve.http_port, max_body, "serve");
  http_options.body_limit_setting = "serve.max_body_mb";
  trainyard::HttpServer http(http_options, [&](const trainyard::HttpRequest& r, const std::function<bool()>& gone) {
    return kserve.Handle(r, gone);
  });
  trainyard::HttpServerOptions metrics_options =
      HttpOptions(spec.serve, spec.serve.metrics_port, 1 << 16, "serve metrics");
  metrics_options.handler_threads = 4;
  metrics_options.max_waiting_requests = 64;
  trainyard::HttpServer metrics(metrics_options, [&](const trainyard::HttpRequest& r, const std::function<bool()>&) {
    return kserve.HandleMetrics(r);
  });
  trainyard::KserveGrpc grpc_service(&core);
  auto grpc = trainyard::StartGrpcServer(&grpc_service, GrpcLimits(spec.serve, max_body));
  trainyard::GrpcConnectionGate grpc_gate(
      grpc.get(), {host, spec.serve.grpc_port, size_t(spec.serve.grpc_max_connections), kMinIdleToEvictS});
  const int grpc_port = grpc_gate.port();
  core.Start();
  http.Start();
  metrics.Start();
  grpc_gate.Start();
  const nlohmann::json endpoints = {{"http", "http://" + host + ":" + std::to_string(http.port())},
                                    {"grpc", host + ":" + std::to_string(grpc_port)},
                                    {"metrics", "http://" + host + ":" + std::to_string(metrics.port()) + "/metrics"},
                                    {"http_port", http.port()},
                                    {"grpc_port", grpc_port},
                                    {"metrics_port", metrics.port()}};
  if (!o.endpoints_file.empty()) trainyard::WriteFileAtomically(o.endpoints_file, endpoints.dump(2) + "\n");
  trainyard::LogInfo("serve: KServe V2 on " + endpoints["http"].get<std::string>() + " (HTTP) and " +
                     endpoints["grpc"].get<std::string>() + " (gRPC); metrics on " +
                     endpoints["metrics"].get<std::string>());
  while (!g_stop && ::getppid() == o.parent) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  trainyard::LogInfo("serve: front end stopping");
  grpc_gate.Stop();
  grpc->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  http.Stop();
  metrics.Stop();
  core.Stop();
  return 0;
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"Trainyard's serving front end, started by `worker JOB.yaml` for kind: serve jobs."};
  Options o;
  app.add_option("job", o.job_file, "the serve job's YAML file")->required();
  app.add_option("--base-dir", o.base_dir, "resolve the job's relative paths against this folder (the job's own)");
  app.add_option("--source", o.source, "the job file's name in messages");
  app.add_option("--link", o.link, "the model process's endpoint (ipc://...)")->required();
  app.add_option("--parent", o.parent, "the model process's pid: the front end ends when it goes")->required();
  app.add_option("--endpoints-file", o.endpoints_file, "write the bound endpoints here as JSON");
  app.add_option("--http-port", o.http_port, "override serve.http_port");
  app.add_option("--grpc-port", o.grpc_port, "override serve.grpc_port");
  app.add_option("--metrics-port", o.metrics_port, "override serve.metrics_port");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Abseil's Mutex (under gRPC's calls) tracks lock order for deadlock reports unless
  // told not to; with thousands of calls in flight that bookkeeping was a large share
  // of the front end's time, behind one global lock.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != o.parent) return 1;
  struct sigaction action {};
  action.sa_handler = OnSignal;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  try {
    return Serve(o);
  } catch (const trainyard::SpecError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: serve: %s\n", e.what());
    return std::string(e.what()).find("listen") != std::string::npos ? 2 : 1;
  }
}

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: serve: %s\n", e.what());
    return 1;
  }
}
