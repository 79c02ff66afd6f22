#include "worker/report/mlflow_logger.h"

#include <curl/curl.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/atomic_file.h"
#include "common/log.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMetricsPerRequest = 1000;  // MLflow's log-batch limits
constexpr size_t kParamsPerRequest = 100;
constexpr size_t kMaxParamValue = 6000;
constexpr size_t kMaxKey = 250;
constexpr std::chrono::seconds kMaxBackoff{30};

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Answer {
  long status = 0;    // 0: no HTTP answer at all (see error)
  std::string body;   // the server's
  std::string error;  // libcurl's, when status is 0
  bool ok() const { return status >= 200 && status < 300; }
  // Worth sending again: no answer, overload, or a server-side failure.
  bool retryable() const { return status == 0 || status == 429 || status >= 500; }
  std::string Describe() const {
    if (status == 0) return error;
    return "HTTP " + std::to_string(status) + ": " + body.substr(0, 300);
  }
  std::string ErrorCode() const {
    const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
    return parsed.is_object() && parsed.contains("error_code") && parsed["error_code"].is_string()
               ? parsed["error_code"].get<std::string>()
               : "";
  }
};

size_t AppendBody(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

// "mlflow-artifacts:/1/abc/artifacts" or "mlflow-artifacts://host:port/1/abc/artifacts"
// -> "1/abc/artifacts"; "" for any other kind of artifact store.
std::string ProxiedArtifactPath(const std::string& artifact_uri) {
  const std::string scheme = "mlflow-artifacts:";
  if (artifact_uri.rfind(scheme, 0) != 0) return "";
  std::string rest = artifact_uri.substr(scheme.size());
  if (rest.rfind("//", 0) == 0) {  // an authority: skip it
    const size_t slash = rest.find('/', 2);
    rest = slash == std::string::npos ? "" : rest.substr(slash);
  }
  while (!rest.empty() && rest.front() == '/') rest.erase(rest.begin());
  return rest;
}

}  // namespace

// One libcurl easy handle: kept for the thread's life so connections are reused.
class MlflowLogger::Http {
 public:
  // `abort_after_ns` (steady clock): a request still running then is abandoned, so a
  // server that accepts but never answers cannot hold Close() past its deadline.
  Http(std::string base, const std::atomic<int64_t>* abort_after_ns)
      : base_(std::move(base)), abort_after_ns_(abort_after_ns), curl_(curl_easy_init()) {
    if (const char* token = std::getenv("MLFLOW_TRACKING_TOKEN"); token && *token)
      auth_header_ = std::string("Authorization: Bearer ") + token;
    const char* user = std::getenv("MLFLOW_TRACKING_USERNAME");
    const char* password = std::getenv("MLFLOW_TRACKING_PASSWORD");
    if (user && *user) {
      user_ = user;
      password_ = password ? password : "";
    }
  }
  ~Http() {
    if (curl_) curl_easy_cleanup(curl_);
  }
  Http(const Http&) = delete;
  Http& operator=(const Http&) = delete;

  std::string Escape(const std::string& text) const {
    char* escaped = curl_easy_escape(curl_, text.c_str(), static_cast<int>(text.size()));
    std::string out = escaped ? escaped : "";
    curl_free(escaped);
    return out;
  }

  Answer Json(const char* method, const std::string& path, const json& body) {
    const std::string text = body.is_null() ? "" : body.dump();
    return Call(method, path, text.empty() ? nullptr : &text, nullptr, 0, std::chrono::seconds(30));
  }

  Answer PutFile(const std::string& path, const std::string& file) {
    std::FILE* in = std::fopen(file.c_str(), "rb");
    if (!in) return {0, "", "cannot read " + file};
    std::error_code ec;
    const auto size = static_cast<curl_off_t>(fs::file_size(file, ec));
    Answer answer = Call("PUT", path, nullptr, in, size, std::chrono::seconds(600));
    std::fclose(in);
    return answer;
  }

 private:
  Answer Call(const char* method, const std::string& path, const std::string* body, std::FILE* upload,
              curl_off_t upload_size, std::chrono::seconds timeout) {
    Answer answer;
    if (!curl_) return {0, "", "libcurl could not start"};
    curl_easy_reset(curl_);
    const std::string url = base_ + path;
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers,
                                upload ? "Content-Type: application/octet-stream" : "Content-Type: application/json");
    if (!auth_header_.empty()) headers = curl_slist_append(headers, auth_header_.c_str());
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for timeouts
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count() * 1000));
    curl_easy_setopt(curl_, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl_, CURLOPT_XFERINFOFUNCTION, AbortWhenDue);
    curl_easy_setopt(curl_, CURLOPT_XFERINFODATA, abort_after_ns_);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, AppendBody);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &answer.body);
    if (!user_.empty()) {
      curl_easy_setopt(curl_, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
      curl_easy_setopt(curl_, CURLOPT_USERNAME, user_.c_str());
      curl_easy_setopt(curl_, CURLOPT_PASSWORD, password_.c_str());
    }
    if (upload) {
      curl_easy_setopt(curl_, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(curl_, CURLOPT_READDATA, upload);
      curl_easy_setopt(curl_, CURLOPT_INFILESIZE_LARGE, upload_size);
    } else if (body) {
      curl_easy_setopt(curl_, CURLOPT_CUSTOMREQUEST, method);
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, body->data());
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body->size()));
    } else {
      curl_easy_setopt(curl_, CURLOPT_CUSTOMREQUEST, method);
    }
    const CURLcode code = curl_easy_perform(curl_);
    curl_slist_free_all(headers);
    if (code != CURLE_OK) {
      answer.error = url + ": " + curl_easy_strerror(code);
      answer.body.clear();
      return answer;
    }
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &answer.status);
    return answer;
  }

  static int AbortWhenDue(void* abort_after_ns, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    const int64_t due = static_cast<const std::atomic<int64_t>*>(abort_after_ns)->load();
    return Clock::now().time_since_epoch().count() >= due ? 1 : 0;
  }

  std::string base_, auth_header_, user_, password_;
  const std::atomic<int64_t>* abort_after_ns_;
  CURL* curl_;
};

bool MlflowAvailable() { return true; }

std::unique_ptr<MetricSink> OpenMlflow(const MlflowOptions& options) { return std::make_unique<MlflowLogger>(options); }

MlflowLogger::MlflowLogger(MlflowOptions options) : options_(std::move(options)) {
  static std::once_flag curl_ready;
  std::call_once(curl_ready, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  for (const auto& [key, value] : options_.params)
    params_.emplace_back(key.substr(0, kMaxKey), value.substr(0, kMaxParamValue));
  LoadSavedRun();
  thread_ = std::thread([this] { Run(); });
}

MlflowLogger::~MlflowLogger() { Close("FAILED"); }

void MlflowLogger::LogMetrics(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  const int64_t now = WallMs();
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;
  for (const auto& [key, value] : values)
    if (std::isfinite(value)) metrics_.push_back({key.substr(0, kMaxKey), value, now, step});
  size_t dropped = 0;
  for (; metrics_.size() > kMaxQueuedMetrics; ++dropped) metrics_.pop_front();
  if (dropped) {
    counts_.dropped_metrics += int64_t(dropped);
    WarnOnce("queue", "mlflow: " + std::to_string(kMaxQueuedMetrics) + " metric points are waiting for " +
                          options_.uri + "; the oldest are being dropped (training goes on)");
  }
  wake_.notify_one();
}

void MlflowLogger::LogArtifacts(const std::string& folder, const std::string& artifact_path) {
  std::vector<Artifact> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const fs::path relative = fs::relative(it->path(), folder, ec).parent_path();
    std::string dir = artifact_path;
    if (!relative.empty()) dir += "/" + relative.generic_string();
    files.push_back({it->path().string(), dir});
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;
  artifacts_.insert(artifacts_.end(), files.begin(), files.end());
  wake_.notify_one();
}

void MlflowLogger::Close(const std::string& status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
    close_status_ = status;
    close_deadline_ = Clock::now() + kFlushTimeout;
    abort_after_ns_ = std::chrono::duration_cast<Clock::duration>(close_deadline_.time_since_epoch()).count();
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

MlflowLogger::Counts MlflowLogger::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

void MlflowLogger::WarnOnce(const std::string& key, const std::string& message) {
  if (warned_[key]) return;
  warned_[key] = true;
  LogWarn(message);
}

void MlflowLogger::Run() {
  Http http(options_.uri, &abort_after_ns_);
  std::chrono::seconds backoff{1};
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return closed_ || !metrics_.empty() || !artifacts_.empty() || !params_.empty(); });
    lock.unlock();
    bool sent = false;
    try {
      sent = EnsureRun(http) && SendParams(http) && SendMetrics(http) && SendArtifact(http);
    } catch (const std::exception& e) {  // an answer that is not what MLflow sends
      std::lock_guard<std::mutex> guard(mutex_);
      WarnOnce("contact",
               "mlflow: " + options_.uri + " gave an unexpected answer (" + e.what() + "); retrying in the background");
    }
    lock.lock();
    const bool idle = metrics_.empty() && artifacts_.empty() && params_.empty();
    if (sent) {
      if (warned_["contact"]) LogInfo("mlflow: " + options_.uri + " answers again");
      warned_["contact"] = false;
      backoff = std::chrono::seconds(1);
    }
    if (closed_ && idle && sent) {
      const std::string status = close_status_;
      lock.unlock();
      FinishRun(http, status);
      return;
    }
    if (closed_ && Clock::now() >= close_deadline_) {
      LogWarn("mlflow: gave up on " + options_.uri + " after waiting " + std::to_string(kFlushTimeout.count()) +
              " s at the end of the job: " + std::to_string(metrics_.size()) + " metric points and " +
              std::to_string(artifacts_.size()) + " artifact files were not sent");
      counts_.dropped_metrics += int64_t(metrics_.size());
      return;
    }
    if (!sent) {
      const auto until = closed_ ? std::min(Clock::now() + backoff, close_deadline_) : Clock::now() + backoff;
      wake_.wait_until(lock, until, [&] { return closed_ && Clock::now() >= close_deadline_; });
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }
}

bool MlflowLogger::EnsureRun(Http& http) {
  if (!run_id_.empty()) return true;
  auto no_contact = [&](const Answer& a, const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    WarnOnce("contact", "mlflow: cannot " + what + " at " + options_.uri + " (" + a.Describe() +
                            "); retrying in the background, training goes on");
    return false;
  };
  if (experiment_id_.empty()) {
    const Answer found = http.Json(
        "GET", "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" + http.Escape(options_.experiment), nullptr);
    if (found.ok()) {
      experiment_id_ = json::parse(found.body).at("experiment").at("experiment_id").get<std::string>();
    } else if (found.ErrorCode() == "RESOURCE_DOES_NOT_EXIST") {
      const Answer made = http.Json("POST", "/api/2.0/mlflow/experiments/create", {{"name", options_.experiment}});
      if (!made.ok()) return no_contact(made, "create experiment '" + options_.experiment + "'");
      experiment_id_ = json::parse(made.body).at("experiment_id").get<std::string>();
    } else {
      return no_contact(found, "look up experiment '" + options_.experiment + "'");
    }
  }
  const json request = {{"experiment_id", experiment_id_},
                        {"run_name", options_.run_name},
                        {"start_time", WallMs()},
                        {"tags", json::array({{{"key", "mlflow.runName"}, {"value", options_.run_name}},
                                              {{"key", "mlflow.source.name"}, {"value", "trainyard worker"}},
                                              {{"key", "mlflow.source.type"}, {"value", "JOB"}}})}};
  const Answer made = http.Json("POST", "/api/2.0/mlflow/runs/create", request);
  if (!made.ok()) return no_contact(made, "create a run");
  const json info = json::parse(made.body).at("run").at("info");
  run_id_ = info.at("run_id").get<std::string>();
  artifact_uri_ = info.value("artifact_uri", "");
  SaveRun();
  LogInfo("mlflow: logging to run " + run_id_ + " of experiment '" + options_.experiment + "' (" + experiment_id_ +
          ") at " + options_.uri);
  return true;
}

// A refused request (4xx) cannot succeed by being sent again: it is dropped, with a warning.
void MlflowLogger::NoteRefused(const std::string& what, const std::string& answer) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counts_.refused_requests;
  LogWarn("mlflow: the server refused " + what + " (" + answer + "); dropped");
}

bool MlflowLogger::SendParams(Http& http) {
  std::vector<std::pair<std::string, std::string>> batch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t n = std::min(params_.size(), kParamsPerRequest);
    batch.assign(params_.begin(), params_.begin() + long(n));
  }
  if (batch.empty()) return true;
  json params = json::array();
  for (const auto& [key, value] : batch) params.push_back({{"key", key}, {"value", value}});
  const Answer a = http.Json("POST", "/api/2.0/mlflow/runs/log-batch", {{"run_id", run_id_}, {"params", params}});
  if (!a.ok() && a.retryable()) return false;
  if (!a.ok()) NoteRefused(std::to_string(batch.size()) + " params", a.Describe());
  std::lock_guard<std::mutex> lock(mutex_);
  params_.erase(params_.begin(), params_.begin() + long(batch.size()));
  return true;
}

bool MlflowLogger::SendMetrics(Http& http) {
  std::vector<Metric> batch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t n = std::min(metrics_.size(), kMetricsPerRequest);
    batch.assign(metrics_.begin(), metrics_.begin() + long(n));
    metrics_.erase(metrics_.begin(), metrics_.begin() + long(n));
  }
  if (batch.empty()) return true;
  json metrics = json::array();
  for (const Metric& m : batch)
    metrics.push_back({{"key", m.key}, {"value", m.value}, {"timestamp", m.timestamp_ms}, {"step", m.step}});
  const Answer a = http.Json("POST", "/api/2.0/mlflow/runs/log-batch", {{"run_id", run_id_}, {"metrics", metrics}});
  if (a.ok()) {
    std::lock_guard<std::mutex> lock(mutex_);
    counts_.sent_metrics += int64_t(batch.size());
    return true;
  }
  if (!a.retryable()) {
    NoteRefused(std::to_string(batch.size()) + " metric points", a.Describe());
    return true;
  }
  std::lock_guard<std::mutex> lock(mutex_);  // back to the front, oldest first
  metrics_.insert(metrics_.begin(), batch.begin(), batch.end());
  WarnOnce("contact", "mlflow: cannot log metrics to " + options_.uri + " (" + a.Describe() +
                          "); retrying in the background, training goes on");
  return false;
}

bool MlflowLogger::SendArtifact(Http& http) {
  Artifact next;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (artifacts_.empty()) return true;
    next = artifacts_.front();
  }
  const std::string store = ProxiedArtifactPath(artifact_uri_);
  if (store.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    WarnOnce("artifacts", "mlflow: the run's artifacts live at " + artifact_uri_ +
                              ", which only the server's own artifact proxy lets a worker write (start the server "
                              "with --serve-artifacts); " +
                              std::to_string(artifacts_.size()) + " files not uploaded");
    artifacts_.clear();
    return true;
  }
  std::string path = "/api/2.0/mlflow-artifacts/artifacts/" + store;
  std::stringstream segments(next.artifact_path + "/" + fs::path(next.file).filename().string());
  for (std::string segment; std::getline(segments, segment, '/');)
    if (!segment.empty()) path += "/" + http.Escape(segment);
  const Answer a = http.PutFile(path, next.file);
  if (!a.ok() && a.retryable()) {
    std::lock_guard<std::mutex> lock(mutex_);
    WarnOnce("contact", "mlflow: cannot upload " + next.file + " to " + options_.uri + " (" + a.Describe() +
                            "); retrying in the background");
    return false;
  }
  if (!a.ok()) NoteRefused("the upload of " + next.file, a.Describe());
  std::lock_guard<std::mutex> lock(mutex_);
  if (a.ok()) ++counts_.uploaded_files;
  artifacts_.pop_front();
  return true;
}

bool MlflowLogger::FinishRun(Http& http, const std::string& status) {
  if (run_id_.empty()) return false;
  const Answer a = http.Json("POST", "/api/2.0/mlflow/runs/update",
                             {{"run_id", run_id_}, {"status", status}, {"end_time", WallMs()}});
  if (!a.ok()) LogWarn("mlflow: cannot mark run " + run_id_ + " " + status + ": " + a.Describe());
  return a.ok();
}

void MlflowLogger::LoadSavedRun() {
  std::ifstream in(options_.run_dir + "/mlflow_run.json");
  if (!in) return;
  std::stringstream text;
  text << in.rdbuf();
  const json saved = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!saved.is_object() || saved.value("uri", "") != options_.uri || !saved.contains("run_id")) return;
  run_id_ = saved.value("run_id", "");
  experiment_id_ = saved.value("experiment_id", "");
  artifact_uri_ = saved.value("artifact_uri", "");
}

void MlflowLogger::SaveRun() const {
  const json saved = {
      {"uri", options_.uri}, {"experiment_id", experiment_id_}, {"run_id", run_id_}, {"artifact_uri", artifact_uri_}};
  try {
    WriteFileAtomically(options_.run_dir + "/mlflow_run.json", saved.dump(2) + "\n");
  } catch (const std::exception& e) {
    LogWarn(std::string("mlflow: cannot save the run id (a resume will start a new run): ") + e.what());
  }
}

}  // namespace trainyard
