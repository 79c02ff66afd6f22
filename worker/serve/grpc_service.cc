#include "worker/serve/grpc_service.h"

#include "worker/serve/infer_codec.h"
#include "worker/serve/kserve_http.h"
#include "worker/serve/model_config.h"

namespace trainyard {
namespace {

grpc::Status StatusOf(InferStatus status, const std::string& message) {
  switch (status) {
    case InferStatus::kOk:
      return grpc::Status::OK;
    case InferStatus::kBadInput:
      return {grpc::StatusCode::INVALID_ARGUMENT, message};
    case InferStatus::kNotFound:
      return {grpc::StatusCode::NOT_FOUND, message};
    case InferStatus::kUnavailable:
      return {grpc::StatusCode::UNAVAILABLE, message};
    case InferStatus::kRejected:
      return {grpc::StatusCode::RESOURCE_EXHAUSTED, message};
    case InferStatus::kExpired:
      return {grpc::StatusCode::DEADLINE_EXCEEDED, message};
    case InferStatus::kCancelled:
      return {grpc::StatusCode::CANCELLED, message};
    case InferStatus::kFailed:
      return {grpc::StatusCode::INTERNAL, message};
  }
  return {grpc::StatusCode::INTERNAL, message};
}

// An input's elements from its contents, or from its raw_input_contents entry.
TensorIn DecodeInput(const inference::ModelInferRequest::InferInputTensor& input, const std::string* raw) {
  TensorIn t;
  t.name = input.name();
  t.datatype = input.datatype();
  t.shape.assign(input.shape().begin(), input.shape().end());
  ElementCount(t.shape, t.name);  // throws for a negative or huge shape
  const bool bytes = t.datatype == "BYTES";
  const bool int64 = t.datatype == "INT64", int32 = t.datatype == "INT32";
  if (!bytes && !int64 && !int32)
    throw InferInputError("input '" + t.name + "': datatype " + t.datatype + " not accepted (BYTES, INT64)");
  if (raw) {
    RawElements(*raw, &t);
    return t;
  }
  const auto& c = input.contents();
  if (bytes) t.bytes.assign(c.bytes_contents().begin(), c.bytes_contents().end());
  if (int64) t.ints.assign(c.int64_contents().begin(), c.int64_contents().end());
  if (int32) t.ints.assign(c.int_contents().begin(), c.int_contents().end());
  return t;
}

InferCall DecodeCall(const inference::ModelInferRequest& request) {
  InferCall call;
  call.model = request.model_name();
  call.version = request.model_version();
  call.id = request.id();
  const bool raw = request.raw_input_contents_size() > 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size())
    throw InferInputError("raw_input_contents: " + std::to_string(request.raw_input_contents_size()) + " entries for " +
                          std::to_string(request.inputs_size()) + " inputs");
  for (int i = 0; i < request.inputs_size(); ++i)
    call.inputs.push_back(DecodeInput(request.inputs(i), raw ? &request.raw_input_contents(i) : nullptr));
  for (const auto& output : request.outputs()) call.outputs.push_back({output.name(), true});
  const auto& p = request.parameters();
  if (auto it = p.find("priority"); it != p.end())
    call.priority = int(it->second.int64_param() + it->second.uint64_param());
  if (auto it = p.find("timeout"); it != p.end())
    call.timeout_ms = double(it->second.int64_param() + it->second.uint64_param()) / 1000.0;
  return call;
}

}  // namespace

grpc::Status KserveGrpc::Authorize(const grpc::ServerContext* context) const {
  const std::string& token = core_->spec().access_token;
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it != metadata.end() && std::string(it->second.data(), it->second.size()) == "Bearer " + token)
    return grpc::Status::OK;
  return {grpc::StatusCode::UNAUTHENTICATED, "missing or wrong access token (metadata authorization: Bearer ...)"};
}

grpc::Status KserveGrpc::ServerLive(grpc::ServerContext* context, const inference::ServerLiveRequest*,
                                    inference::ServerLiveResponse* response) {
  if (auto s = Authorize(context); !s.ok()) return s;
  response->set_live(core_->live());
  return grpc::Status::OK;
}

grpc::Status KserveGrpc::ServerReady(grpc::ServerContext* context, const inference::ServerReadyRequest*,
                                     inference::ServerReadyResponse* response) {
  if (auto s = Authorize(context); !s.ok()) return s;
  response->set_ready(core_->ready());
  return grpc::Status::OK;
}

grpc::Status KserveGrpc::ModelReady(grpc::ServerContext* context, const inference::ModelReadyRequest* request,
                                    inference::ModelReadyResponse* response) {
  if (auto s = Authorize(context); !s.ok()) return s;
  response->set_ready(core_->ModelReady(request->name(), request->version()));
  return grpc::Status::OK;
}

grpc::Status KserveGrpc::ServerMetadata(grpc::ServerContext* context, const inference::ServerMetadataRequest*,
                                        inference::ServerMetadataResponse* response) {
  if (auto s = Authorize(context); !s.ok()) return s;
  response->set_name(kServerName);
  response->set_version(kServerVersion);
  for (const std::string& extension : kExtensions) response->add_extensions(extension);
  return grpc::Status::OK;
}

grpc::Status KserveGrpc::ModelMetadata(grpc::ServerContext* context, const inference::ModelMetadataRequest* request,
                                       inference::ModelMetadataResponse* response) {
  if (auto s = Authorize(context); !s.ok()) return s;
  InferStatus status;
  std::string message;
  auto meta = core_->Resolve(request->name(), request->version(), &status, &message);
  if (!meta) return StatusOf(status, message);
  response->set_name(meta->model);
  for (int64_t v : core_->ReadyVersions(meta->model)) response->add_versions(std::to_string(v));
  response->set_platform("trainyard_" + meta->family);
  auto add = [](auto* list, const char* name, const char* type, const std::vector<int64_t>& shape) {
    auto* t = list->Add();
    t->set_name(name), t->set_datatype(type);
    for (int64_t d : shape) t->add_shape(d);
  };
  add(response->mutable_inputs(), "TEXT", "BYTES", {-1});
  add(response->mutable_inputs(), "input_ids", "INT64", {-1, -1});
  add(response->mutable_inputs(), "attention_mask", "INT64", {-1, -1});
  add(response->mutable_outputs(), "logits", "FP32", {-1, int64_t(meta->labels.size())});
  add(response->mutable_outputs(), "label", "BYTES", {-1});
  return grpc::Status::OK;
}

grpc::Status KserveGrpc::ModelInfer(grpc::ServerContext* context, const inference::ModelInferRequest* request,
                                    inference::ModelInferResponse* response) {
  if (auto s = Authorize(context); !s.ok()) return s;
  InferStatus status;
  std::string message;
  auto meta = core_->Resolve(request->model_name(), request->model_version(), &status, &message);
  if (!meta) {
    core_->Record(request->model_name(), request->model_version(), status);
    return StatusOf(status == InferStatus::kNotFound ? InferStatus::kBadInput : status, message);
  }
  InferCall call;
  RequestPtr pending;
  try {
    call = DecodeCall(*request);
    MakeOutputs(call, *meta, {});
    const ServeSpec& spec = core_->spec();
    auto deadline = DeadlineAfter(call.timeout_ms, spec.default_timeout_ms);
    // The call's own gRPC deadline, when sooner.
    const auto left = context->deadline() - std::chrono::system_clock::now();
    if (context->deadline() != std::chrono::system_clock::time_point::max() && ServeClock::now() + left < deadline)
      deadline = ServeClock::now() + std::chrono::duration_cast<ServeClock::duration>(left);
    pending = std::make_shared<InferRequest>(meta, TokenRows(call.inputs, *meta, spec.truncate, spec.max_batch_size),
                                             PriorityLevel(call.priority), deadline);
  } catch (const InferInputError& e) {
    core_->Record(meta->model, std::to_string(meta->version), InferStatus::kBadInput);
    return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
  }
  pending->SetClientGone([context] { return context->IsCancelled(); });
  core_->Submit(pending);
  pending->Wait();
  if (pending->status() != InferStatus::kOk) return StatusOf(pending->status(), pending->message());
  response->set_model_name(meta->model);
  response->set_model_version(std::to_string(meta->version));
  response->set_id(call.id);
  for (const TensorOut& out : MakeOutputs(call, *meta, pending->logits())) {
    auto* o = response->add_outputs();
    o->set_name(out.name);
    o->set_datatype(out.datatype);
    for (int64_t d : out.shape) o->add_shape(d);
    response->add_raw_output_contents(RawBytes(out));
  }
  return grpc::Status::OK;
}

grpc::Status KserveGrpc::RepositoryIndex(grpc::ServerContext* context, const inference::RepositoryIndexRequest* request,
                                         inference::RepositoryIndexResponse* response) {
  if (auto s = Authorize(context); !s.ok()) return s;
  for (const IndexEntry& e : core_->Index(request->ready())) {
    auto* m = response->add_models();
    m->set_name(e.model);
    m->set_version(std::to_string(e.version));
    m->set_state(StateName(e.state));
    m->set_reason(e.reason);
  }
  return grpc::Status::OK;
}

grpc::Status KserveGrpc::RepositoryModelLoad(grpc::ServerContext* context,
                                             const inference::RepositoryModelLoadRequest* request,
                                             inference::RepositoryModelLoadResponse*) {
  if (auto s = Authorize(context); !s.ok()) return s;
  std::string message;
  return StatusOf(core_->Load(request->model_name(), &message), message);
}

grpc::Status KserveGrpc::RepositoryModelUnload(grpc::ServerContext* context,
                                               const inference::RepositoryModelUnloadRequest* request,
                                               inference::RepositoryModelUnloadResponse*) {
  if (auto s = Authorize(context); !s.ok()) return s;
  std::string message;
  return StatusOf(core_->Unload(request->model_name(), &message), message);
}

namespace {

void SetDuration(inference::StatisticDuration* out, const StatisticDuration& d) {
  out->set_count(d.count);
  out->set_ns(d.ns);
}

inference::DataType DataTypeOf(const std::string& name) {
  inference::DataType type = inference::TYPE_INVALID;
  inference::DataType_Parse(name, &type);
  return type;
}

template <typename Tensor>
void SetTensor(Tensor* out, const TensorConfig& t) {
  out->set_name(t.name);
  out->set_data_type(DataTypeOf(t.data_type));
  for (int64_t d : t.dims) out->add_dims(d);
  if (t.scalar_per_row) out->mutable_reshape();  // present and empty: { shape: [] }
}

}  // namespace

grpc::Status KserveGrpc::ModelStatistics(grpc::ServerContext* context, const inference::ModelStatisticsRequest* request,
                                         inference::ModelStatisticsResponse* response) {
  if (auto s = Authorize(context); !s.ok()) return s;
  InferStatus status;
  std::string message;
  const std::vector<VersionStatistics> stats =
      core_->Statistics(request->name(), request->version(), &status, &message);
  if (status != InferStatus::kOk) return StatusOf(status, message);
  for (const VersionStatistics& s : stats) {
    inference::ModelStatistics* out = response->add_model_stats();
    out->set_name(s.model);
    out->set_version(std::to_string(s.version));
    out->set_last_inference(s.last_inference_ms);
    out->set_inference_count(s.inference_count);
    out->set_execution_count(s.execution_count);
    inference::InferStatistics* infer = out->mutable_inference_stats();
    SetDuration(infer->mutable_success(), s.success);
    SetDuration(infer->mutable_fail(), s.fail);
    SetDuration(infer->mutable_queue(), s.queue);
    SetDuration(infer->mutable_compute_infer(), s.compute_infer);
    for (const auto& [rows, compute] : s.batch_compute_infer) {
      inference::InferBatchStatistics* batch = out->add_batch_stats();
      batch->set_batch_size(uint64_t(rows));
      SetDuration(batch->mutable_compute_infer(), compute);
    }
  }
  return grpc::Status::OK;
}

grpc::Status KserveGrpc::ModelConfig(grpc::ServerContext* context, const inference::ModelConfigRequest* request,
                                     inference::ModelConfigResponse* response) {
  if (auto s = Authorize(context); !s.ok()) return s;
  InferStatus status;
  std::string message;
  auto meta = core_->Resolve(request->name(), request->version(), &status, &message);
  if (!meta) return StatusOf(status, message);
  const ModelConfigView c = DescribeModel(*meta, core_->spec());
  inference::ModelConfig* out = response->mutable_config();
  out->set_name(c.name);
  out->set_platform(c.platform);
  out->set_backend(c.backend);
  out->mutable_version_policy()->mutable_latest()->set_num_versions(1);
  out->set_max_batch_size(c.max_batch_size);
  for (const TensorConfig& t : c.inputs) {
    inference::ModelInput* input = out->add_input();
    SetTensor(input, t);
    input->set_optional(t.optional);
  }
  for (const TensorConfig& t : c.outputs) SetTensor(out->add_output(), t);
  inference::ModelDynamicBatching* batching = out->mutable_dynamic_batching();
  for (int size : c.preferred_batch_sizes) batching->add_preferred_batch_size(size);
  batching->set_max_queue_delay_microseconds(c.max_queue_delay_us);
  for (const auto& [key, value] : c.parameters) (*out->mutable_parameters())[key].set_string_value(value);
  return grpc::Status::OK;
}

std::unique_ptr<grpc::Server> StartGrpcServer(KserveGrpc* service, const GrpcServerLimits& limits) {
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(limits.max_message_bytes);
  builder.SetMaxSendMessageSize(limits.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, static_cast<int>(limits.idle_s * 1000));
  grpc::ResourceQuota quota("serve_grpc");
  quota.SetMaxThreads(limits.max_threads);
  builder.SetResourceQuota(quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) throw std::runtime_error("cannot start the gRPC server");
  return server;
}

}  // namespace trainyard
