// Runs a `serve` job: this process is the model process of worker/serve/model_link.h.
// It starts the torch-free front end (serve_frontend, next to the worker binary), which
// speaks HTTP and gRPC and batches, and then loads the model versions the front end
// asks for and runs its batches, until SIGINT/SIGTERM, a pool stop, or the front end's
// exit. One rank.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "worker/jobs/bucketed_forward.h"
#include "worker/jobs/job_setup.h"

namespace zmq {
class message_t;
}  // namespace zmq

namespace trainyard {

class ServeRunner {
 public:
  // Throws InputError for what cannot be served (several ranks).
  ServeRunner(JobSpec spec, RankContext ranks);
  ~ServeRunner();
  nlohmann::json Run();
  std::string run_dir() const;

 private:
  struct Loaded {
    Model model;
    int64_t labels = 0;
    std::shared_ptr<BucketedForward> bucketed;  // on a GPU: the passes at warm-up shapes
  };
  struct LoadOutcome {
    std::string key;
    nlohmann::json reply;
    Loaded loaded;
  };

  void StartFrontEnd(const std::string& endpoint);
  // The loop over the front end's messages on `socket` (a zmq::socket_t), until a stop
  // signal, a pool's stop, a "stop" message, or the front end's end.
  void Serve(void* socket);
  // Sends the replies of loads finished since the last call; their models join models_.
  void DeliverFinishedLoads(void* socket);
  // True once the front end exited cleanly; throws if it failed (InputError for exit 2).
  bool FrontEndEnded();
  // Answers a "run" message (header, ids, mask) with the batch's logits or an error.
  void AnswerRun(void* socket, const nlohmann::json& header, std::vector<zmq::message_t>& frames);
  void Load(const nlohmann::json& request);
  nlohmann::json LoadAndWarm(const nlohmann::json& request, Loaded* loaded) const;
  static std::string Key(const nlohmann::json& header);

  JobSpec spec_;
  RankContext ranks_;
  torch::Device device_{torch::kCPU};
  std::string front_end_path_;
  std::string socket_dir_;
  int front_end_pid_ = -1;
  std::map<std::string, Loaded> models_;  // "model/version"; the serving thread's
  std::mutex loads_mutex_;
  std::vector<LoadOutcome> finished_loads_;
  struct Loader {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  void ReapLoaders(bool all);
  std::vector<Loader> loaders_;
  int64_t batches_ = 0, rows_ = 0;
};

}  // namespace trainyard
