// The Open Inference Protocol (KServe V2) over HTTP/1.1, with Triton's binary tensor
// data, model repository, statistics (statistics.h) and model configuration
// (model_config.h) extensions: the routes, the JSON forms and the binary framing. The
// calls themselves go to ServerCore.
//
// Binary tensor data. A request whose JSON is followed by raw bytes says so with the
// header Inference-Header-Content-Length (the JSON's length); each input with
// parameters.binary_data_size takes that many bytes of the rest, in input order, and
// together they must use it exactly. BYTES elements are a 4-byte little-endian length
// and the bytes; INT64 elements 8 bytes little-endian. An output asked for with
// parameters.binary_data (or every output with the request's binary_data_output) comes
// back the same way, its size in the output's parameters.binary_data_size.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/http/http_server.h"
#include "worker/serve/server_core.h"

namespace trainyard {

class KserveHttp {
 public:
  // `core` must outlive this.
  explicit KserveHttp(ServerCore* core) : core_(core) {}
  HttpResponse Handle(const HttpRequest& request, const std::function<bool()>& client_gone);
  // The metrics port's handler: GET /metrics.
  HttpResponse HandleMetrics(const HttpRequest& request);

 private:
  HttpResponse Infer(const std::string& model, const std::string& version, const HttpRequest& request,
                     const std::function<bool()>& client_gone);
  HttpResponse ModelMetadata(const std::string& model, const std::string& version);
  HttpResponse Repository(const std::string& model, const std::string& action, const HttpRequest& request);
  HttpResponse Statistics(const std::string& model, const std::string& version);
  HttpResponse Config(const std::string& model, const std::string& version);
  bool Authorized(const HttpRequest& request) const;

  ServerCore* core_;
};

// Server and model metadata as JSON, shared with the gRPC transport's answers.
constexpr char kServerName[] = "trainyard";
constexpr char kServerVersion[] = "0.1.0";
// Triton's names for the extensions both transports speak.
inline const std::vector<std::string> kExtensions = {"binary_tensor_data", "model_repository", "statistics",
                                                     "model_configuration"};

}  // namespace trainyard
