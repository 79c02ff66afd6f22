#include "worker/jobs/serve.h"

#include <malloc.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <zmq.hpp>

#include "common/atomic_file.h"
#include "common/log.h"
#include "worker/models/hf_checkpoint.h"
#include "worker/train/amp.h"

extern char** environ;

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// serve_frontend beside this executable.
std::string FrontEndPath() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  const fs::path path = self.parent_path() / "serve_frontend";
  if (error || !fs::exists(path))
    throw InputError("kind: serve needs serve_frontend beside the worker (" + path.string() +
                     "); it is built where Boost and gRPC are installed (scripts/setup.sh)");
  return path.string();
}

void SendJson(zmq::socket_t& socket, const nlohmann::json& header, zmq::message_t* payload = nullptr) {
  const std::string text = header.dump();
  socket.send(zmq::buffer(text), payload ? zmq::send_flags::sndmore : zmq::send_flags::none);
  if (payload) socket.send(*payload, zmq::send_flags::none);
}

// ms = per_batch + per_token * tokens, fitted by least squares to the warm-up passes.
void FitCost(const std::vector<std::pair<double, double>>& points, nlohmann::json* reply) {
  if (points.size() < 2) return;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : points) {
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double n = double(points.size()), denominator = n * sxx - sx * sx;
  if (denominator <= 0) return;
  const double slope = (n * sxy - sx * sy) / denominator;
  (*reply)["ms_per_token"] = std::max(slope, 1e-6);
  (*reply)["ms_per_batch"] = std::max((sy - slope * sx) / n, 0.0);
}

}  // namespace

ServeRunner::ServeRunner(JobSpec spec, RankContext ranks)
    : spec_(std::move(spec)), ranks_(ranks), device_(PrepareRuntime(spec_, ranks_)) {
  if (ranks_.world > 1) throw InputError(spec_.Where("kind") + ": kind: serve runs on one rank");
  front_end_path_ = FrontEndPath();
}

ServeRunner::~ServeRunner() {
  ReapLoaders(/*all=*/true);
  if (front_end_pid_ > 0) {
    ::kill(front_end_pid_, SIGKILL);
    ::waitpid(front_end_pid_, nullptr, 0);
  }
  if (!socket_dir_.empty()) {
    std::error_code ignored;
    fs::remove_all(socket_dir_, ignored);
  }
}

std::string ServeRunner::run_dir() const { return RunDir(spec_); }

std::string ServeRunner::Key(const nlohmann::json& header) {
  return header.value("model", "") + "/" + std::to_string(header.value("version", int64_t(0)));
}

// The front end parses the job as it ran (overrides applied), from a copy in the private
// socket folder, its relative paths against the job's own folder: the file the job came
// from may be on another host (a pool job's submitter) or say something else.
void ServeRunner::StartFrontEnd(const std::string& endpoint) {
  const std::string& program = front_end_path_;
  const std::string job_copy = socket_dir_ + "/job.yaml";
  WriteFileAtomically(job_copy, spec_.effective_yaml);
  std::vector<std::string> args{program,
                                job_copy,
                                "--source",
                                spec_.source_file,
                                "--base-dir",
                                spec_.base_dir.empty() ? std::string(".") : spec_.base_dir,
                                "--link",
                                endpoint,
                                "--parent",
                                std::to_string(::getpid()),
                                "--endpoints-file",
                                run_dir() + "/endpoints.json",
                                "--http-port",
                                std::to_string(spec_.serve.http_port),
                                "--grpc-port",
                                std::to_string(spec_.serve.grpc_port),
                                "--metrics-port",
                                std::to_string(spec_.serve.metrics_port)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (const int error = ::posix_spawn(&pid, program.c_str(), nullptr, nullptr, argv.data(), environ); error != 0)
    throw std::runtime_error("cannot start " + program + ": " + std::strerror(error));
  front_end_pid_ = pid;
}

namespace {

// Large buffers live in the CPU block cache (runtime.cpu_block_cache_mb), which bounds
// them. What glibc still holds (smaller blocks, and large ones when the cache is off) is
// handed back once its free part passes this much: not after every batch, which would
// make the next batch fault its pages in again.
constexpr size_t kMaxLooseHeapBytes = size_t(32) << 20;

void TrimLooseHeap() {
  if (::mallinfo2().fordblks > kMaxLooseHeapBytes) ::malloc_trim(0);
}

}  // namespace

nlohmann::json ServeRunner::LoadAndWarm(const nlohmann::json& request, Loaded* loaded) const {
  nlohmann::json reply = {
      {"op", "loaded"}, {"model", request.value("model", "")}, {"version", request.value("version", int64_t(0))}};
  const std::string path = request.value("path", "");
  try {
    const nlohmann::json config = ReadHfConfig(path);
    if (TaskOf(config) != ModelTask::kSequenceClassification)
      throw std::runtime_error("config.json: not a sequence classifier");
    Model model = CreateModel(config, ModelTask::kSequenceClassification);
    const std::vector<std::string> fresh = LoadHfWeights(path, *model);
    if (!fresh.empty())
      throw std::runtime_error("model.safetensors: no trained classifier head (" + fresh.front() +
                               " missing or of another shape)");
    model->to(device_);
    model->eval();
    Freeze(*model);
    torch::NoGradGuard no_grad;
    std::vector<std::pair<int64_t, int64_t>> shapes;
    for (const auto& shape : request.value("warm", nlohmann::json::array()))
      shapes.emplace_back(shape.at(0).get<int64_t>(), shape.at(1).get<int64_t>());
    std::vector<double> ms;
    if (device_.is_cuda() && spec_.serve.cuda_graphs && model->info().pad_id >= 0) {
      loaded->bucketed = std::make_shared<BucketedForward>(model, shapes, spec_.train.precision, true);
      ms = loaded->bucketed->Warm();
    } else {
      for (const auto& [rows, seq] : shapes) {
        auto ids = torch::randint(std::max<int64_t>(1, model->info().vocab_size), {rows, seq}, torch::kLong);
        auto mask = torch::ones({rows, seq}, torch::kLong);
        model->forward(ids.to(device_), mask.to(device_));  // the first pass of a shape allocates; time the second
        const auto start = Clock::now();
        model->forward(ids.to(device_), mask.to(device_)).cpu();
        ms.push_back(MsSince(start));
      }
    }
    std::vector<std::pair<double, double>> points;
    nlohmann::json warm_ms = nlohmann::json::array();
    for (size_t i = 0; i < shapes.size(); ++i) {
      warm_ms.push_back(ms[i]);
      points.emplace_back(double(shapes[i].first * shapes[i].second), ms[i]);
    }
    FitCost(points, &reply);
    reply["ok"] = true;
    reply["warm_ms"] = warm_ms;
    reply["labels"] = model->info().labels.size();
    loaded->labels = int64_t(model->info().labels.size());
    loaded->model = std::move(model);
  } catch (const std::exception& e) {
    reply["ok"] = false;
    reply["error"] = e.what();
  }
  return reply;
}

void ServeRunner::Load(const nlohmann::json& request) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread thread([this, request, done] {
    Loaded loaded;
    nlohmann::json reply = LoadAndWarm(request, &loaded);
    std::lock_guard<std::mutex> lock(loads_mutex_);
    finished_loads_.push_back({Key(request), std::move(reply), std::move(loaded)});
    *done = true;
  });
  loaders_.push_back({std::move(thread), done});
}

// Joins the loader threads that have finished (every one, when `all`), so that a server
// reloading for weeks does not keep a thread per load.
void ServeRunner::ReapLoaders(bool all) {
  for (auto it = loaders_.begin(); it != loaders_.end();) {
    if (all || *it->done) {
      if (it->thread.joinable()) it->thread.join();
      it = loaders_.erase(it);
    } else {
      ++it;
    }
  }
}

namespace {

// Waits up to `timeout` for a message; a signal ends the wait early (the caller's
// loop condition sees it).
bool PollFor(zmq::socket_t& socket, std::chrono::milliseconds timeout) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  try {
    return zmq::poll(&item, 1, timeout) > 0;
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return false;
    throw;
  }
}

std::vector<zmq::message_t> ReceiveFrames(zmq::socket_t& socket) {
  std::vector<zmq::message_t> frames;
  do {
    frames.emplace_back();
    (void)socket.recv(frames.back());
  } while (socket.get(zmq::sockopt::rcvmore));
  return frames;
}

}  // namespace

void ServeRunner::Serve(void* raw_socket) {
  zmq::socket_t& socket = *static_cast<zmq::socket_t*>(raw_socket);
  const auto signalled = [this] { return ranks_.stop_signal && ranks_.stop_signal->load(); };
  while (!signalled() && !StopAsked(ranks_)) {
    DeliverFinishedLoads(raw_socket);
    ReapLoaders(/*all=*/false);
    if (FrontEndEnded()) return;
    if (!PollFor(socket, std::chrono::milliseconds(20))) continue;
    std::vector<zmq::message_t> frames = ReceiveFrames(socket);
    const nlohmann::json header = nlohmann::json::parse(frames[0].to_string_view());
    const std::string op = header.value("op", "");
    if (op == "stop") return;
    if (op == "load") Load(header);
    if (op == "unload") models_.erase(Key(header));
    if (op == "run") AnswerRun(raw_socket, header, frames);
  }
}

void ServeRunner::DeliverFinishedLoads(void* raw_socket) {
  zmq::socket_t& socket = *static_cast<zmq::socket_t*>(raw_socket);
  std::lock_guard<std::mutex> lock(loads_mutex_);
  for (LoadOutcome& outcome : finished_loads_) {
    if (outcome.loaded.model) models_[outcome.key] = std::move(outcome.loaded);
    SendJson(socket, outcome.reply);
  }
  finished_loads_.clear();
}

bool ServeRunner::FrontEndEnded() {
  int status = 0;
  if (::waitpid(front_end_pid_, &status, WNOHANG) != front_end_pid_) return false;
  front_end_pid_ = -1;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code == 2) throw InputError("serve_frontend refused the job (see its message above)");
  if (code != 0) throw std::runtime_error("serve_frontend ended with code " + std::to_string(code));
  return true;
}

void ServeRunner::AnswerRun(void* raw_socket, const nlohmann::json& header, std::vector<zmq::message_t>& frames) {
  zmq::socket_t& socket = *static_cast<zmq::socket_t*>(raw_socket);
  nlohmann::json reply = {{"op", "result"}, {"id", header.value("id", uint64_t(0))}};
  try {
    auto it = models_.find(Key(header));
    if (it == models_.end()) throw std::runtime_error(Key(header) + " is not loaded");
    const int64_t rows = header.at("rows"), seq = header.at("seq");
    if (frames.size() != 3 || frames[1].size() != size_t(rows * seq * 8) || frames[2].size() != frames[1].size())
      throw std::runtime_error("a run message with the wrong frames");
    auto ids = torch::from_blob(frames[1].data(), {rows, seq}, torch::kLong);
    auto mask = torch::from_blob(frames[2].data(), {rows, seq}, torch::kLong);
    torch::NoGradGuard no_grad;
    const auto start = Clock::now();
    torch::Tensor logits;
    if (it->second.bucketed) {
      logits = it->second.bucketed->Forward(ids, mask);
    } else {
      AutocastScope autocast(device_.type(), spec_.train.precision);
      logits = it->second.model->forward(ids.to(device_), mask.to(device_)).to(torch::kFloat).cpu().contiguous();
    }
    TrimLooseHeap();
    reply["compute_ms"] = MsSince(start);
    reply["ok"] = true;
    zmq::message_t payload(logits.data_ptr<float>(), size_t(logits.numel()) * sizeof(float));
    SendJson(socket, reply, &payload);
    ++batches_;
    rows_ += rows;
  } catch (const std::exception& e) {
    reply["ok"] = false;
    reply["error"] = e.what();
    SendJson(socket, reply);
  }
}

nlohmann::json ServeRunner::Run() {
  fs::create_directories(run_dir());
  const std::string endpoints_file = run_dir() + "/endpoints.json";
  fs::remove(endpoints_file);  // a previous attempt's: the front end writes it once bound
  struct RemoveOnExit {
    std::string path;
    ~RemoveOnExit() {
      std::error_code ignored;
      fs::remove(path, ignored);  // nothing listens there any more
    }
  } remove_endpoints{endpoints_file};
  char dir_template[] = "/tmp/trainyard-serve-XXXXXX";  // 0700: only this user reaches the socket
  if (!::mkdtemp(dir_template)) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
  socket_dir_ = dir_template;
  const std::string endpoint = "ipc://" + socket_dir_ + "/model.sock";
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::pair);
  socket.set(zmq::sockopt::linger, 0);
  socket.bind(endpoint);
  StartFrontEnd(endpoint);
  LogInfo("serve: model process " + std::to_string(::getpid()) + ", front end " + std::to_string(front_end_pid_) +
          " (endpoints in " + run_dir() + "/endpoints.json)");
  Serve(&socket);
  if (front_end_pid_ > 0) {
    ::kill(front_end_pid_, SIGTERM);
    for (int i = 0; i < 500 && front_end_pid_ > 0; ++i) {
      if (::waitpid(front_end_pid_, nullptr, WNOHANG) == front_end_pid_)
        front_end_pid_ = -1;
      else
        ::usleep(10'000);
    }
  }
  LogInfo("serve: stopped after " + std::to_string(batches_) + " batches, " + std::to_string(rows_) + " rows");
  return {{"batches", batches_}, {"rows", rows_}};
}

}  // namespace trainyard
