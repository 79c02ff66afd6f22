#include "worker/serve/kserve_http.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/bounded_json.h"
#include "worker/serve/infer_codec.h"
#include "worker/serve/kserve_json.h"
#include "worker/serve/model_config.h"

namespace trainyard {
namespace {

using json = nlohmann::json;

HttpResponse JsonResponse(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = DumpJsonForPeer(body);
  return r;
}

HttpResponse Error(int status, const std::string& message) { return JsonResponse(status, {{"error", message}}); }

// A request path's components ("/v2/models/m/infer" -> v2, models, m, infer); empty
// components are kept, so "//" never names anything.
std::vector<std::string> PathParts(const std::string& path) {
  std::vector<std::string> parts;
  size_t begin = path.empty() || path[0] != '/' ? 0 : 1;
  for (;;) {
    const size_t slash = path.find('/', begin);
    parts.push_back(path.substr(begin, slash == std::string::npos ? std::string::npos : slash - begin));
    if (slash == std::string::npos) return parts;
    begin = slash + 1;
  }
}

// /v2/models/<model>[/versions/<version>][/ready|/infer|/stats|/config], and
// /v2/repository/models/<model>/<load|unload> (action "load" or "unload"). Split by
// hand: a path is the client's, and std::regex recurses per byte of what it matches.
struct ModelRoute {
  std::string model, version, action;  // action without its slash; empty: the metadata
};

std::optional<ModelRoute> ModelPath(const std::vector<std::string>& parts) {
  if (parts.size() < 3 || parts[0] != "v2" || parts[1] != "models" || parts[2].empty()) return std::nullopt;
  ModelRoute route{parts[2], "", ""};
  size_t next = 3;
  if (parts.size() >= next + 2 && parts[next] == "versions" && !parts[next + 1].empty()) {
    route.version = parts[next + 1];
    next += 2;
  }
  if (parts.size() == next + 1) {
    route.action = parts[next];
    if (route.action != "ready" && route.action != "infer" && route.action != "stats" && route.action != "config")
      return std::nullopt;
    ++next;
  }
  if (parts.size() != next) return std::nullopt;
  return route;
}

std::optional<ModelRoute> RepositoryPath(const std::vector<std::string>& parts) {
  if (parts.size() != 5 || parts[0] != "v2" || parts[1] != "repository" || parts[2] != "models" || parts[3].empty() ||
      (parts[4] != "load" && parts[4] != "unload"))
    return std::nullopt;
  return ModelRoute{parts[3], "", parts[4]};
}

json DurationJson(const StatisticDuration& d) { return {{"count", d.count}, {"ns", d.ns}}; }

json StatisticsJson(const VersionStatistics& s) {
  const json zero = DurationJson({});
  json batches = json::array();
  for (const auto& [rows, infer] : s.batch_compute_infer)
    batches.push_back({{"batch_size", rows},
                       {"compute_input", zero},
                       {"compute_infer", DurationJson(infer)},
                       {"compute_output", zero}});
  return {{"name", s.model},
          {"version", std::to_string(s.version)},
          {"last_inference", s.last_inference_ms},
          {"inference_count", s.inference_count},
          {"execution_count", s.execution_count},
          {"inference_stats",
           {{"success", DurationJson(s.success)},
            {"fail", DurationJson(s.fail)},
            {"queue", DurationJson(s.queue)},
            {"compute_input", zero},
            {"compute_infer", DurationJson(s.compute_infer)},
            {"compute_output", zero},
            {"cache_hit", zero},
            {"cache_miss", zero}}},
          {"batch_stats", batches}};
}

json TensorsJson(const std::vector<TensorConfig>& tensors, bool inputs) {
  json out = json::array();
  for (const TensorConfig& t : tensors) {
    json entry = {{"name", t.name}, {"data_type", t.data_type}, {"dims", t.dims}};
    if (t.scalar_per_row) entry["reshape"] = {{"shape", json::array()}};
    if (inputs) entry["optional"] = t.optional;
    out.push_back(entry);
  }
  return out;
}

// Triton's JSON form of ModelConfig (protobuf's JSON mapping, field names as in the
// .proto).
json ConfigJson(const ModelConfigView& c) {
  json parameters = json::object();
  for (const auto& [key, value] : c.parameters) parameters[key] = {{"string_value", value}};
  return {{"name", c.name},
          {"platform", c.platform},
          {"backend", c.backend},
          {"version_policy", {{"latest", {{"num_versions", 1}}}}},
          {"max_batch_size", c.max_batch_size},
          {"input", TensorsJson(c.inputs, true)},
          {"output", TensorsJson(c.outputs, false)},
          {"dynamic_batching",
           {{"preferred_batch_size", c.preferred_batch_sizes}, {"max_queue_delay_microseconds", c.max_queue_delay_us}}},
          {"parameters", parameters}};
}

HttpResponse AnswerResponse(const JsonAnswer& answer) {
  HttpResponse r;
  r.body = answer.body;
  if (answer.binary) {
    r.headers.emplace_back("Inference-Header-Content-Length", std::to_string(answer.json_length));
    r.content_type = "application/octet-stream";
  }
  return r;
}

}  // namespace

bool KserveHttp::Authorized(const HttpRequest& request) const {
  const std::string& token = core_->spec().access_token;
  return token.empty() || request.Header("authorization") == "Bearer " + token;
}

HttpResponse KserveHttp::Handle(const HttpRequest& request, const std::function<bool()>& client_gone) {
  if (!Authorized(request)) return Error(401, "missing or wrong access token (Authorization: Bearer ...)");
  const std::string path = request.target.substr(0, request.target.find('?'));
  const bool get = request.method == "GET", post = request.method == "POST";
  if (get && path == "/v2/health/live") return JsonResponse(core_->live() ? 200 : 503, json::object());
  if (get && path == "/v2/health/ready") return JsonResponse(core_->ready() ? 200 : 503, json::object());
  if (get && path == "/v2")
    return JsonResponse(200, {{"name", kServerName}, {"version", kServerVersion}, {"extensions", kExtensions}});
  if (get && path == "/v2/models/stats") return Statistics("", "");
  if (post && path == "/v2/repository/index") return Repository("", "index", request);
  const std::vector<std::string> parts = PathParts(path);
  if (auto repository = RepositoryPath(parts); post && repository)
    return Repository(repository->model, repository->action, request);
  if (auto route = ModelPath(parts)) {
    const std::string& model = route->model;
    const std::string& version = route->version;
    const std::string& action = route->action;
    if (get && action.empty()) return ModelMetadata(model, version);
    if (get && action == "ready") return JsonResponse(core_->ModelReady(model, version) ? 200 : 400, json::object());
    if (post && action == "infer") return Infer(model, version, request, client_gone);
    if (get && action == "stats") return Statistics(model, version);
    if (get && action == "config") return Config(model, version);
  }
  return Error(404, request.method + " " + path + ": no such endpoint");
}

HttpResponse KserveHttp::ModelMetadata(const std::string& model, const std::string& version) {
  InferStatus status;
  std::string message;
  auto meta = core_->Resolve(model, version, &status, &message);
  if (!meta) return Error(HttpStatus(status) == 503 ? 400 : HttpStatus(status), message);
  json versions = json::array();
  for (int64_t v : core_->ReadyVersions(model)) versions.push_back(std::to_string(v));
  const int64_t labels = int64_t(meta->labels.size());
  return JsonResponse(200, {{"name", model},
                            {"versions", versions},
                            {"platform", std::string("trainyard_") + meta->family},
                            {"inputs",
                             {{{"name", "TEXT"}, {"datatype", "BYTES"}, {"shape", {-1}}},
                              {{"name", "input_ids"}, {"datatype", "INT64"}, {"shape", {-1, -1}}},
                              {{"name", "attention_mask"}, {"datatype", "INT64"}, {"shape", {-1, -1}}}}},
                            {"outputs",
                             {{{"name", "logits"}, {"datatype", "FP32"}, {"shape", {-1, labels}}},
                              {{"name", "label"}, {"datatype", "BYTES"}, {"shape", {-1}}}}}});
}

HttpResponse KserveHttp::Statistics(const std::string& model, const std::string& version) {
  InferStatus status;
  std::string message;
  const std::vector<VersionStatistics> stats = core_->Statistics(model, version, &status, &message);
  if (status != InferStatus::kOk) return Error(HttpStatus(status), message);
  json list = json::array();
  for (const VersionStatistics& s : stats) list.push_back(StatisticsJson(s));
  return JsonResponse(200, {{"model_stats", list}});
}

HttpResponse KserveHttp::Config(const std::string& model, const std::string& version) {
  InferStatus status;
  std::string message;
  auto meta = core_->Resolve(model, version, &status, &message);
  if (!meta) return Error(HttpStatus(status) == 503 ? 400 : HttpStatus(status), message);
  return JsonResponse(200, ConfigJson(DescribeModel(*meta, core_->spec())));
}

HttpResponse KserveHttp::Repository(const std::string& model, const std::string& action, const HttpRequest& request) {
  if (action == "index") {
    bool ready_only = false;
    if (!request.body.empty()) {
      const json body = ParseBoundedJsonOrDiscarded(request.body);
      if (body.is_discarded() || !body.is_object()) return Error(400, "request body: malformed JSON");
      if (body.contains("ready") && !body["ready"].is_boolean())
        return Error(400, "request body: 'ready' must be true or false");
      ready_only = body.contains("ready") && body["ready"].get<bool>();
    }
    json index = json::array();
    for (const IndexEntry& e : core_->Index(ready_only)) {
      json entry = {{"name", e.model}, {"version", std::to_string(e.version)}, {"state", StateName(e.state)}};
      if (!e.reason.empty()) entry["reason"] = e.reason;
      index.push_back(entry);
    }
    return JsonResponse(200, index);
  }
  std::string message;
  const InferStatus status = action == "load" ? core_->Load(model, &message) : core_->Unload(model, &message);
  return status == InferStatus::kOk ? JsonResponse(200, json::object()) : Error(HttpStatus(status), message);
}

HttpResponse KserveHttp::Infer(const std::string& model, const std::string& version, const HttpRequest& request,
                               const std::function<bool()>& client_gone) {
  InferStatus status;
  std::string message;
  auto meta = core_->Resolve(model, version, &status, &message);
  if (!meta) {
    core_->Record(model, version, status);
    return Error(HttpStatus(status), message);
  }
  InferCall call;
  RequestPtr pending;
  try {
    call = DecodeJsonInfer(request.body, request.Header("inference-header-content-length"));
    MakeOutputs(call, *meta, {});  // checks the outputs asked for
    const ServeSpec& spec = core_->spec();
    const auto deadline = DeadlineAfter(call.timeout_ms, spec.default_timeout_ms);
    pending = std::make_shared<InferRequest>(meta, TokenRows(call.inputs, *meta, spec.truncate, spec.max_batch_size),
                                             PriorityLevel(call.priority), deadline);
  } catch (const InferInputError& e) {
    core_->Record(model, std::to_string(meta->version), InferStatus::kBadInput);
    return Error(400, e.what());
  }
  pending->SetClientGone(client_gone);
  core_->Submit(pending);
  pending->Wait();
  if (pending->status() != InferStatus::kOk) return Error(HttpStatus(pending->status()), pending->message());
  return AnswerResponse(EncodeJsonAnswer(call, *meta, MakeOutputs(call, *meta, pending->logits())));
}

HttpResponse KserveHttp::HandleMetrics(const HttpRequest& request) {
  if (!Authorized(request)) return Error(401, "missing or wrong access token (Authorization: Bearer ...)");
  if (request.method != "GET" || request.target.substr(0, request.target.find('?')) != "/metrics")
    return Error(404, request.method + " " + request.target + ": only GET /metrics here");
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = core_->RenderMetrics();
  return r;
}

}  // namespace trainyard
