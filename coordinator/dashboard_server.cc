#include "coordinator/dashboard_server.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <zmq_addon.hpp>

#include "common/bounded_json.h"
#include "coordinator/embedded_files.h"
#include "coordinator/server.h"

namespace trainyard {
namespace {

HttpResponse JsonError(int status, const std::string& message) {
  HttpResponse r;
  r.status = status;
  r.body = DumpJsonForPeer({{"error", message}});
  return r;
}

std::string ContentTypeOf(std::string_view name) {
  auto ends_with = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  if (ends_with(".html")) return "text/html; charset=utf-8";
  if (ends_with(".js")) return "text/javascript; charset=utf-8";
  if (ends_with(".css")) return "text/css; charset=utf-8";
  return "application/octet-stream";
}

// GET /api: what the pages read, for anyone scripting against the dashboard.
const nlohmann::json& ApiIndex() {
  static const nlohmann::json index = {
      {"GET /api/jobs?limit=N&before=ID&state=S,S&user=U",
       "one page of jobs, newest first: at most limit (1 to 1000, default 200), only those older than job "
       "before, in the states named, of that owner. Each job: id, name, user, state, priority, ranks, device, "
       "attempts, max_restarts, reason, waiting, submitted_at (seconds since the epoch), epochs (the latest "
       "epoch reported) and ms_per_step (its mean step time). With total (the jobs the filters match on "
       "every page) and next (the next page's URL, null on the last); 400 for a bad field"},
      {"GET /api/jobs/<id>",
       "one job as above, plus attempt_list (attempt, placement, outcome, started_at, ended_at), events "
       "(at, text), epochs (each epochs.csv row as {column: value}, with its attempt), breakdown (per epoch: "
       "parts with min/median/max ms across ranks, ranks: each rank's ms per part in step_parts order, "
       "slowest_rank, slowest_ms_per_step) and heatmap (the URL of a benchmark job's latency heatmap, or "
       "null); 404 for an unknown job"},
      {"GET /api/jobs/<id>/heatmap.svg", "a benchmark job's latency heatmap (batch x sequence length)"},
      {"GET /api/workers",
       "every registered rank: world, rank, world_size, host, device, pid, seconds_since_heartbeat, alive, "
       "job, attempt, last_log_line; with heartbeat_s and lost_after_s"},
      {"GET /metrics",
       "Prometheus text format: jobs by state, queue depth, submit-to-running latency "
       "histogram, attempts by outcome, worker liveness, running jobs' ms/step and data wait"}};
  return index;
}

}  // namespace

void ParseHttpAddress(const std::string& text, DashboardOptions* options) {
  const size_t colon = text.rfind(':');
  const std::string host = colon == std::string::npos ? "127.0.0.1" : text.substr(0, colon);
  const std::string port = colon == std::string::npos ? text : text.substr(colon + 1);
  const bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || std::stoi(port) > 65535)
    throw std::invalid_argument("--http " + text + ": expected PORT or HOST:PORT, with a port from 0 to 65535");
  if (host.empty()) throw std::invalid_argument("--http " + text + ": empty host (write 127.0.0.1:" + port + ")");
  options->host = host;
  options->port = std::stoi(port);
}

DashboardServer::DashboardServer(zmq::context_t& context, const DashboardOptions& options)
    : context_(context), chartjs_path_(options.chartjs_path) {
  std::ifstream chartjs(options.chartjs_path);
  if (chartjs) {
    std::stringstream text;
    text << chartjs.rdbuf();
    chartjs_ = text.str();
  } else {
    spdlog::warn("dashboard: cannot read Chart.js at {} (Debian: apt install libjs-chart.js); pages show no charts",
                 options.chartjs_path);
  }
  HttpServerOptions http;
  http.host = options.host;
  http.port = options.port;
  http.max_body_bytes = size_t(64) * 1024;  // GETs carry no body worth reading
  http.max_connections = 1024;              // sockets; the loop's answers go through 8 handler threads
  http.handler_threads = 8;
  http.log_name = "dashboard";
  http_ = std::make_unique<HttpServer>(
      http, [this](const HttpRequest& request, const std::function<bool()>&) { return Handle(request); });
  http_->Start();
}

DashboardServer::~DashboardServer() { http_->Stop(); }

HttpResponse DashboardServer::Handle(const HttpRequest& request) {
  if (request.method != "GET") {
    HttpResponse r = JsonError(405, request.method + " " + request.target + ": the dashboard is read-only (GET only)");
    r.headers.push_back({"Allow", "GET"});
    return r;
  }
  const std::string path = request.target.substr(0, request.target.find('?'));
  if (path == "/api" || path == "/api/") {
    HttpResponse r;
    r.body = ApiIndex().dump(2);
    return r;
  }
  if (path.rfind("/api/", 0) == 0 || path == "/metrics") return AskLoop(request.target);
  return StaticFile(path);
}

HttpResponse DashboardServer::StaticFile(const std::string& path) const {
  std::string name;
  if (path == "/")
    name = "index.html";
  else if (path.rfind("/jobs/", 0) == 0)
    name = "job.html";  // the page asks the API, which 404s unknown jobs
  else if (path == "/static/chart.js") {
    if (chartjs_.empty()) return JsonError(404, "Chart.js is not installed here (" + chartjs_path_ + ")");
    HttpResponse r;
    r.content_type = "text/javascript; charset=utf-8";
    r.body = chartjs_;
    return r;
  } else if (path.rfind("/static/", 0) == 0) {
    name = path.substr(8);
  }
  for (const EmbeddedFile& file : EmbeddedFiles()) {
    if (name.empty() || file.name != name) continue;
    HttpResponse r;
    r.content_type = ContentTypeOf(file.name);
    r.body = std::string(file.text);
    r.headers.push_back({"Cache-Control", "no-cache"});
    return r;
  }
  return JsonError(404, "no page " + path + " (the dashboard has /, /jobs/<id>, /api and /metrics)");
}

// One DEALER per request: ZeroMQ sockets belong to one thread, and connection threads
// come and go. The loop's ROUTER sees [identity][target] and answers
// [identity][status][content type][body].
HttpResponse DashboardServer::AskLoop(const std::string& target) {
  zmq::socket_t socket(context_, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.connect(Server::kWebEndpoint);
  socket.send(zmq::buffer(target), zmq::send_flags::none);
  zmq::pollitem_t item{static_cast<void*>(socket), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, std::chrono::milliseconds(kQueryTimeout)) <= 0)
    return JsonError(503, "the coordinator did not answer within " + std::to_string(kQueryTimeout.count()) + " s");
  std::vector<zmq::message_t> frames;
  if (!zmq::recv_multipart(socket, std::back_inserter(frames)) || frames.size() != 3)
    return JsonError(500, "a malformed answer from the coordinator's loop");
  HttpResponse r;
  r.status = std::stoi(frames[0].to_string());
  r.content_type = frames[1].to_string();
  r.body = frames[2].to_string();
  r.headers.push_back({"Cache-Control", "no-store"});
  return r;
}

}  // namespace trainyard
