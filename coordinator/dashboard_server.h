// The coordinator's web dashboard and Prometheus endpoint over HTTP (--http): two pages
// (the jobs and workers, and one job's curves, per-rank step breakdown, heatmap,
// attempts and events), Chart.js read from Debian's libjs-chart.js, and the read-only
// JSON API the pages poll. GET /api lists the API. Pages and scripts are served from
// this process; API and /metrics requests are queries to the coordinator's loop (Note
// [Dashboard queries] in server.h), answered within kQueryTimeout or with 503.
//
// Nothing here changes state: every method but GET gets 405. The dashboard has
// no authentication, so it listens on loopback unless told otherwise.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <zmq.hpp>

#include "common/http/http_server.h"

namespace trainyard {

struct DashboardOptions {
  std::string host = "127.0.0.1";
  int port = 8265;
  std::string chartjs_path = "/usr/share/javascript/chart.js/chart.min.js";
};

class DashboardServer {
 public:
  static constexpr std::chrono::seconds kQueryTimeout{10};

  // Binds at once (std::runtime_error if it cannot) and starts serving; `context` is the
  // coordinator's, where Server::kWebEndpoint is bound. A missing Chart.js is a warning:
  // the pages then show their tables without charts.
  DashboardServer(zmq::context_t& context, const DashboardOptions& options);
  ~DashboardServer();
  int port() const { return http_->port(); }

 private:
  HttpResponse Handle(const HttpRequest& request);
  // Hands a GET of the API or /metrics to the loop and waits for its answer.
  HttpResponse AskLoop(const std::string& target);
  HttpResponse StaticFile(const std::string& path) const;

  zmq::context_t& context_;
  std::string chartjs_;  // empty if it could not be read
  std::string chartjs_path_;
  std::unique_ptr<HttpServer> http_;
};

// "PORT", "HOST:PORT" -> the dashboard's host and port (host 127.0.0.1 when omitted);
// throws std::invalid_argument naming what is wrong.
void ParseHttpAddress(const std::string& text, DashboardOptions* options);

}  // namespace trainyard
