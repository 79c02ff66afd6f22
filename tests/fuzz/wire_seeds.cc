// Writes fuzz_wire's seed corpus: frame scripts (wire_script.h) holding valid Envelopes
// of every message type, alone and in the life of the seeded job (register, heartbeat,
// epoch report, results; a rank exit; a cancel).
//   fuzz_wire_seeds <folder>      (checked in as tests/fuzz/corpus/fuzz_wire/)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "proto/wire_names.h"
#include "proto/wire_version.h"
#include "tests/fuzz/wire_script.h"
#include "trainyard.pb.h"

namespace trainyard::fuzz {
namespace {

using Fill = std::function<void(wire::Envelope*)>;

Frame FrameOf(int peer, const Fill& fill) {
  wire::Envelope e;
  e.set_version(kProtocolVersion);
  fill(&e);
  return {peer, e.SerializeAsString()};
}

void FillRank(wire::RankInfo* r, int rank) {
  r->set_world(kWorld);
  r->set_rank(rank);
  r->set_world_size(2);
  r->set_host("localhost");
  r->set_device("cpu");
  r->set_pid(1000 + rank);
}

Frame Register(int rank) {
  return FrameOf(rank, [rank](wire::Envelope* e) {
    FillRank(e->mutable_register_()->mutable_rank(), rank);
    e->mutable_register_()->set_job_id(kJob);
    e->mutable_register_()->set_attempt(kAttempt);
    e->mutable_register_()->set_world_token(kWorldToken);
    e->mutable_register_()->set_rank_token(kRankTokens[rank]);
  });
}

Frame Heartbeat(int rank) {
  return FrameOf(rank, [rank](wire::Envelope* e) {
    wire::Heartbeat* h = e->mutable_heartbeat();
    h->set_world(kWorld);
    h->set_rank(rank);
    h->set_job_id(kJob);
    h->set_attempt(kAttempt);
    h->set_last_log_line("epoch 1 step 10");
    h->set_rank_token(kRankTokens[rank]);
  });
}

Frame Epoch(int epoch) {
  return FrameOf(0, [epoch](wire::Envelope* e) {
    wire::EpochReport* r = e->mutable_epoch();
    r->set_job_id(kJob);
    r->set_attempt(kAttempt);
    r->set_epoch(epoch);
    r->set_csv_header("epoch,loss,accuracy");
    r->set_csv_line(std::to_string(epoch) + ",0.5,0.9");
    r->set_world(kWorld);
    r->set_world_rank(0);
    r->set_rank_token(kRankTokens[0]);
    wire::StepPart* part = r->mutable_breakdown()->add_parts();
    part->set_name("forward");
    part->set_min_ms(1);
    part->set_median_ms(2);
    part->set_max_ms(3);
    r->mutable_breakdown()->set_slowest_rank(1), r->mutable_breakdown()->set_slowest_ms_per_step(9);
  });
}

Frame Result(int rank, const std::string& outcome) {
  return FrameOf(rank, [rank, outcome](wire::Envelope* e) {
    wire::JobResult* r = e->mutable_result();
    r->set_job_id(kJob), r->set_attempt(kAttempt), r->set_world_rank(rank), r->set_world(kWorld);
    r->set_rank_token(kRankTokens[rank]);
    r->set_end(OutcomeFromName(outcome));
    r->set_message("done");
    if (rank == 0) r->set_summary_json(R"({"accuracy": 0.9})");
  });
}

Frame RankExit(int rank, int signal) {
  return FrameOf(rank, [rank, signal](wire::Envelope* e) {
    FillRank(e->mutable_rank_exit()->mutable_rank(), rank);
    e->mutable_rank_exit()->set_exit_code(signal ? 0 : 1), e->mutable_rank_exit()->set_signal(signal);
    e->mutable_rank_exit()->set_last_log_line("oops"), e->mutable_rank_exit()->set_rank_token(kRankTokens[rank]);
  });
}

Frame Output(int rank, int64_t offset, const std::string& text) {
  return FrameOf(rank, [rank, offset, text](wire::Envelope* e) {
    wire::JobOutput* o = e->mutable_output();
    o->set_job_id(kJob), o->set_attempt(kAttempt), o->set_offset(offset), o->set_text(text);
    o->set_world(kWorld), o->set_world_rank(rank), o->set_rank_token(kRankTokens[rank]);
  });
}

Frame Client(const Fill& fill) { return FrameOf(2, fill); }

// An elastic replica's messages (Note [Step quorum]) from a rank of the seeded attempt.
Frame ReplicaJoin(int rank) {
  return FrameOf(rank, [rank](wire::Envelope* e) {
    wire::ReplicaJoin* j = e->mutable_replica_join();
    j->set_job_id(kJob), j->set_attempt(kAttempt), j->set_ring_host("127.0.0.1"), j->set_ring_port(7001 + rank);
    j->set_committed_step(3), j->set_world(kWorld), j->set_world_rank(rank), j->set_rank_token(kRankTokens[rank]);
  });
}

Frame StepVote(int rank, uint64_t quorum, int64_t step) {
  return FrameOf(rank, [rank, quorum, step](wire::Envelope* e) {
    wire::StepVote* v = e->mutable_step_vote();
    v->set_job_id(kJob), v->set_attempt(kAttempt), v->set_quorum_id(quorum), v->set_step(step), v->set_ok(true);
    v->set_world(kWorld), v->set_world_rank(rank), v->set_rank_token(kRankTokens[rank]);
  });
}

Frame ReplicaBeat(int rank, uint64_t quorum) {
  return FrameOf(rank, [rank, quorum](wire::Envelope* e) {
    wire::ReplicaBeat* b = e->mutable_replica_beat();
    b->set_job_id(kJob), b->set_attempt(kAttempt), b->set_quorum_id(quorum);
    b->set_world(kWorld), b->set_world_rank(rank), b->set_rank_token(kRankTokens[rank]);
  });
}

// An agent's answers to the coordinator's file questions (numbered from 1).
Frame FileListAnswer(int rank, int64_t request) {
  return FrameOf(rank, [rank, request](wire::Envelope* e) {
    wire::FileList* l = e->mutable_file_list();
    l->set_request_id(request), l->set_world(kWorld), l->set_world_rank(rank), l->set_rank_token(kRankTokens[rank]);
    wire::Artifact* f = l->add_files();
    f->set_path("seeded/model/model.safetensors"), f->set_size(4096), f->set_modified(1.5e9);
  });
}

Frame FileChunkAnswer(int rank, int64_t request) {
  return FrameOf(rank, [rank, request](wire::Envelope* e) {
    wire::FileChunk* c = e->mutable_file_chunk();
    c->set_request_id(request), c->set_world(kWorld), c->set_world_rank(rank), c->set_rank_token(kRankTokens[rank]);
    c->set_data("0123456789"), c->set_size(4096);
  });
}

Frame OutputLogs(int attempt, int64_t offset, int rank) {
  return Client([attempt, offset, rank](wire::Envelope* e) {
    wire::LogsRequest* l = e->mutable_logs();
    l->set_job_id(kJob), l->set_output(true), l->set_attempt(attempt), l->set_offset(offset);
    if (rank >= 0) l->set_rank(rank);
  });
}

Frame Submit() {
  return Client([](wire::Envelope* e) {
    wire::SubmitRequest* s = e->mutable_submit();
    s->set_yaml(
        "name: fuzzjob\ndata:\n  train: data/train.tsv\n  tokenizer:\n    vocab: data/vocab.txt\n"
        "resources:\n  ranks: 2\n  priority: 3\n");
    s->set_source("fuzzjob.yaml"), s->set_base_dir("."), s->set_idempotency_key("key-1");
  });
}

std::vector<std::pair<std::string, std::vector<Frame>>> Seeds() {
  const auto id = [](auto* request) { request->set_job_id(kJob); };
  std::vector<std::pair<std::string, std::vector<Frame>>> seeds = {
      {"submit", {Submit(), Submit()}},
      {"list", {Client([](wire::Envelope* e) { e->mutable_list(); })}},
      {"status", {Client([&](wire::Envelope* e) { id(e->mutable_status()); })}},
      {"cancel", {Client([&](wire::Envelope* e) { id(e->mutable_cancel()); })}},
      {"logs", {Client([&](wire::Envelope* e) { id(e->mutable_logs()); })}},
      {"report", {Client([&](wire::Envelope* e) { id(e->mutable_report()); })}},
      {"workers", {Register(0), Client([](wire::Envelope* e) { e->mutable_workers(); })}},
      {"register", {Register(0)}},
      {"heartbeat", {Heartbeat(1)}},
      {"epoch", {Epoch(1)}},
      {"result", {Result(1, "failed")}},
      {"rank_exit", {RankExit(0, 9)}},
      {"artifacts",
       {Register(0), Register(1), Client([](wire::Envelope* e) { e->mutable_artifacts()->set_job_id(kJob); }),
        FileListAnswer(0, 1), FileListAnswer(1, 1), Client([](wire::Envelope* e) {
          e->mutable_fetch()->set_job_id(kJob), e->mutable_fetch()->set_path("seeded/model/model.safetensors");
          e->mutable_fetch()->set_host("localhost"), e->mutable_fetch()->set_offset(10);
        }),
        FileChunkAnswer(0, 2), Client([](wire::Envelope* e) {
          e->mutable_fetch()->set_job_id(kJob), e->mutable_fetch()->set_path("attempt-1/output.log");
        })}},
      {"output",
       {Register(0), Output(0, 0, "[rank 0] a\n[rank 1] b\n"), Output(0, 0, "[rank 0] a\n[rank 1] b\n"),
        Output(0, 100, "gap\n"), Output(1, 0, "not the lead\n"), OutputLogs(0, 0, 1), OutputLogs(1, 1 << 20, -1)}},
      {"from_coordinator",
       {FrameOf(3, [](wire::Envelope* e) { e->mutable_pulse(); }),
        FrameOf(3, [](wire::Envelope* e) { e->mutable_assign()->set_job_id(kJob); }),
        FrameOf(3, [](wire::Envelope* e) { e->mutable_stop()->set_job_id(kJob); }),
        FrameOf(3, [](wire::Envelope* e) { e->mutable_ack()->set_job_id(kJob); })}},
      {"life_succeeded",
       {Register(0), Register(1), Heartbeat(0), Heartbeat(1), Epoch(1), Epoch(1), Epoch(2), Result(0, "succeeded"),
        Result(1, "succeeded"), Client([&](wire::Envelope* e) { id(e->mutable_report()); })}},
      {"replica",
       {Register(0), Register(1), ReplicaJoin(0), ReplicaJoin(1), ReplicaBeat(0, 1), StepVote(0, 1, 4),
        StepVote(1, 1, 4), FrameOf(3, [](wire::Envelope* e) { e->mutable_step_decision()->set_job_id(kJob); })}},
      {"life_rank_exit", {Register(0), Register(1), Epoch(1), RankExit(1, 11), Result(0, "cancelled")}},
      {"life_bad_input", {Register(0), Register(1), Result(1, "bad_input"), Heartbeat(0)}},
      {"life_cancel",
       {Register(0), Register(1), Client([&](wire::Envelope* e) { id(e->mutable_cancel()); }), Result(0, "cancelled"),
        Result(1, "cancelled"), Client([&](wire::Envelope* e) { id(e->mutable_logs()); })}},
  };
  return seeds;
}

}  // namespace
}  // namespace trainyard::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <folder>\n", argv[0]);
    return 2;
  }
  std::filesystem::create_directories(argv[1]);
  for (const auto& [name, frames] : trainyard::fuzz::Seeds())
    std::ofstream(std::filesystem::path(argv[1]) / name, std::ios::binary) << trainyard::fuzz::EncodeScript(frames);
  return 0;
}
