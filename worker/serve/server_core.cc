#include "worker/serve/server_core.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/log.h"

namespace trainyard {
namespace fs = std::filesystem;
namespace {

constexpr int kIdleWaitMs = 50;
// A batch is expected to take up to this times its estimated cost: DropHopeless answers
// 504 for a request whose deadline comes before its batch would end at that cost.
constexpr double kEstimateMargin = 1.2;
// Admission refuses a request whose estimated wait, times this, is past its deadline. It
// leaves more headroom than kEstimateMargin: the wait spans several batches, each of
// which may run slower than the p90 estimate (on a shared CPU they do), and an admitted
// request that is later dropped as late has waited for nothing, which is worse for its
// client than a 429 at once. At twice the sustainable rate on two shared cores, 1.2 here
// let ~2-4% of the admitted requests end in 504.
constexpr double kAdmitMargin = 1.5;
constexpr size_t kCostWindow = 32;  // batches the cost model looks back on
// How often, and how many of, the queued requests are asked whether their client is
// still there. A bounded number: the question is a call into the transport (gRPC's
// IsCancelled takes a lock), and asking all of a queue of thousands every period kept
// the dispatcher too busy to feed the model. A batch's own members are asked again just
// before it runs, so a request whose client went away is never computed, however long
// the queue.
constexpr auto kSweepPeriod = std::chrono::milliseconds(10);
constexpr size_t kSweepBudget = 256;
constexpr double kSettleSeconds = 1.0;
constexpr auto kLoadWait = std::chrono::minutes(10);

double MsBetween(ServeClock::time_point a, ServeClock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Names, sizes and modification times of a folder's files: a version is read again
// only when this changes. *newest: the latest modification time among them.
std::string FolderSignature(const std::string& folder, fs::file_time_type* newest) {
  std::string signature;
  std::error_code error;
  *newest = fs::file_time_type::min();
  for (const auto& file : fs::directory_iterator(folder, error)) {
    const auto time = file.last_write_time(error);
    *newest = std::max(*newest, time);
    signature += file.path().filename().string() + ":" +
                 std::to_string(file.is_regular_file(error) ? file.file_size(error) : 0) + ":" +
                 std::to_string(time.time_since_epoch().count()) + ";";
  }
  return signature;
}

bool Settled(fs::file_time_type newest) {
  return std::chrono::duration<double>(fs::file_time_type::clock::now() - newest).count() >= kSettleSeconds;
}

double ResidentBytes(pid_t pid) {
  std::ifstream statm("/proc/" + std::to_string(pid) + "/statm");
  long pages = 0, resident = 0;
  if (!(statm >> pages >> resident)) return 0;
  return double(resident) * double(::sysconf(_SC_PAGESIZE));
}

}  // namespace

const char* StateName(VersionState state) {
  switch (state) {
    case VersionState::kLoading:
      return "LOADING";
    case VersionState::kReady:
      return "READY";
    case VersionState::kUnavailable:
      return "UNAVAILABLE";
  }
  return "UNAVAILABLE";
}

ServerCore::ServerCore(ServeSpec spec, const std::string& link_endpoint)
    : spec_(std::move(spec)),
      link_(std::make_unique<ModelLink>(link_endpoint)),
      batcher_(BatchPolicy{spec_.max_batch_size, spec_.max_batch_tokens, spec_.preferred_batch_sizes,
                           spec_.max_queue_delay_ms, size_t(spec_.max_queue), spec_.length_aware}) {
  DeclareMetrics();
}

ServerCore::~ServerCore() { Stop(); }

void ServerCore::DeclareMetrics() {
  const std::vector<double> seconds{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                    0.25,  0.3,    0.4,   0.5,  0.75,  1,    2.5,   5,   10};
  metrics_.DeclareCounter("trainyard_serve_requests_total", "Inference requests by model, version and outcome.");
  metrics_.DeclareCounter("trainyard_serve_computed_requests_total",
                          "Requests whose rows went through a forward pass (cancelled ones never do).");
  metrics_.DeclareHistogram("trainyard_serve_queue_seconds", "Time from arrival to the batch being sent.", seconds);
  metrics_.DeclareHistogram("trainyard_serve_compute_seconds", "Forward-pass time of the request's batch.", seconds);
  metrics_.DeclareHistogram("trainyard_serve_request_seconds", "Time from arrival to the answer, admitted requests.",
                            seconds);
  metrics_.DeclareHistogram("trainyard_serve_batch_rows", "Rows per batch sent to the model.",
                            {1, 2, 4, 8, 16, 32, 64, 128, 256});
  metrics_.DeclareCounter("trainyard_serve_real_tokens_total", "Tokens of the texts in computed batches.");
  metrics_.DeclareCounter("trainyard_serve_padded_tokens_total",
                          "Token slots of computed batches, padding included (rows x longest row).");
  metrics_.DeclareGauge("trainyard_serve_queue_depth", "Requests queued, all models.");
  metrics_.DeclareGauge("trainyard_serve_cost_ms_per_token",
                        "The admission's cost model: milliseconds per padded token of a batch.");
  metrics_.DeclareGauge("trainyard_serve_resident_bytes", "Resident memory of the serving processes.");
  metrics_.DeclareGauge("trainyard_serve_model_ready", "1 for each model version that is READY.");
}

void ServerCore::Start() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    PollRepository(/*initial=*/true);
  }
  live_ = true;
  dispatcher_ = std::thread([this] { DispatchLoop(); });
  poller_ = std::thread([this] { PollLoop(); });
}

void ServerCore::Stop() {
  if (stopping_.exchange(true)) return;
  wake_.notify_all();
  if (poller_.joinable()) poller_.join();
  if (dispatcher_.joinable()) dispatcher_.join();
  live_ = false;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const RequestPtr& r : batcher_.TakeDead(ServeClock::time_point::max()))
    r->Finish(InferStatus::kUnavailable, "server stopping");
  link_->SendStop();
}

// --- Versions ---------------------------------------------------------------------

int64_t ServerCore::ServingVersion(const ModelSlot& slot) const {
  for (auto it = slot.versions.rbegin(); it != slot.versions.rend(); ++it)
    if (it->second.state == VersionState::kReady && !it->second.retiring) return it->first;
  return 0;
}

std::vector<std::pair<int, int>> ServerCore::WarmShapes(const VersionMeta& meta) const {
  std::vector<int> rows{1};
  for (int r : spec_.preferred_batch_sizes) rows.push_back(r);
  rows.push_back(spec_.max_batch_size);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::vector<std::pair<int, int>> shapes;
  for (int r : rows)
    for (int seq = 16;; seq *= 2) {
      const int s = std::min(seq, meta.max_tokens);
      if (int64_t(r) * s > spec_.max_batch_tokens && r > 1) break;
      shapes.emplace_back(r, s);
      if (s == meta.max_tokens) break;
    }
  return shapes;
}

bool ServerCore::StartLoad(const RepositoryEntry& entry, const std::string& signature) {
  VersionSlot& slot = models_[entry.model].versions[entry.version];
  slot.signature = signature;
  slot.retiring = false;
  try {
    slot.meta = std::make_shared<const VersionMeta>(ReadVersion(entry));
  } catch (const std::exception& e) {
    slot.state = VersionState::kUnavailable;
    slot.reason = e.what();
    LogWarn("serve: " + entry.model + " version " + std::to_string(entry.version) + " refused: " + slot.reason);
    load_done_.notify_all();
    return false;
  }
  slot.state = VersionState::kLoading;
  slot.reason.clear();
  ++loads_pending_;
  auto meta = slot.meta;
  auto shapes = WarmShapes(*meta);
  commands_.push_back([this, meta, shapes] { link_->SendLoad(*meta, shapes); });
  LogInfo("serve: loading " + entry.model + " version " + std::to_string(entry.version) + " from " + entry.path);
  wake_.notify_all();
  return true;
}

// The newest settled version of each model, when it is newer than the one serving and
// not already loading or refused in its current form.
void ServerCore::PollRepository(bool initial) {
  std::map<std::string, RepositoryEntry> newest;
  for (const RepositoryEntry& entry : ScanRepository(spec_.repository)) newest[entry.model] = entry;
  for (const auto& [model, entry] : newest) {
    ModelSlot& slot = models_[model];
    if (slot.unloaded || entry.version < ServingVersion(slot)) continue;
    auto known = slot.versions.find(entry.version);
    fs::file_time_type time;
    const std::string signature = FolderSignature(entry.path, &time);
    if (known != slot.versions.end() && (known->second.state != VersionState::kUnavailable ||
                                         known->second.signature == signature || known->second.retiring))
      continue;
    if (!initial && !Settled(time)) continue;
    StartLoad(entry, signature);
  }
}

void ServerCore::PollLoop() {
  auto next = ServeClock::now();
  while (!stopping_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(kIdleWaitMs));
    if (spec_.poll_s <= 0 || ServeClock::now() < next) continue;
    next = ServeClock::now() +
           std::chrono::duration_cast<ServeClock::duration>(std::chrono::duration<double>(spec_.poll_s));
    std::lock_guard<std::mutex> lock(mutex_);
    PollRepository(/*initial=*/false);
  }
}

bool ServerCore::ready() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!live_) return false;
  for (const auto& [name, slot] : models_)
    if (!slot.unloaded && ServingVersion(slot) == 0) return false;
  return true;
}

std::shared_ptr<const VersionMeta> ServerCore::Resolve(const std::string& model, const std::string& version,
                                                       InferStatus* status, std::string* message) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = models_.find(model);
  if (it == models_.end()) {
    *status = InferStatus::kNotFound;
    *message = "unknown model '" + model + "'";
    return nullptr;
  }
  int64_t number = ServingVersion(it->second);
  if (!version.empty()) {
    try {
      size_t used = 0;
      number = std::stoll(version, &used);
      if (used != version.size()) throw std::invalid_argument(version);
    } catch (const std::exception&) {
      *status = InferStatus::kNotFound;
      *message = "model '" + model + "': version '" + version + "' is not a number";
      return nullptr;
    }
  }
  auto v = it->second.versions.find(number);
  if (v == it->second.versions.end()) {
    *status = number == 0 ? InferStatus::kUnavailable : InferStatus::kNotFound;
    *message =
        number == 0 ? "model '" + model + "' has no version ready" : "model '" + model + "' has no version " + version;
    return nullptr;
  }
  if (v->second.state != VersionState::kReady || v->second.retiring) {
    *status = InferStatus::kUnavailable;
    *message = "model '" + model + "' version " + std::to_string(number) + " is " +
               (v->second.retiring ? std::string("retired") : StateName(v->second.state)) +
               (v->second.reason.empty() ? "" : ": " + v->second.reason);
    return nullptr;
  }
  return v->second.meta;
}

bool ServerCore::ModelReady(const std::string& model, const std::string& version) const {
  InferStatus status;
  std::string message;
  return Resolve(model, version, &status, &message) != nullptr;
}

std::vector<int64_t> ServerCore::ReadyVersions(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int64_t> versions;
  auto it = models_.find(model);
  if (it != models_.end())
    for (const auto& [number, slot] : it->second.versions)
      if (slot.state == VersionState::kReady && !slot.retiring) versions.push_back(number);
  return versions;
}

std::vector<IndexEntry> ServerCore::Index(bool ready_only) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<IndexEntry> index;
  for (const auto& [model, slot] : models_)
    for (const auto& [number, v] : slot.versions) {
      const VersionState state = v.retiring ? VersionState::kUnavailable : v.state;
      if (ready_only && state != VersionState::kReady) continue;
      index.push_back({model, number, state, v.retiring && v.reason.empty() ? "retired" : v.reason});
    }
  return index;
}

InferStatus ServerCore::Load(const std::string& model, std::string* message) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::optional<RepositoryEntry> newest;
  for (const RepositoryEntry& entry : ScanRepository(spec_.repository))
    if (entry.model == model) newest = entry;
  if (!newest) {
    *message =
        "no model '" + model + "' in the repository (expected " + spec_.repository + "/" + model + "/<version>/)";
    return InferStatus::kNotFound;
  }
  ModelSlot& slot = models_[model];
  slot.unloaded = false;
  auto known = slot.versions.find(newest->version);
  const bool serving =
      known != slot.versions.end() && known->second.state == VersionState::kReady && !known->second.retiring;
  if (!serving && !(known != slot.versions.end() && known->second.state == VersionState::kLoading)) {
    fs::file_time_type time;
    StartLoad(*newest, FolderSignature(newest->path, &time));
  }
  const int64_t version = newest->version;
  load_done_.wait_for(lock, kLoadWait,
                      [&] { return stopping_ || models_[model].versions[version].state != VersionState::kLoading; });
  const VersionSlot& v = models_[model].versions[version];
  if (v.state == VersionState::kReady) return InferStatus::kOk;
  *message = "model '" + model + "' version " + std::to_string(version) + " failed to load: " + v.reason;
  return InferStatus::kBadInput;
}

InferStatus ServerCore::Unload(const std::string& model, std::string* message) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = models_.find(model);
  if (it == models_.end()) {
    *message = "unknown model '" + model + "'";
    return InferStatus::kNotFound;
  }
  it->second.unloaded = true;
  for (auto& [number, v] : it->second.versions)
    if (v.state == VersionState::kReady && !v.retiring) {
      v.retiring = true;
      v.reason = "unloaded by request";
    }
  wake_.notify_all();
  return InferStatus::kOk;
}

// --- Admission ----------------------------------------------------------------------

double ServerCore::EstimateWaitMs(const InferRequest& request, ServeClock::time_point now) const {
  const int64_t own = int64_t(request.rows().size()) * request.longest();
  double running = 0;
  if (in_flight_)
    running = std::max(
        0.0, in_flight_->batch.request_tokens() * ms_per_token_ + ms_per_batch_ - MsBetween(in_flight_->sent, now));
  const int64_t queued = batcher_.queued_tokens() + own;
  const double batches = std::ceil(double(queued) / double(spec_.max_batch_tokens));
  return running + double(queued) * ms_per_token_ + batches * ms_per_batch_ + spec_.max_queue_delay_ms;
}

void ServerCore::Submit(const RequestPtr& request) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto now = ServeClock::now();
  std::string why;
  if (batcher_.size() >= size_t(spec_.max_queue)) {
    why = "queue full: " + std::to_string(batcher_.size()) + " requests waiting (serve.max_queue)";
  } else {
    const double wait_ms = EstimateWaitMs(*request, now);
    const double left_ms = MsBetween(now, request->deadline());
    if (wait_ms * kAdmitMargin > left_ms)
      why = "cannot meet the deadline: about " + std::to_string(int64_t(std::ceil(wait_ms))) + " ms of work ahead, " +
            std::to_string(int64_t(std::max(0.0, left_ms))) + " ms left";
  }
  if (!why.empty()) {
    lock.unlock();
    request->Finish(InferStatus::kRejected, why);
    Finished(*request, InferStatus::kRejected);
    return;
  }
  batcher_.Push(request);
  lock.unlock();
  wake_.notify_all();
}

void ServerCore::Record(const std::string& model, const std::string& version, InferStatus status) {
  // Only names the server knows become label values: a client sending requests for
  // random model names must not grow the metrics without bound.
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = models_.find(model);
    known = it != models_.end() &&
            (version.empty() || std::any_of(it->second.versions.begin(), it->second.versions.end(),
                                            [&](const auto& v) { return std::to_string(v.first) == version; }));
  }
  Count(known ? model : std::string("<unknown>"), known ? version : std::string(), status);
  // Refused before it was queued (bad input): no time of its own to report.
  if (known && !version.empty() && status != InferStatus::kOk) statistics_.Failed(model, std::stoll(version), 0);
}

void ServerCore::Count(const std::string& model, const std::string& version, InferStatus status) {
  metrics_.Add("trainyard_serve_requests_total",
               {{"model", model}, {"version", version}, {"outcome", OutcomeName(status)}});
}

void ServerCore::Finished(const InferRequest& request, InferStatus status) {
  const std::string& model = request.meta().model;
  const int64_t version = request.meta().version;
  Count(model, std::to_string(version), status);
  const double total_ms = MsBetween(request.arrival(), ServeClock::now());
  if (status != InferStatus::kOk) {
    statistics_.Failed(model, version, total_ms);
    return;
  }
  metrics_.Observe("trainyard_serve_request_seconds", {{"model", model}}, total_ms / 1000.0);
  statistics_.Succeeded(model, version, int64_t(request.rows().size()), total_ms, request.queue_ms(),
                        request.compute_ms());
}

std::vector<VersionStatistics> ServerCore::Statistics(const std::string& model, const std::string& version,
                                                      InferStatus* status, std::string* message) const {
  std::vector<std::pair<std::string, int64_t>> wanted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, slot] : models_) {
      if (!model.empty() && name != model) continue;
      for (const auto& entry : slot.versions)
        if (version.empty() || std::to_string(entry.first) == version) wanted.emplace_back(name, entry.first);
    }
    if (!model.empty() && !models_.count(model)) {
      *status = InferStatus::kNotFound;
      *message = "unknown model '" + model + "'";
      return {};
    }
  }
  if (wanted.empty() && !version.empty()) {
    *status = InferStatus::kNotFound;
    *message = "model '" + model + "' has no version '" + version + "'";
    return {};
  }
  std::vector<VersionStatistics> out;
  out.reserve(wanted.size());
  for (const auto& [name, number] : wanted) out.push_back(statistics_.Read(name, number));
  *status = InferStatus::kOk;
  return out;
}

// --- The dispatcher -------------------------------------------------------------------

void ServerCore::AnswerDead(ServeClock::time_point now) {
  for (const RequestPtr& r : batcher_.TakeDead(now)) {
    const InferStatus status = r->cancelled() ? InferStatus::kCancelled : InferStatus::kExpired;
    r->Finish(status, status == InferStatus::kCancelled ? "cancelled by the client" : "deadline passed while queued");
    Finished(*r, status);
  }
}

// A request whose client has gone, or whose deadline passes before its batch would
// finish, is answered now (cancelled, expired) rather than computed for nobody.
void ServerCore::DropHopeless(Batch* batch, ServeClock::time_point now) {
  // The same margin as admission: a batch that ends late answers everyone in it late.
  const double batch_ms = (double(batch->request_tokens()) * ms_per_token_ + ms_per_batch_) * kEstimateMargin;
  std::vector<RequestPtr> keep;
  for (RequestPtr& r : batch->requests) {
    if (r->cancelled() || r->ClientGone()) {
      r->Cancel();
      r->Finish(InferStatus::kCancelled, "cancelled by the client");
      Finished(*r, InferStatus::kCancelled);
    } else if (MsBetween(now, r->deadline()) < batch_ms) {
      r->Finish(InferStatus::kExpired, "the deadline would pass before the batch finished");
      Finished(*r, InferStatus::kExpired);
    } else {
      keep.push_back(std::move(r));
    }
  }
  const bool dropped = keep.size() != batch->requests.size();
  batch->requests = std::move(keep);
  if (!dropped) return;
  batch->rows = batch->seq = 0;
  for (const RequestPtr& r : batch->requests) {
    batch->rows += int(r->rows().size());
    batch->seq = std::max(batch->seq, r->longest());
  }
}

void ServerCore::UnloadRetired() {
  for (auto& [model, slot] : models_)
    for (auto& [number, v] : slot.versions) {
      if (!v.retiring || v.state != VersionState::kReady) continue;
      const bool running = in_flight_ && in_flight_->batch.meta == v.meta;
      if (running || batcher_.CountFor(v.meta.get()) > 0) continue;
      // A request resolved to this version before it retired, and still being decoded
      // and tokenized on a transport thread, holds a reference to its meta and has not
      // reached the batcher yet: unloading now would answer it "not loaded" (500). Under
      // mutex_ no new reference can appear (Resolve no longer returns a retiring version),
      // so a count of 1, the version table's own, means nothing will run on it again.
      if (v.meta.use_count() > 1) continue;
      link_->SendUnload(*v.meta);
      v.state = VersionState::kUnavailable;
      metrics_.Set("trainyard_serve_model_ready", {{"model", model}, {"version", std::to_string(number)}}, 0);
      LogInfo("serve: unloaded " + model + " version " + std::to_string(number) + " (" + v.reason + ")");
    }
}

void ServerCore::DispatchOnce(std::unique_lock<std::mutex>& lock) {
  while (!commands_.empty()) {
    commands_.front()();
    commands_.pop_front();
  }
  const auto now = ServeClock::now();
  if (now - last_sweep_ >= kSweepPeriod) {  // not on every wake: both walk the queue
    batcher_.SweepGone(kSweepBudget);
    AnswerDead(now);
    last_sweep_ = now;
  }
  ServeClock::time_point wake = now + std::chrono::milliseconds(kIdleWaitMs);
  if (!in_flight_) {
    if (std::optional<Batch> batch = batcher_.Next(now, &wake)) {
      DropHopeless(&*batch, now);
      if (!batch->requests.empty()) {
        InFlight flight{next_batch_id_++, std::move(*batch), now};
        link_->SendRun(flight.id, flight.batch);
        for (const RequestPtr& r : flight.batch.requests)
          metrics_.Observe("trainyard_serve_queue_seconds", {{"model", r->meta().model}},
                           MsBetween(r->arrival(), now) / 1000.0);
        in_flight_ = std::move(flight);
      } else {
        wake = now;  // look for the next batch at once
      }
    }
  }
  UnloadRetired();
  const bool expect_reply = in_flight_ || loads_pending_ > 0;
  int wait_ms = std::clamp(int(std::ceil(MsBetween(now, wake))), 0, kIdleWaitMs);
  if (batcher_.size() > 0) wait_ms = std::min<int>(wait_ms, int(kSweepPeriod.count()));
  if (!expect_reply) {
    if (commands_.empty() && batcher_.size() == 0)
      wake_.wait_for(lock, std::chrono::milliseconds(kIdleWaitMs));
    else if (wait_ms > 0)
      wake_.wait_for(lock, std::chrono::milliseconds(wait_ms));
    return;
  }
  lock.unlock();
  // While only a load is pending, requests may arrive: look back soon.
  std::optional<LinkReply> reply = link_->Receive(in_flight_ ? kIdleWaitMs : std::clamp(wait_ms, 1, 5));
  lock.lock();
  if (reply) HandleReply(*reply);
}

void ServerCore::DispatchLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    try {
      DispatchOnce(lock);
    } catch (const std::exception& e) {
      LogError(std::string("serve: dispatcher: ") + e.what());
      if (!lock.owns_lock()) lock.lock();
    }
  }
}

void ServerCore::HandleReply(const LinkReply& reply) {
  if (reply.op == "result") FinishBatch(reply);
  if (reply.op == "loaded") FinishLoad(reply);
}

void ServerCore::FinishBatch(const LinkReply& reply) {
  if (!in_flight_ || reply.id != in_flight_->id) return;
  InFlight flight = std::move(*in_flight_);
  in_flight_.reset();
  const Batch& batch = flight.batch;
  const std::string model = batch.meta->model, version = std::to_string(batch.meta->version);
  const size_t labels = batch.meta->labels.size();
  if (!reply.ok || reply.logits.size() != size_t(batch.rows) * labels) {
    const std::string error =
        reply.ok ? std::string("the model process answered a batch of the wrong size") : reply.error;
    LogError("serve: batch of " + model + " version " + version + " failed: " + error);
    for (const RequestPtr& r : batch.requests) {
      r->Finish(InferStatus::kFailed, error);
      Finished(*r, InferStatus::kFailed);
    }
    return;
  }
  const double compute_ms = reply.compute_ms;
  statistics_.Executed(model, batch.meta->version, batch.rows, compute_ms);
  // The cost model: the time per queued token (a request's rows x its longest row, the
  // unit the queue is counted in; the padding a batch adds on top is part of the cost),
  // as the 90th percentile of the last batches, since the rate a CPU sustains moves with
  // whatever else runs on it and an admitted request must not miss. A batch's time
  // runs from the later of its sending and the previous batch's answer to its own
  // answer: under load that is the whole cycle (the link, the model process, and the
  // dispatcher's own gap between batches, all of which the queue waits through). The
  // per-batch overhead stays at what warm-up measured.
  const auto now = ServeClock::now();
  const double cycle_ms = MsBetween(std::max(flight.sent, last_answer_), now);
  last_answer_ = now;
  const double per_token =
      std::max(0.0, cycle_ms - ms_per_batch_) / double(std::max<int64_t>(1, batch.request_tokens()));
  recent_costs_.push_back(per_token);
  if (recent_costs_.size() > kCostWindow) recent_costs_.pop_front();
  std::vector<double> sorted(recent_costs_.begin(), recent_costs_.end());
  std::sort(sorted.begin(), sorted.end());
  ms_per_token_ = sorted[sorted.size() * 9 / 10];
  metrics_.Set("trainyard_serve_cost_ms_per_token", {}, ms_per_token_);
  metrics_.Observe("trainyard_serve_batch_rows", {{"model", model}}, batch.rows);
  metrics_.Add("trainyard_serve_real_tokens_total", {{"model", model}}, double(batch.real_tokens()));
  metrics_.Add("trainyard_serve_padded_tokens_total", {{"model", model}}, double(batch.padded_tokens()));
  size_t row = 0;
  for (const RequestPtr& r : batch.requests) {
    const size_t n = r->rows().size();
    std::vector<float> logits(reply.logits.begin() + row * labels, reply.logits.begin() + (row + n) * labels);
    row += n;
    metrics_.Add("trainyard_serve_computed_requests_total", {{"model", model}, {"version", version}});
    metrics_.Observe("trainyard_serve_compute_seconds", {{"model", model}}, compute_ms / 1000.0);
    r->SetTimings(MsBetween(r->arrival(), flight.sent), compute_ms, batch.rows);
    r->Finish(InferStatus::kOk, "", std::move(logits));
    Finished(*r, r->cancelled() ? InferStatus::kCancelled : InferStatus::kOk);
  }
}

void ServerCore::FinishLoad(const LinkReply& reply) {
  --loads_pending_;
  const std::string& model = reply.model;
  const int64_t number = reply.version;
  auto m = models_.find(model);
  if (m == models_.end() || !m->second.versions.count(number)) return;
  VersionSlot& v = m->second.versions[number];
  const std::string name = model + " version " + std::to_string(number);
  if (!reply.ok) {
    v.state = VersionState::kUnavailable;
    v.reason = reply.error.empty() ? "load failed" : reply.error;
    LogWarn("serve: " + name + " refused: " + v.reason);
  } else {
    v.state = VersionState::kReady;
    if (reply.ms_per_token >= 0) {
      ms_per_token_ = std::max(ms_per_token_, reply.ms_per_token);
      ms_per_batch_ = reply.ms_per_batch;
    }
    metrics_.Set("trainyard_serve_model_ready", {{"model", model}, {"version", std::to_string(number)}}, 1);
    // The newest ready version serves; the ones it replaces retire (this one too, if a
    // newer one finished loading first).
    if (m->second.unloaded) {
      v.retiring = true;
      v.reason = "unloaded by request";
    }
    const int64_t serving = ServingVersion(m->second);
    for (auto& [other, slot] : m->second.versions)
      if (other < serving && slot.state == VersionState::kReady && !slot.retiring) {
        slot.retiring = true;
        slot.reason = "replaced by version " + std::to_string(serving);
      }
    LogInfo("serve: " + name + " ready (warm-up " + reply.warm_ms + " ms)");
  }
  load_done_.notify_all();
}

std::string ServerCore::RenderMetrics() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    metrics_.Set("trainyard_serve_queue_depth", {}, double(batcher_.size()));
  }
  metrics_.Set("trainyard_serve_resident_bytes", {{"process", "frontend"}}, ResidentBytes(::getpid()));
  metrics_.Set("trainyard_serve_resident_bytes", {{"process", "model"}}, ResidentBytes(::getppid()));
  return metrics_.Render();
}

}  // namespace trainyard
