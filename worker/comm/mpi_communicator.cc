#include "worker/comm/mpi_communicator.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#ifdef TRAINYARD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <unistd.h>

#include <cstring>
#include <sstream>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "worker/comm/mpi_check.h"

namespace trainyard {
namespace {

constexpr int kStatusRequestTag = 101, kStatusReplyTag = 102;
constexpr auto kAttributionWindow = std::chrono::milliseconds(1500);
constexpr auto kPeerReportGrace = std::chrono::milliseconds(1000);

// Sums 16-bit floats (fp16 or bf16, which MPI has no type for) in fp32, element by
// element, rounding each sum back.
template <typename Float16>
void Float16Sum(void* in, void* inout, int* length, MPI_Datatype*) {
  auto* a = static_cast<const Float16*>(in);
  auto* b = static_cast<Float16*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = static_cast<float>(a[i]) + static_cast<float>(b[i]);
}

template <typename Float16>
MPI_Op Float16SumOp() {
  static MPI_Op op = [] {
    MPI_Op created;
    MPI_Op_create(&Float16Sum<Float16>, /*commute=*/1, &created);
    return created;
  }();
  return op;
}

MPI_Datatype MpiType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat:
      return MPI_FLOAT;
    case torch::kDouble:
      return MPI_DOUBLE;
    case torch::kInt:
      return MPI_INT;
    case torch::kLong:
      return MPI_INT64_T;
    case torch::kHalf:
    case torch::kBFloat16:
      return MPI_UINT16_T;
    case torch::kByte:
      return MPI_UINT8_T;
    default:
      throw std::runtime_error(std::string("MPI backend: unsupported dtype ") + c10::toString(type));
  }
}

MPI_Op MpiOp(ReduceOp op, torch::ScalarType type) {
  if (type == torch::kHalf || type == torch::kBFloat16) {
    if (op != ReduceOp::kSum)
      throw std::runtime_error(std::string("MPI backend: ") + c10::toString(type) + " supports sum only");
    return type == torch::kHalf ? Float16SumOp<c10::Half>() : Float16SumOp<c10::BFloat16>();
  }
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

}  // namespace

// What a rank says about itself when asked during hang attribution.
struct MpiCommunicator::Status {
  int64_t started = 0;         // this communicator's collectives started
  int64_t device_started = 0;  // a layered device communicator's collectives issued
  char what[112] = {};
  char device_what[112] = {};
};

struct MpiCommunicator::Operation : public Work {
  bool is_broadcast = false;
  bool unbounded = false;  // AwaitBroadcast: no deadline
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  int64_t number = 0;
  std::string what;
  torch::Tensor user;  // the caller's tensor
  torch::Tensor host;  // what MPI reads and writes (user itself on CPU, else pinned)
#ifdef TRAINYARD_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAEvent> staged;  // recorded after the copy into `host`
#endif
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;

  void Wait() override {
    std::unique_lock<std::mutex> lock(mutex);
    done_cv.wait(lock, [&] { return done; });
    if (error) std::rethrow_exception(error);
    // Queued on the caller's stream; the caching host allocator keeps the pinned block
    // from reuse until the copy has run.
    if (!user.is_cpu()) user.copy_(host, /*non_blocking=*/true);
  }
  // On the comm thread, before MPI touches `host`.
  void WaitUntilStaged() {
#ifdef TRAINYARD_WITH_CUDA
    if (staged) staged->synchronize();
#endif
  }
  void Finish(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    error = std::move(e);
    done_cv.notify_all();
  }
};

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s) : timeout_(timeout_s) {
  TY_MPI_CHECK(MPI_Comm_dup(comm, &data_comm_));
  TY_MPI_CHECK(MPI_Comm_dup(comm, &control_comm_));
  TY_MPI_CHECK(MPI_Comm_rank(data_comm_, &rank_));
  TY_MPI_CHECK(MPI_Comm_size(data_comm_, &size_));
  GatherHosts();
  thread_ = std::thread([this] { Loop(); });
}

void MpiCommunicator::GatherHosts() {
  constexpr int kHostChars = 256;
  char mine[kHostChars] = {};
  ::gethostname(mine, sizeof mine - 1);
  std::vector<char> all(static_cast<size_t>(size_) * kHostChars);
  TY_MPI_CHECK(MPI_Allgather(mine, kHostChars, MPI_CHAR, all.data(), kHostChars, MPI_CHAR, data_comm_));
  for (int r = 0; r < size_; ++r) hosts_.emplace_back(&all[static_cast<size_t>(r) * kHostChars]);
}

std::string MpiCommunicator::Host(int rank) const {
  return rank >= 0 && rank < size_ ? hosts_[static_cast<size_t>(rank)] : "?";
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  MPI_Comm_free(&data_comm_);
  MPI_Comm_free(&control_comm_);
}

std::shared_ptr<Work> MpiCommunicator::AllReduceAsync(torch::Tensor tensor, ReduceOp op, std::string what) {
  auto operation = std::make_shared<Operation>();
  operation->op = op;
  operation->what = std::move(what);
  operation->user = std::move(tensor);
  return Enqueue(operation);
}

std::shared_ptr<Work> MpiCommunicator::BroadcastAsync(torch::Tensor tensor, int root, std::string what) {
  auto operation = std::make_shared<Operation>();
  operation->is_broadcast = true;
  operation->root = root;
  operation->what = std::move(what);
  operation->user = std::move(tensor);
  return Enqueue(operation);
}

void MpiCommunicator::AwaitBroadcast(torch::Tensor tensor, int root, std::string what) {
  if (!tensor.is_cpu()) throw std::invalid_argument("AwaitBroadcast takes a CPU tensor");
  auto operation = std::make_shared<Operation>();
  operation->is_broadcast = true;
  operation->unbounded = true;
  operation->root = root;
  operation->what = std::move(what);
  operation->user = std::move(tensor);
  Enqueue(operation)->Wait();
}

std::shared_ptr<Work> MpiCommunicator::Enqueue(std::shared_ptr<Operation> operation) {
  if (!operation->user.is_contiguous()) throw std::invalid_argument("collective on a non-contiguous tensor");
  if (operation->user.is_cpu()) {
    operation->host = operation->user;
  } else {
    operation->host =
        torch::empty(operation->user.sizes(), operation->user.options().device(torch::kCPU).pinned_memory(true));
    operation->host.copy_(operation->user, /*non_blocking=*/true);
#ifdef TRAINYARD_WITH_CUDA
    operation->staged = std::make_unique<at::cuda::CUDAEvent>();
    operation->staged->record(c10::cuda::getCurrentCUDAStream(operation->user.device().index()));
#endif
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    operation->number = ++issued_;
    queue_.push_back(operation);
  }
  wake_.notify_all();
  return operation;
}

void MpiCommunicator::Loop() {
  while (true) {
    std::shared_ptr<Operation> operation;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, std::chrono::milliseconds(2),
                     [&] { return stopping_ || !queue_.empty() || device_failure_; });
      if (stopping_ && queue_.empty()) return;
      if (!queue_.empty()) {
        operation = queue_.front();
        queue_.pop_front();
      }
    }
    try {
      HandleDeviceFailure();
      ServeStatusRequests();
      if (operation) Execute(*operation);
    } catch (...) {
      if (operation) operation->Finish(std::current_exception());
      continue;
    }
    if (operation) operation->Finish(nullptr);
  }
}

void MpiCommunicator::Execute(Operation& operation) {
  operation.WaitUntilStaged();
  started_ = operation.number;
  current_ = operation.what;
  torch::Tensor& t = operation.host;
  const int count = static_cast<int>(t.numel());
  MPI_Request request;
  if (operation.is_broadcast) {
    TY_MPI_CHECK(MPI_Ibcast(t.data_ptr(), count, MpiType(t.scalar_type()), operation.root, data_comm_, &request));
  } else {
    TY_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), count, MpiType(t.scalar_type()),
                                MpiOp(operation.op, t.scalar_type()), data_comm_, &request));
  }
  const auto start = Clock::now();
  const auto deadline =
      operation.unbounded ? Clock::time_point::max() : start + std::chrono::duration_cast<Clock::duration>(timeout_);
  for (int polls = 0;; ++polls) {
    int done = 0;
    TY_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    // Spin briefly for latency, then poll gently so compute keeps the cores.
    if (polls > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
    if ((polls & 63) == 0) {
      HandleDeviceFailure();
      ServeStatusRequests();
      if (Clock::now() > deadline) {
        // How long this rank waited, taken before AttributeHang asks the others (which
        // waits for their answers).
        const std::string error = StrFormat("rank %s: collective #%ld (%s) timed out after %.1f s",
                                            RankName(rank_).c_str(), long(operation.number), operation.what.c_str(),
                                            std::chrono::duration<double>(Clock::now() - start).count());
        ReportAndAbort(error + AttributeHang(operation.number, /*device=*/false));
      }
    }
  }
}

void MpiCommunicator::ServeStatusRequests() {
  while (true) {
    int flag = 0;
    MPI_Status probe;
    MPI_Iprobe(MPI_ANY_SOURCE, kStatusRequestTag, control_comm_, &flag, &probe);
    if (!flag) return;
    int64_t asked_about = 0;
    MPI_Recv(&asked_about, 1, MPI_INT64_T, probe.MPI_SOURCE, kStatusRequestTag, control_comm_, MPI_STATUS_IGNORE);
    Status status;
    status.started = started_;
    std::strncpy(status.what, current_.c_str(), sizeof(status.what) - 1);
    DeviceProgress device_progress;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      device_progress = device_progress_;
    }
    if (device_progress) {
      auto [issued, what] = device_progress();
      status.device_started = issued;
      std::strncpy(status.device_what, what.c_str(), sizeof(status.device_what) - 1);
    }
    MPI_Send(&status, sizeof(Status), MPI_BYTE, probe.MPI_SOURCE, kStatusReplyTag, control_comm_);
  }
}

std::string MpiCommunicator::AttributeHang(int64_t number, bool device) {
  std::vector<Status> replies(size_);
  std::vector<MPI_Request> receives(size_, MPI_REQUEST_NULL);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request send;
    MPI_Isend(&number, 1, MPI_INT64_T, r, kStatusRequestTag, control_comm_, &send);
    MPI_Request_free(&send);
    MPI_Irecv(&replies[r], sizeof(Status), MPI_BYTE, r, kStatusReplyTag, control_comm_, &receives[r]);
  }
  std::vector<bool> answered(size_, false);
  answered[rank_] = true;
  const auto until = Clock::now() + kAttributionWindow;
  while (Clock::now() < until) {
    bool all = true;
    for (int r = 0; r < size_; ++r) {
      if (answered[r]) continue;
      int done = 0;
      MPI_Test(&receives[r], &done, MPI_STATUS_IGNORE);
      answered[r] = done != 0;
      all = all && answered[r];
    }
    if (all) break;
    ServeStatusRequests();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::ostringstream culprits;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (!answered[r]) {
      culprits << "; rank " << RankName(r) << " did not reach it (no answer: stopped, hung or dead)";
      MPI_Cancel(&receives[r]);
    } else {
      const int64_t reached = device ? replies[r].device_started : replies[r].started;
      const char* what = device ? replies[r].device_what : replies[r].what;
      if (reached < number)
        culprits << "; rank " << RankName(r) << " did not reach it (busy outside communication after collective #"
                 << reached << (what[0] ? std::string(" (") + what + ")" : "") << ")";
    }
  }
  std::string names = culprits.str();
  return names.empty() ? "; every rank reached it (a stalled transport?)" : names;
}

void MpiCommunicator::ServeFor(std::chrono::milliseconds duration) {
  const auto until = Clock::now() + duration;
  while (Clock::now() < until) {
    ServeStatusRequests();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void MpiCommunicator::SetDeviceProgress(DeviceProgress probe) {
  std::lock_guard<std::mutex> lock(mutex_);
  device_progress_ = std::move(probe);
}

void MpiCommunicator::SetAbortNotice(AbortNotice notice) {
  std::lock_guard<std::mutex> lock(mutex_);
  abort_notice_ = std::move(notice);
}

void MpiCommunicator::AbortForDeviceFailure(std::string error, int64_t hung_number) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!device_failure_) device_failure_ = DeviceFailure{std::move(error), hung_number};
  }
  wake_.notify_all();
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));  // the comm thread ends the process
}

void MpiCommunicator::HandleDeviceFailure() {
  std::optional<DeviceFailure> failure;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!device_failure_) return;
    failure = device_failure_;
  }
  std::string report = failure->error;
  if (failure->hung_number > 0) report += AttributeHang(failure->hung_number, /*device=*/true);
  ReportAndAbort(report);
}

void MpiCommunicator::ReportAndAbort(const std::string& error) {
  LogError(error);
  AbortNotice notice;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    notice = abort_notice_;
  }
  if (notice) {
    try {
      notice(error);
    } catch (const std::exception& e) {
      LogWarn(std::string("could not pass this report on before aborting: ") + e.what());
    }
  }
  // Peers that time out next ask this rank for its status; answer them for a moment so
  // their reports can name the right ranks too.
  ServeFor(std::chrono::duration_cast<std::chrono::milliseconds>(kPeerReportGrace));
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

}  // namespace trainyard
