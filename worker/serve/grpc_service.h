// The Open Inference Protocol over gRPC: inference.GRPCInferenceService (see
// proto/kserve/grpc_service.proto) on gRPC's synchronous server, each call on one of
// gRPC's threads. ModelInfer blocks until its request has run, watching the call: a
// cancelled call (or one past its gRPC deadline) cancels the queued request.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "grpc_service.grpc.pb.h"
#include "worker/serve/server_core.h"

namespace trainyard {

class KserveGrpc final : public inference::GRPCInferenceService::Service {
 public:
  explicit KserveGrpc(ServerCore* core) : core_(core) {}

  grpc::Status ServerLive(grpc::ServerContext*, const inference::ServerLiveRequest*,
                          inference::ServerLiveResponse*) override;
  grpc::Status ServerReady(grpc::ServerContext*, const inference::ServerReadyRequest*,
                           inference::ServerReadyResponse*) override;
  grpc::Status ModelReady(grpc::ServerContext*, const inference::ModelReadyRequest*,
                          inference::ModelReadyResponse*) override;
  grpc::Status ServerMetadata(grpc::ServerContext*, const inference::ServerMetadataRequest*,
                              inference::ServerMetadataResponse*) override;
  grpc::Status ModelMetadata(grpc::ServerContext*, const inference::ModelMetadataRequest*,
                             inference::ModelMetadataResponse*) override;
  grpc::Status ModelInfer(grpc::ServerContext*, const inference::ModelInferRequest*,
                          inference::ModelInferResponse*) override;
  grpc::Status RepositoryIndex(grpc::ServerContext*, const inference::RepositoryIndexRequest*,
                               inference::RepositoryIndexResponse*) override;
  grpc::Status RepositoryModelLoad(grpc::ServerContext*, const inference::RepositoryModelLoadRequest*,
                                   inference::RepositoryModelLoadResponse*) override;
  grpc::Status RepositoryModelUnload(grpc::ServerContext*, const inference::RepositoryModelUnloadRequest*,
                                     inference::RepositoryModelUnloadResponse*) override;
  grpc::Status ModelStatistics(grpc::ServerContext*, const inference::ModelStatisticsRequest*,
                               inference::ModelStatisticsResponse*) override;
  grpc::Status ModelConfig(grpc::ServerContext*, const inference::ModelConfigRequest*,
                           inference::ModelConfigResponse*) override;

 private:
  grpc::Status Authorize(const grpc::ServerContext* context) const;
  ServerCore* core_;
};

struct GrpcServerLimits {
  int max_message_bytes = 16 << 20;
  double idle_s = 60;    // a connection with no call for this long is closed (max_connection_idle)
  int max_threads = 64;  // the resource quota's threads: calls beyond wait or get RESOURCE_EXHAUSTED
};

// Builds and starts the gRPC server with no listening port of its own: its connections
// come through a GrpcConnectionGate (Note [gRPC connections are gated] in grpc_gate.h).
std::unique_ptr<grpc::Server> StartGrpcServer(KserveGrpc* service, const GrpcServerLimits& limits);

}  // namespace trainyard
