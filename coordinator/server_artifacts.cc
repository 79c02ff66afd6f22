// A job's files, listed and fetched across its hosts (Note [Artifacts] in
// coordinator/artifacts.h).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>

#include "common/clock.h"
#include "common/regular_file.h"
#include "coordinator/artifacts.h"
#include "coordinator/server.h"

namespace trainyard {

bool PlainRelativePath(const std::string& path) {
  if (path.empty() || path.find('\0') != std::string::npos) return false;
  for (size_t begin = 0;;) {
    const size_t slash = path.find('/', begin);
    const std::string part = path.substr(begin, slash == std::string::npos ? std::string::npos : slash - begin);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) return true;
    begin = slash + 1;
  }
}

void AddListing(const std::string& host, const google::protobuf::RepeatedPtrField<wire::Artifact>& files,
                wire::ArtifactsReply* reply) {
  for (const wire::Artifact& file : files) {
    wire::Artifact* added = reply->add_files();
    *added = file;
    added->set_host(host);
  }
}

void SortListing(wire::ArtifactsReply* reply) {
  auto* files = reply->mutable_files();
  std::sort(files->begin(), files->end(), [](const wire::Artifact& a, const wire::Artifact& b) {
    return a.host() != b.host() ? a.host() < b.host() : a.path() < b.path();
  });
  std::sort(reply->mutable_unreachable()->begin(), reply->mutable_unreachable()->end());
}

namespace {

std::string HostName() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("localhost");
}

}  // namespace

const std::string& Server::OwnHost() const {
  static const std::string host = HostName();
  return host;
}

std::string Server::FileRefusal(int64_t id, const ClientIdentity& client, std::optional<JobRecord>* job) const {
  *job = store_->Find(id);
  if (!*job) return "no job " + std::to_string(id);
  if (!client.admin && (*job)->user != client.user)
    return "refused: job " + std::to_string(id) + " belongs to " +
           ((*job)->user.empty() ? std::string("no named user") : (*job)->user) +
           "; only its owner or an admin may read its files, and " + client.user + " is neither";
  return "";
}

std::map<std::string, RankKey> Server::AgentsOnJobHosts(int64_t job, std::vector<std::string>* unknown) const {
  std::map<std::string, RankKey> agents;
  for (const AttemptRecord& a : store_->Attempts(job)) {
    std::vector<RankKey> slots;
    if (!ParsePlacement(a.placement, &slots)) continue;
    for (const RankKey& slot : slots) {
      const RankEntry* rank = ranks_->Find(slot);
      if (!rank) {
        unknown->push_back("agent " + slot.first + " (attempt " + std::to_string(a.attempt) +
                           "): no longer registered, so its host is not known");
        continue;
      }
      const std::string& host = rank->info.host();
      if (host != OwnHost()) agents.emplace(host, slot);
    }
  }
  // A host's agent that ran the job may be gone while another agent there lives on.
  for (auto& [host, key] : agents)
    if (!ranks_->Find(key))
      if (const auto* other = ranks_->OnHost(host)) key = other->first;
  std::sort(unknown->begin(), unknown->end());
  unknown->erase(std::unique(unknown->begin(), unknown->end()), unknown->end());
  return agents;
}

std::optional<wire::Envelope> Server::Artifacts(const std::string& identity, const ClientIdentity& client,
                                                const wire::ArtifactsRequest& request) {
  std::optional<JobRecord> job;
  if (const std::string why = FileRefusal(request.job_id(), client, &job); !why.empty()) return ErrorEnvelope(2, why);
  if (file_queries_.size() >= kMaxFileQueries)
    return ErrorEnvelope(1, "the coordinator is waiting on agents for too many listings and fetches; try again");
  FileQuery query;
  query.client = identity;
  query.job = job->id;
  query.deadline = SteadySeconds() + kFileQuerySeconds;
  bool truncated = false;
  const std::vector<FileEntry> own =
      ListFilesBeneath(options_.runs_dir, std::to_string(job->id), kMaxListedFiles, kMaxListedDepth, &truncated);
  for (const FileEntry& file : own) {
    wire::Artifact* added = query.listing.add_files();
    added->set_path(file.path);
    added->set_size(file.size);
    added->set_modified(file.modified);
    added->set_host(OwnHost());
  }
  query.listing.set_truncated(truncated);
  std::vector<std::string> unknown;
  const int64_t id = next_file_query_++;
  for (const auto& [host, agent] : AgentsOnJobHosts(job->id, &unknown)) {
    wire::Envelope ask;
    ask.mutable_list_files()->set_request_id(id);
    ask.mutable_list_files()->set_root(options_.runs_dir);
    ask.mutable_list_files()->set_relative(std::to_string(job->id));
    Send(ranks_->entries().at(agent).identity, ask);
    query.waiting.insert(host);
  }
  for (const std::string& why : unknown) query.listing.add_unreachable(why);
  if (query.waiting.empty()) {
    SortListing(&query.listing);
    wire::Envelope reply;
    *reply.mutable_artifact_list() = query.listing;
    return reply;
  }
  file_queries_.emplace(id, std::move(query));
  return std::nullopt;
}

std::optional<wire::Envelope> Server::Fetch(const std::string& identity, const ClientIdentity& client,
                                            const wire::FetchRequest& request) {
  std::optional<JobRecord> job;
  if (const std::string why = FileRefusal(request.job_id(), client, &job); !why.empty()) return ErrorEnvelope(2, why);
  if (!PlainRelativePath(request.path()) || request.offset() < 0)
    return ErrorEnvelope(2, "refused: '" + request.path() + "' at offset " + std::to_string(request.offset()) +
                                " is not a file's place beneath the job's folder (no empty, '.' or '..' parts)");
  const std::string relative = std::to_string(job->id) + "/" + request.path();
  const std::string host = request.host().empty() ? OwnHost() : request.host();
  if (host == OwnHost()) {
    const FileRead read = ReadRangeBeneath(options_.runs_dir, relative, request.offset(), kFetchChunkBytes);
    if (!read.ok()) return ErrorEnvelope(2, "job " + std::to_string(job->id) + " on " + host + ": " + read.why);
    wire::Envelope reply;
    reply.mutable_fetched()->set_data(read.bytes);
    reply.mutable_fetched()->set_size(read.size);
    return reply;
  }
  const auto* agent = ranks_->OnHost(host);
  if (!agent) return ErrorEnvelope(1, "no agent on host " + host + " is registered to read it from");
  if (file_queries_.size() >= kMaxFileQueries)
    return ErrorEnvelope(1, "the coordinator is waiting on agents for too many listings and fetches; try again");
  const int64_t id = next_file_query_++;
  wire::Envelope ask;
  wire::ReadFileChunk* read = ask.mutable_read_file();
  read->set_request_id(id);
  read->set_root(options_.runs_dir);
  read->set_relative(relative);
  read->set_offset(request.offset());
  read->set_max_bytes(int(kFetchChunkBytes));
  Send(agent->second.identity, ask);
  FileQuery query{identity, job->id, /*fetch=*/true, SteadySeconds() + kFileQuerySeconds, {host}, {}};
  file_queries_.emplace(id, std::move(query));
  return std::nullopt;
}

// An agent's answer: taken only from a registered agent on a host the question waits on.
FileQuery* Server::AnsweredQuery(const std::string& identity, int64_t request_id, const std::string& world, int rank,
                                 const std::string& token) {
  RankEntry* sender = Authenticated(identity, world, rank, token, "a file answer");
  if (!sender) return nullptr;
  const auto query = file_queries_.find(request_id);
  if (query == file_queries_.end() || !query->second.waiting.count(sender->info.host())) return nullptr;
  query->second.waiting.erase(sender->info.host());
  return &query->second;
}

void Server::OnFileList(const std::string& identity, const wire::FileList& message) {
  FileQuery* query =
      AnsweredQuery(identity, message.request_id(), message.world(), message.world_rank(), message.rank_token());
  if (!query || query->fetch) return;
  const std::string host = ranks_->entries().at(RankKey{message.world(), message.world_rank()}).info.host();
  if (!message.error().empty()) query->listing.add_unreachable(host + ": " + message.error());
  AddListing(host, message.files(), &query->listing);
  if (message.truncated()) query->listing.set_truncated(true);
  if (query->waiting.empty()) FinishFileQuery(message.request_id());
}

void Server::OnFileChunk(const std::string& identity, const wire::FileChunk& message) {
  FileQuery* query =
      AnsweredQuery(identity, message.request_id(), message.world(), message.world_rank(), message.rank_token());
  if (!query || !query->fetch) return;
  const std::string host = ranks_->entries().at(RankKey{message.world(), message.world_rank()}).info.host();
  if (!message.error().empty()) {
    Send(query->client, ErrorEnvelope(message.missing() ? 2 : 1,
                                      "job " + std::to_string(query->job) + " on " + host + ": " + message.error()));
  } else {
    wire::Envelope reply;
    reply.mutable_fetched()->set_data(message.data());
    reply.mutable_fetched()->set_size(message.size());
    Send(query->client, reply);
  }
  file_queries_.erase(message.request_id());
}

void Server::FinishFileQuery(int64_t id) {
  auto query = file_queries_.find(id);
  if (query == file_queries_.end()) return;
  FileQuery& q = query->second;
  if (q.fetch) {
    Send(q.client, ErrorEnvelope(1, "the agent on " + *q.waiting.begin() + " did not answer within " +
                                        std::to_string(int(kFileQuerySeconds)) + " s"));
  } else {
    for (const std::string& host : q.waiting)
      q.listing.add_unreachable(host + ": its agent did not answer within " + std::to_string(int(kFileQuerySeconds)) +
                                " s");
    SortListing(&q.listing);
    wire::Envelope reply;
    *reply.mutable_artifact_list() = q.listing;
    Send(q.client, reply);
  }
  file_queries_.erase(query);
}

void Server::ExpireFileQueries() {
  const double now = SteadySeconds();
  std::vector<int64_t> expired;
  for (const auto& [id, query] : file_queries_)
    if (now > query.deadline) expired.push_back(id);
  for (int64_t id : expired) FinishFileQuery(id);
}

}  // namespace trainyard
