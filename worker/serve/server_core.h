// The serving core: the model repository's state, admission, the batching dispatcher and
// the link to the model process. The transports (http_server.h, grpc_service.h) call it
// from their threads; it owns two threads of its own.
//
// Life cycle of a model version. The poller (every serve.poll_s) and the repository
// extension's load request find version folders. A version is read here first (config,
// tokenizer, safetensors check: ReadVersion, off the I/O threads); then the model
// process loads it, runs one forward pass per warm-up shape, and answers. Until then the
// version is LOADING and the one being served keeps serving. A version that loads
// becomes READY; if it is the model's newest, it serves every request that names no
// version from then on, and the version it replaces retires: requests already queued
// for it or running on it finish on it, and only then is it unloaded (zero-drop
// reload). A version that fails is UNAVAILABLE with the reason in the index and the log;
// it is tried again only when its folder changes. A folder modified in the last second
// is left until it settles, so a copy in progress is not read half-written.
//
// Admission. A request is rejected at once (429) when the queue is full, or when the
// work queued ahead of it, at the measured cost per padded token, would end after its
// deadline. Queued requests whose deadline passes anyway, or would pass before their
// batch finished, are answered 504 and not computed; cancelled ones are dropped and never
// computed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics.h"
#include "common/spec/job_spec.h"
#include "worker/serve/batcher.h"
#include "worker/serve/infer_request.h"
#include "worker/serve/model_link.h"
#include "worker/serve/model_repository.h"
#include "worker/serve/statistics.h"

namespace trainyard {

enum class VersionState { kLoading, kReady, kUnavailable };
const char* StateName(VersionState state);  // READY, LOADING, UNAVAILABLE

struct IndexEntry {
  std::string model;
  int64_t version = 0;
  VersionState state = VersionState::kUnavailable;
  std::string reason;
};

class ServerCore {
 public:
  // REQUIRES: the model process is listening on `link_endpoint`.
  ServerCore(ServeSpec spec, const std::string& link_endpoint);
  ~ServerCore();

  // Loads each model's newest version and starts the dispatcher and the poller.
  void Start();
  // Stops the threads and tells the model process to end. Idempotent.
  void Stop();

  bool live() const { return live_.load(); }
  // Every model known and not unloaded has a READY version.
  bool ready() const;

  // The version a request for (model, version) runs on: `version` empty means the one
  // serving. On failure returns null with *status and *message set.
  std::shared_ptr<const VersionMeta> Resolve(const std::string& model, const std::string& version, InferStatus* status,
                                             std::string* message) const;
  bool ModelReady(const std::string& model, const std::string& version) const;
  std::vector<int64_t> ReadyVersions(const std::string& model) const;
  std::vector<IndexEntry> Index(bool ready_only) const;

  // The repository extension. Load reads the model's folder, loads its newest version
  // and waits for the outcome; Unload retires every version. Both return kOk, or
  // kNotFound / kBadInput with *message.
  InferStatus Load(const std::string& model, std::string* message);
  InferStatus Unload(const std::string& model, std::string* message);

  // Queues `request`, or answers it at once (kRejected); either way it gets finished.
  void Submit(const RequestPtr& request);
  // Counts an outcome decided before Submit (a bad request, an unknown model: counted as
  // model "<unknown>"). REQUIRES: mutex_ not held.
  void Record(const std::string& model, const std::string& version, InferStatus status);

  // Triton's statistics extension (statistics.h): every version the repository knows of
  // `model` (of every model when `model` is empty), or only `version`. An unknown model
  // or version returns nothing, with *status kNotFound and *message.
  std::vector<VersionStatistics> Statistics(const std::string& model, const std::string& version, InferStatus* status,
                                            std::string* message) const;

  const ServeSpec& spec() const { return spec_; }
  Metrics& metrics() { return metrics_; }
  // The metrics text, with the gauges (queue depth, memory) refreshed.
  std::string RenderMetrics();

 private:
  struct VersionSlot {
    VersionState state = VersionState::kLoading;
    std::string reason;
    std::shared_ptr<const VersionMeta> meta;
    std::string signature;  // the folder's files, sizes and times when last read
    bool retiring = false;  // replaced or unloaded: unload once nothing runs on it
  };
  struct ModelSlot {
    std::map<int64_t, VersionSlot> versions;
    bool unloaded = false;  // by request: the poller leaves it alone until loaded again
  };
  struct InFlight {
    uint64_t id = 0;
    Batch batch;
    ServeClock::time_point sent;
  };

  void DispatchLoop();
  void PollLoop();
  void DispatchOnce(std::unique_lock<std::mutex>& lock);
  void HandleReply(const LinkReply& reply);
  void FinishBatch(const LinkReply& reply);
  void FinishLoad(const LinkReply& reply);
  void UnloadRetired();
  void DropHopeless(Batch* batch, ServeClock::time_point now);
  void AnswerDead(ServeClock::time_point now);
  // REQUIRES: mutex_ held. Reads the version and posts its load; false if read failed.
  bool StartLoad(const RepositoryEntry& entry, const std::string& signature);
  void PollRepository(bool initial);
  int64_t ServingVersion(const ModelSlot& slot) const;
  double EstimateWaitMs(const InferRequest& request, ServeClock::time_point now) const;
  std::vector<std::pair<int, int>> WarmShapes(const VersionMeta& meta) const;
  void DeclareMetrics();
  void Finished(const InferRequest& request, InferStatus status);
  void Count(const std::string& model, const std::string& version, InferStatus status);

  const ServeSpec spec_;
  Metrics metrics_;
  StatisticsBook statistics_;
  std::unique_ptr<ModelLink> link_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;       // the dispatcher: requests, commands
  std::condition_variable load_done_;  // Load(): a version left LOADING
  std::map<std::string, ModelSlot> models_;
  Batcher batcher_;
  std::deque<std::function<void()>> commands_;  // link sends, run by the dispatcher
  std::optional<InFlight> in_flight_;
  int loads_pending_ = 0;
  uint64_t next_batch_id_ = 1;
  double ms_per_token_ = 0.01, ms_per_batch_ = 1;  // the cost model, refined by every batch
  ServeClock::time_point last_answer_, last_sweep_;
  std::deque<double> recent_costs_;  // ms per queued token of the last batches

  std::atomic<bool> live_{false}, stopping_{false};
  std::thread dispatcher_, poller_;
};

}  // namespace trainyard
