// jobctl: the user's command line for the coordinator.
//   jobctl submit JOB.yaml [--set K=V] [--wait|--follow] | list [--state S] [--user U] [--name N] [--limit N]
//          | status ID | cancel ID... [--user U] [--state S] | logs ID [-f] [--output [--attempt N] [--rank R]]
//          | report ID | workers | usage | artifacts ID | fetch ID PATH [--host H] [--to DIR]
// Requests follow the ZeroMQ Guide's Lazy Pirate pattern: wait `--timeout` seconds for
// the reply, then reconnect and resend, `--retries` times, then give up with a clear
// error. A submission carries an idempotency key, so a resend never makes two jobs.
// Exit codes: 0 ok, 2 bad input (the job file, an unknown job, bad options, a message
// too large for the coordinator), 1 failure (and `logs -f` of a job that failed or was
// cancelled).
#include <pwd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "common/bounded_json.h"
#include "common/csv.h"
#include "common/curve/curve_keys.h"
#include "common/epoch_table.h"
#include "common/spec/job_spec.h"
#include "common/spec/search_spec.h"
#include "common/spec/yaml_budget.h"
#include "coordinator/search_json.h"
#include "proto/wire_names.h"
#include "proto/wire_version.h"
#include "trainyard.pb.h"

namespace {

namespace wire = trainyard::wire;
using trainyard::SplitCsv;

struct Options {
  std::string coordinator = "tcp://127.0.0.1:5555";
  double timeout_s = 2.5;
  int retries = 3;
  bool json = false;
  std::string keys_dir = trainyard::DefaultKeyDir();
  bool insecure = false;
  trainyard::PeerKeys keys;  // loaded from keys_dir unless insecure
};

class Unreachable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An ErrorReply, or a request that cannot be sent: code 2 is bad input.
class Rejected : public std::runtime_error {
 public:
  Rejected(int code, const std::string& m) : std::runtime_error(m), code(code) {}
  int code;
};

// Watches a socket for what ZeroMQ does not report through the socket itself: the
// peer dropping the connection (its answer to a message over ZMQ_MAXMSGSIZE) and a
// CURVE handshake the coordinator refused (a key not on its allowlist).
class ConnectionWatch {
 public:
  ConnectionWatch(zmq::context_t& context, zmq::socket_t& socket, int serial)
      : events_(context, zmq::socket_type::pair) {
    const std::string endpoint = "inproc://jobctl-monitor-" + std::to_string(serial);
    if (zmq_socket_monitor(socket.handle(), endpoint.c_str(),
                           ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0)
      throw zmq::error_t();
    events_.set(zmq::sockopt::linger, 0);
    events_.connect(endpoint);
  }
  // For zmq::poll: readable when an event arrives.
  zmq::pollitem_t Item() { return {static_cast<void*>(events_), 0, ZMQ_POLLIN, 0}; }
  // The events seen so far, OR-ed.
  int Seen() {
    zmq::message_t event;
    while (events_.recv(event, zmq::recv_flags::dontwait)) {
      if (event.size() >= 2)
        seen_ |= static_cast<const uint8_t*>(event.data())[0] | static_cast<const uint8_t*>(event.data())[1] << 8;
      zmq::message_t address;  // each event is two frames: the event, then the endpoint
      (void)events_.recv(address, zmq::recv_flags::dontwait);
    }
    return seen_;
  }

 private:
  zmq::socket_t events_;
  int seen_ = 0;
};

// Waits up to `timeout_s` for `socket` to have a reply; true if it has. A refused
// handshake ends the wait at once (no reply can follow it); the caller reads `watch`.
bool AwaitReply(zmq::socket_t& socket, ConnectionWatch& watch, double timeout_s) {
  constexpr int kHandshakeFailed =
      ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  zmq::pollitem_t items[] = {{static_cast<void*>(socket), 0, ZMQ_POLLIN, 0}, watch.Item()};
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    zmq::poll(items, 2, left);
    if (items[0].revents & ZMQ_POLLIN) return true;
    if ((items[1].revents & ZMQ_POLLIN) && (watch.Seen() & kHandshakeFailed)) return false;
  }
}

// One request, one reply, with Lazy Pirate retries.
wire::Envelope Request(const Options& o, wire::Envelope request) {
  request.set_version(trainyard::kProtocolVersion);
  const std::string bytes = request.SerializeAsString();
  zmq::context_t context(1);
  for (int attempt = 1; attempt <= o.retries; ++attempt) {
    zmq::socket_t socket(context, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::maxmsgsize, int64_t(256) << 20);
    ConnectionWatch watch(context, socket, attempt);
    if (!o.insecure) trainyard::MakeCurveClient(socket, o.keys);
    try {
      socket.connect(o.coordinator);
    } catch (const zmq::error_t& e) {
      throw Rejected(2, "--coordinator " + o.coordinator + ": not a usable ZeroMQ endpoint (" + e.what() +
                            "); expected e.g. tcp://127.0.0.1:5555");
    }
    socket.send(zmq::buffer(bytes), zmq::send_flags::none);
    if (AwaitReply(socket, watch, o.timeout_s)) {
      zmq::message_t reply;
      (void)socket.recv(reply);
      wire::Envelope envelope;
      if (!envelope.ParseFromArray(reply.data(), static_cast<int>(reply.size())))
        throw std::runtime_error("the coordinator's reply does not parse");
      return envelope;
    }
    const int seen = watch.Seen();
    if (seen & ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
      throw Rejected(2, "the coordinator refused this client key (" + o.keys_dir +
                            "/client.key): its public key is not on the coordinator's clients.allow (a key added\n"
                            "there takes a SIGHUP to the coordinator, which then re-reads the list)");
    if (seen & (ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL))
      throw Rejected(2, "the secure handshake with " + o.coordinator +
                            " failed: is it the coordinator of these keys, and do both sides agree on --insecure?");
    if (seen & ZMQ_EVENT_DISCONNECTED)  // a connection that was made and then dropped: not a missing daemon
      throw Rejected(2, "message too large: the coordinator closed the connection after a request of " +
                            std::to_string(bytes.size()) +
                            " bytes (a coordinator accepts at most its --max-message-bytes, 16 MiB by default)");
    if (attempt < o.retries)
      std::cerr << "jobctl: no reply from " << o.coordinator << " in " << o.timeout_s << " s, retrying (" << attempt
                << "/" << o.retries << ")\n";
  }
  std::ostringstream message;
  message << "the coordinator at " << o.coordinator << " did not answer after " << o.retries << " tries of "
          << o.timeout_s << " s; is it running?";
  throw Unreachable(message.str());
}

wire::Envelope Expect(const wire::Envelope& reply) {
  if (reply.has_error()) throw Rejected(reply.error().code(), reply.error().message());
  return reply;
}

std::string NewKey() {
  std::random_device device;
  std::ostringstream out;
  out << std::hex << device() << device() << "-" << ::getpid();
  return out.str();
}

// "failed: <reason>", "succeeded"; "running" while the attempt runs.
std::string DescribeEnd(const wire::AttemptInfo& a) {
  if (a.end() == wire::OUTCOME_UNSPECIFIED) return "running";
  return trainyard::DescribeEnd(a.end(), a.end_reason());
}

nlohmann::json ToJson(const wire::JobInfo& j) {
  nlohmann::json out = {{"id", j.id()},
                        {"name", j.name()},
                        {"state", trainyard::JobStateName(j.job_state())},
                        {"priority", j.priority()},
                        {"ranks", j.ranks()},
                        {"device", j.device()},
                        {"attempts", j.attempts()},
                        {"reason", j.reason()},
                        {"user", j.user()},
                        {"preemptible", j.preemptible()},
                        {"submitted_at", j.submitted_at()}};
  if (!j.waiting().empty()) out["waiting"] = j.waiting();
  if (!j.metric().empty()) {
    out["metric"] = j.metric();
    out["metric_value"] = j.metric_value();
  }
  if (j.events_size() > 0) {
    out["events"] = std::vector<std::string>(j.events().begin(), j.events().end());
    out["event_times"] = std::vector<double>(j.event_times().begin(), j.event_times().end());
  }
  if (j.listeners_size() > 0) {
    out["endpoints"] = nlohmann::json::array();
    for (const wire::Endpoint& e : j.listeners())
      out["endpoints"].push_back({{"protocol", e.protocol()}, {"url", e.url()}});
  }
  if (!j.slurm().empty()) out["slurm"] = j.slurm();
  if (j.is_search()) out["kind"] = "search";
  if (j.search_id() != 0) out["search"] = j.search_id();
  return out;
}

// The trials as a leaderboard: best metric first, trials without one last.
void PrintSearchReport(const wire::SearchReport& s) {
  std::vector<const wire::TrialInfo*> order;
  double total = 0;
  for (const wire::TrialInfo& t : s.trials()) {
    order.push_back(&t);
    total += t.rank_seconds();
  }
  std::stable_sort(order.begin(), order.end(), [&](const wire::TrialInfo* a, const wire::TrialInfo* b) {
    if (std::isnan(b->best())) return !std::isnan(a->best());
    if (std::isnan(a->best())) return false;
    return s.maximize() ? a->best() > b->best() : a->best() < b->best();
  });
  std::string rungs;
  for (int r : s.rungs()) rungs += (rungs.empty() ? "" : ", ") + std::to_string(r);
  std::printf("\nsearch: %s on %s (%s), %d trials, at most %d at once", s.method().c_str(), s.metric().c_str(),
              s.maximize() ? "max" : "min", s.trials_size(), s.max_concurrent());
  if (!rungs.empty()) std::printf(", judged at epochs %s of %d", rungs.c_str(), s.max_epochs());
  std::printf("\n  %-4s %-5s %-6s %-10s %6s %7s %12s %9s  %s\n", "rank", "trial", "job", "state", "epochs", "stopped",
              ("best " + s.metric()).c_str(), "rank-s", "params");
  int rank = 0;
  for (const wire::TrialInfo* t : order) {
    std::string params;
    for (const std::string& p : t->params()) params += (params.empty() ? "" : " ") + p;
    const std::string best = std::isnan(t->best()) ? "-" : std::to_string(t->best());
    std::printf("  %-4d %-5d %-6s %-10s %6d %7s %12s %9.1f  %s\n", ++rank, t->trial(),
                t->job_id() ? std::to_string(t->job_id()).c_str() : "-",
                t->job_id() ? trainyard::JobStateName(t->job_state()).c_str() : "PENDING", t->curve_size(),
                t->stopped_at() ? std::to_string(t->stopped_at()).c_str() : "-", best.c_str(), t->rank_seconds(),
                params.c_str());
  }
  if (s.best_trial() > 0) {
    const wire::TrialInfo& best = s.trials(s.best_trial() - 1);
    std::printf("best: trial %d (job %ld), %s %f; model: %s\n", best.trial(), long(best.job_id()), s.metric().c_str(),
                best.best(), best.model_dir().empty() ? "-" : best.model_dir().c_str());
  }
  std::printf("rank-seconds of every trial: %.1f\n", total);
}

std::string FormatTime(double seconds_since_epoch) {
  if (seconds_since_epoch <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(seconds_since_epoch);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return text;
}

// "eval_acc=0.9827", or "-" for a job with no metric yet (Note [A job's metric] in
// coordinator/server.h).
std::string MetricText(const wire::JobInfo& j) {
  if (j.metric().empty()) return "-";
  char value[32];
  std::snprintf(value, sizeof value, "%.4g", j.metric_value());
  return j.metric() + "=" + value;
}

void PrintTable(const std::vector<wire::JobInfo>& jobs) {
  std::printf("%-6s %-24s %-12s %-10s %5s %5s %-5s %8s %-20s  %s\n", "id", "name", "user", "state", "prio", "ranks",
              "dev", "attempts", "metric", "reason");
  for (const auto& j : jobs)
    std::printf("%-6ld %-24s %-12s %-10s %5d %5d %-5s %8d %-20s  %s\n", long(j.id()), j.name().c_str(),
                j.user().empty() ? "-" : j.user().c_str(), trainyard::JobStateName(j.job_state()).c_str(), j.priority(),
                j.ranks(), j.device().c_str(), j.attempts(), MetricText(j).c_str(),
                (j.reason().empty() ? j.waiting() : j.reason()).c_str());
}

// What is printed under the table: Slurm's view of each job; of one job, also why it
// waits, its listeners and its events with their times (several jobs' would mix).
void PrintDetails(const wire::JobInfo& j, bool one) {
  if (!j.slurm().empty()) std::printf("  slurm: %s\n", j.slurm().c_str());
  if (!one) return;
  if (!j.waiting().empty()) std::printf("  waiting: %s\n", j.waiting().c_str());
  for (const auto& e : j.listeners()) std::printf("  endpoint: %s %s\n", e.protocol().c_str(), e.url().c_str());
  for (int i = 0; i < j.events_size(); ++i)
    std::printf("  event: %s  %s\n", i < j.event_times_size() ? FormatTime(j.event_times(i)).c_str() : "-",
                j.events(i).c_str());
}

// The login name this process runs as, for a submission (Note [Usage] in
// coordinator/state_store.h); "" when the system has none for its uid.
std::string LoginName() {
  const passwd* entry = ::getpwuid(::geteuid());
  return entry && entry->pw_name ? entry->pw_name : "";
}

struct CommandArgs {
  std::string job_file, key;
  int64_t id = 0;
  std::vector<int64_t> ids;  // cancel's
  bool follow = false, csv = false, per_user = false;
  // list's and cancel's filters: states by name (each may be a comma-separated list).
  std::vector<std::string> states;
  std::string user, name_contains;
  int limit = 0;
  // submit: keys set on the command line, and whether to wait for the job's end.
  std::vector<std::string> sets;
  std::string ranks, priority, name;  // as given; empty: the file's
  bool wait = false;
  // logs --output: which attempt (0: the latest) and rank (-1: every one).
  bool output = false;
  int attempt = 0, rank = -1;
  // fetch: which file, from which host, to which folder.
  std::string path, host, to = ".";
};

// The submitter's overrides of a job file, as `worker` takes them: --set KEY=VALUE, and
// --ranks, --priority and --name for their keys; ${VAR} expanded from this environment.
trainyard::SpecOverrides SubmitOverrides(const CommandArgs& args) {
  trainyard::SpecOverrides overrides;
  overrides.expand_environment = true;
  for (const std::string& set : args.sets) overrides.AddAssignment(set);
  if (!args.ranks.empty()) overrides.Add("resources.ranks", args.ranks, "--ranks " + args.ranks);
  if (!args.priority.empty()) overrides.Add("resources.priority", args.priority, "--priority " + args.priority);
  if (!args.name.empty()) overrides.Add("name", args.name, "--name " + args.name, /*literal=*/true);
  return overrides;
}

bool Overridden(const CommandArgs& args) {
  return !args.sets.empty() || !args.ranks.empty() || !args.priority.empty() || !args.name.empty();
}

int WaitForEnd(const Options& o, int64_t id);
int Logs(const Options& o, int64_t id, bool follow, bool csv);
int OutputLogs(const Options& o, int64_t id, bool follow, int attempt, int rank);

int Submit(const Options& o, const CommandArgs& args) {
  const std::string& path = args.job_file;
  // The same checks, and errors, as the coordinator and worker; the budget first, so a
  // huge file is refused before yaml-cpp spends memory on it.
  const std::string text = trainyard::ReadJobFile(path);
  trainyard::CheckYamlBudget(text, path, trainyard::YamlBudget{});
  const std::string base_dir = std::filesystem::absolute(path).parent_path().string();
  trainyard::SearchSpec search;
  std::string sent = text;  // a job file goes as it will run: overrides applied, ${VAR} expanded
  if (trainyard::IsSearchFile(text)) {
    if (Overridden(args))
      throw trainyard::SpecError(path +
                                 ": --set, --ranks, --priority and --name apply to job files; a search's "
                                 "trials take theirs from its base file and space");
    search = trainyard::ParseSearchSpec(text, path, base_dir);
  } else {
    sent = trainyard::ParseJobSpec(text, path, base_dir, SubmitOverrides(args)).effective_yaml;
  }
  wire::Envelope request;
  auto* submit = request.mutable_submit();
  submit->set_search_base_path(search.base_path);  // jobctl reads a search's base file, not the coordinator
  submit->set_search_base_yaml(search.base_text);
  submit->set_yaml(sent);
  submit->set_source(path);
  submit->set_base_dir(base_dir);
  submit->set_idempotency_key(args.key.empty() ? NewKey() : args.key);
  submit->set_user(LoginName());
  const auto reply = Expect(Request(o, request));
  const int64_t id = reply.submitted().job_id();
  if (o.json)
    std::cout << nlohmann::json{{"job_id", id}, {"created", reply.submitted().created()}} << "\n";
  else
    std::cout << id << "\n";
  std::cout.flush();  // a script reading the id while the job runs (--wait) gets it now
  if (args.follow) return OutputLogs(o, id, /*follow=*/true, /*attempt=*/0, /*rank=*/-1);
  return args.wait ? WaitForEnd(o, id) : 0;
}

// A job state as a person names it ("queued", "RUNNING"); bad input otherwise.
wire::JobState ParseState(const std::string& name) {
  std::string upper = name;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  wire::JobState state = wire::JOB_STATE_UNSPECIFIED;
  if (!wire::JobState_Parse("JOB_" + upper, &state) || state == wire::JOB_STATE_UNSPECIFIED)
    throw Rejected(2, "--state '" + name +
                          "': expected queued, running, succeeded, failed, cancelled or stopped (several: "
                          "--state queued,running)");
  return state;
}

wire::Envelope ListRequestOf(const CommandArgs& args) {
  wire::Envelope request;
  wire::ListRequest* list = request.mutable_list();
  for (const std::string& given : args.states) {
    std::stringstream names(given);
    for (std::string name; std::getline(names, name, ',');) list->add_states(ParseState(name));
  }
  list->set_user(args.user);
  list->set_name_contains(args.name_contains);
  list->set_limit(args.limit);
  return request;
}

void PrintJobs(const Options& o, const std::vector<wire::JobInfo>& jobs, bool one) {
  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& j : jobs) out.push_back(ToJson(j));
    std::cout << (one ? out.at(0) : out).dump(2) << "\n";
    return;
  }
  PrintTable(jobs);
  for (const auto& j : jobs) PrintDetails(j, one);
}

// Every job the filters match, up to --limit, newest first: page after page, as the
// coordinator answers at most one page a request (ListReply in trainyard.proto).
std::vector<wire::JobInfo> ListedJobs(const Options& o, const CommandArgs& args) {
  std::vector<wire::JobInfo> jobs;
  wire::Envelope request = ListRequestOf(args);
  while (true) {
    const wire::Envelope reply = Expect(Request(o, request));
    jobs.insert(jobs.end(), reply.jobs().jobs().begin(), reply.jobs().jobs().end());
    const bool enough = args.limit > 0 && int64_t(jobs.size()) >= args.limit;
    if (enough || reply.jobs().next_before_id() == 0) return jobs;
    request.mutable_list()->set_before_id(reply.jobs().next_before_id());
    if (args.limit > 0) request.mutable_list()->set_limit(int(args.limit - int64_t(jobs.size())));
  }
}

int List(const Options& o, const CommandArgs& args) {
  PrintJobs(o, ListedJobs(o, args), false);
  return 0;
}

int Status(const Options& o, int64_t id) {
  wire::Envelope request;
  request.mutable_status()->set_job_id(id);
  PrintJobs(o, {Expect(Request(o, request)).job()}, true);
  return 0;
}

// The jobs `cancel` names: its ids, or the queued and running jobs (unless --state says
// otherwise) of the user its filters name.
std::vector<int64_t> JobsToCancel(const Options& o, CommandArgs args) {
  const bool filtered = !args.user.empty() || !args.states.empty() || !args.name_contains.empty();
  if (filtered == !args.ids.empty())
    throw Rejected(2, "cancel takes job ids, or --user (with --state and --name if wanted) to choose them; not both");
  if (!filtered) return args.ids;
  if (args.user.empty())
    throw Rejected(2, "cancel --state and --name need --user too: cancel does not choose every user's jobs at once");
  if (args.states.empty()) args.states = {"queued,running"};
  std::vector<int64_t> ids;
  for (const wire::JobInfo& j : ListedJobs(o, args)) ids.push_back(j.id());
  return ids;
}

// Cancels each job in turn; one refused or unknown does not keep the others running.
// Prints the jobs cancelled (with --json: one job's object for one id given, else an
// array). Exit status: the worst of them (2 for a refusal or an unknown job).
int Cancel(const Options& o, const CommandArgs& args) {
  std::vector<wire::JobInfo> cancelled;
  int status = 0;
  for (int64_t id : JobsToCancel(o, args)) {
    wire::Envelope request;
    request.mutable_cancel()->set_job_id(id);
    try {
      cancelled.push_back(Expect(Request(o, request)).job());
    } catch (const Rejected& e) {
      std::fprintf(stderr, "error: job %ld: %s\n", long(id), e.what());
      status = std::max(status, e.code == 2 ? 2 : 1);
    }
  }
  const bool one_id = args.ids.size() == 1;
  if (!cancelled.empty() || (o.json && !one_id)) PrintJobs(o, cancelled, one_id);
  return status;
}

// How `logs -f` ends: the job's final state on stderr (stdout holds the CSV), and an
// exit status a script can test.
int FinalState(int64_t id, wire::JobState state, const std::string& reason) {
  std::cout.flush();
  std::fprintf(stderr, "job %ld %s%s%s\n", long(id), trainyard::JobStateName(state).c_str(), reason.empty() ? "" : ": ",
               reason.c_str());
  return state == wire::JOB_SUCCEEDED ? 0 : 1;
}

// `submit --wait`: the job's state, polled each second, until it ends; then FinalState
// (and with --json the job's status as one more line).
int WaitForEnd(const Options& o, int64_t id) {
  while (true) {
    wire::Envelope request;
    request.mutable_status()->set_job_id(id);
    const wire::JobInfo job = Expect(Request(o, request)).job();
    if (job.job_state() != wire::JOB_QUEUED && job.job_state() != wire::JOB_RUNNING) {
      if (o.json) std::cout << ToJson(job).dump() << "\n";
      return FinalState(id, job.job_state(), job.reason());
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

// One epochs.csv row as a JSON object by column, numbers as numbers.
nlohmann::json RowObject(const std::vector<std::string>& columns, const std::vector<std::string>& cells) {
  nlohmann::json row = nlohmann::json::object();
  for (size_t i = 0; i < columns.size() && i < cells.size(); ++i) {
    char* end = nullptr;
    const double number = std::strtod(cells[i].c_str(), &end);
    const bool numeric = !cells[i].empty() && *end == '\0' && std::isfinite(number);
    row[columns[i]] = numeric ? nlohmann::json(number) : nlohmann::json(cells[i]);
  }
  return row;
}

// The rows as the worker prints them (common/epoch_table.h), as CSV with --csv, or with
// --json as one object a line.
int Logs(const Options& o, int64_t id, bool follow, bool csv) {
  int seen = 0;
  while (true) {
    wire::Envelope request;
    request.mutable_logs()->set_job_id(id);
    request.mutable_logs()->set_after(seen);
    const auto reply = Expect(Request(o, request));
    const std::string& header = reply.log_rows().csv_header();
    if (seen == 0 && !header.empty() && !o.json) std::cout << (csv ? header : trainyard::EpochTableHeader()) << "\n";
    const std::vector<std::string> columns = SplitCsv(header);
    for (const auto& line : reply.log_rows().csv_lines()) {
      if (o.json)
        std::cout << RowObject(columns, SplitCsv(line)).dump() << "\n";
      else
        std::cout << (csv ? line : trainyard::EpochTableRow(columns, SplitCsv(line))) << "\n";
    }
    seen += reply.log_rows().csv_lines_size();
    const wire::JobState state = reply.log_rows().job_state();
    if (!follow) return 0;
    if (state != wire::JOB_QUEUED && state != wire::JOB_RUNNING)
      return FinalState(id, state, reply.log_rows().reason());
    std::cout.flush();
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

// One line of an attempt's output as JSON: whose it is ("[rank R] " taken off), invalid
// UTF-8 replaced.
std::string OutputLineJson(int64_t id, int attempt, std::string line) {
  nlohmann::json rank = nullptr;
  if (line.rfind("[rank ", 0) == 0) {
    const size_t close = line.find("] ");
    char* end = nullptr;
    const long number = std::strtol(line.c_str() + 6, &end, 10);
    if (close != std::string::npos && end == line.c_str() + close) {
      rank = number;
      line.erase(0, close + 2);
    }
  }
  return nlohmann::json{{"job", id}, {"attempt", attempt}, {"rank", rank}, {"line", line}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void PrintOutput(const Options& o, int64_t id, int attempt, const std::string& text) {
  if (!o.json) {
    std::cout << text;
    return;
  }
  for (size_t begin = 0, end; begin < text.size(); begin = end + 1) {
    end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::cout << OutputLineJson(id, attempt, text.substr(begin, end - begin)) << "\n";
  }
}

// `logs --output`: an attempt's output.log, read through the coordinator by offset
// (Note [Job output] in coordinator/job_output.h). With `follow`, until the job ends;
// following the latest attempt moves on to each new one (a retry), saying so on stderr.
int OutputLogs(const Options& o, int64_t id, bool follow, int attempt, int rank) {
  const bool latest = attempt == 0;
  int64_t offset = 0;
  while (true) {
    wire::Envelope request;
    wire::LogsRequest* logs = request.mutable_logs();
    logs->set_job_id(id);
    logs->set_output(true);
    logs->set_attempt(attempt);
    logs->set_offset(offset);
    if (rank >= 0) logs->set_rank(rank);
    const wire::LogsReply reply = Expect(Request(o, request)).log_rows();
    if (reply.output_restarted())
      std::fprintf(stderr, "jobctl: attempt %d's output.log was rotated; reading on from its start\n", reply.attempt());
    attempt = reply.attempt();
    PrintOutput(o, id, attempt, reply.output());
    offset = reply.output_offset();
    if (!reply.output().empty() || reply.output_offset() > logs->offset()) continue;  // there may be more
    if (latest && reply.attempts() > attempt) {
      attempt = reply.attempts();
      offset = 0;
      std::cout.flush();
      std::fprintf(stderr, "jobctl: job %ld attempt %d\n", long(id), attempt);
      continue;
    }
    const wire::JobState state = reply.job_state();
    if (!follow) return 0;
    if (state != wire::JOB_QUEUED && state != wire::JOB_RUNNING) return FinalState(id, state, reply.reason());
    std::cout.flush();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

// The epoch rows as a table: the timing columns a user reads first, and where the
// step time went (median across ranks) with the slowest rank named.
void PrintEpochTable(const wire::ReportReply& r) {
  const std::vector<std::string> header = SplitCsv(r.csv_header());
  const std::vector<std::pair<const char*, const char*>> columns = {
      {"epoch", "epoch"},         {"time_s", "time s"},    {"ms_per_step", "ms/step"},  {"samples_per_s", "samp/s"},
      {"data_wait_pct", "wait%"}, {"train_loss", "loss"},  {"eval_acc", "acc"},         {"forward_ms_med", "fwd"},
      {"backward_ms_med", "bwd"}, {"comm_ms_med", "comm"}, {"optimizer_ms_med", "opt"}, {"slowest_rank", "slowest"}};
  std::printf("%-8s", "attempt");
  for (const auto& [key, title] : columns) std::printf(" %9s", title);
  std::printf("\n");
  for (int i = 0; i < r.csv_lines_size(); ++i) {
    const std::vector<std::string> cells = SplitCsv(r.csv_lines(i));
    std::printf("%-8d", r.row_attempts(i));
    for (const auto& [key, title] : columns) {
      std::string value = "-";
      for (size_t c = 0; c < header.size() && c < cells.size(); ++c)
        if (header[c] == key) value = cells[c];
      std::printf(" %9s", value.c_str());
    }
    std::printf("\n");
  }
}

int Report(const Options& o, int64_t id) {
  wire::Envelope request;
  request.mutable_report()->set_job_id(id);
  const auto reply = Expect(Request(o, request));
  const wire::ReportReply& r = reply.job_report();
  if (o.json) {
    nlohmann::json out = ToJson(r.job());
    out["attempts"] = nlohmann::json::array();
    for (const auto& a : r.attempts())
      out["attempts"].push_back({{"attempt", a.attempt()},
                                 {"placement", a.placement()},
                                 {"started_at", a.started_at()},
                                 {"ended_at", a.ended_at()},
                                 {"rank_seconds", a.rank_seconds()},
                                 {"gpu_seconds", a.gpu_seconds()},
                                 {"outcome", a.end() == wire::OUTCOME_UNSPECIFIED ? "" : DescribeEnd(a)}});
    out["epochs"] = nlohmann::json::array();
    const std::vector<std::string> header = SplitCsv(r.csv_header());
    for (int i = 0; i < r.csv_lines_size(); ++i) {
      nlohmann::json row = {{"attempt", r.row_attempts(i)}};
      const std::vector<std::string> cells = SplitCsv(r.csv_lines(i));
      for (size_t c = 0; c < header.size() && c < cells.size(); ++c) row[header[c]] = cells[c];
      out["epochs"].push_back(row);
    }
    if (!r.summary_json().empty()) out["summary"] = trainyard::ParseBoundedJsonOrDiscarded(r.summary_json());
    if (r.job().is_search()) out["search"] = trainyard::SearchJson(r.search());
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  const wire::JobInfo& j = r.job();
  std::printf("job %ld '%s': %s, %d ranks (%s), priority %d\n", long(j.id()), j.name().c_str(),
              trainyard::JobStateName(j.job_state()).c_str(), j.ranks(), j.device().c_str(), j.priority());
  if (!j.reason().empty()) std::printf("reason: %s\n", j.reason().c_str());
  std::printf("\nattempts:\n  %-3s %-28s %-19s %8s  %s\n", "#", "placement", "started", "seconds", "outcome");
  for (const auto& a : r.attempts())
    std::printf("  %-3d %-28s %-19s %8s  %s\n", a.attempt(), a.placement().c_str(), FormatTime(a.started_at()).c_str(),
                a.ended_at() > 0 ? std::to_string(int(a.ended_at() - a.started_at())).c_str() : "-",
                DescribeEnd(a).c_str());
  if (r.csv_lines_size() > 0) {
    std::printf("\nepochs (step parts: median ms per step across ranks):\n");
    PrintEpochTable(r);
  }
  if (!r.summary_json().empty()) std::printf("\nsummary: %s\n", r.summary_json().c_str());
  if (j.is_search()) PrintSearchReport(r.search());
  if (j.events_size() > 0) std::printf("\nevents:\n");
  for (const auto& e : j.events()) std::printf("  %s\n", e.c_str());
  return 0;
}

int Workers(const Options& o) {
  wire::Envelope request;
  request.mutable_workers();
  const auto reply = Expect(Request(o, request));
  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& w : reply.worker_list().workers())
      out.push_back({{"world", w.rank().world()},
                     {"rank", w.rank().rank()},
                     {"world_size", w.rank().world_size()},
                     {"host", w.rank().host()},
                     {"slot", w.rank().slot()},
                     {"device", w.rank().device()},
                     {"pid", w.rank().pid()},
                     {"job_id", w.job_id()},
                     {"attempt", w.attempt()},
                     {"seen_ago_s", w.seen_ago_s()},
                     {"last_log_line", w.last_log_line()}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("%-28s %5s %-5s %-16s %4s %8s %8s %7s\n", "agent", "rank", "dev", "host", "slot", "pid", "job", "seen");
  for (const auto& w : reply.worker_list().workers())
    std::printf("%-28s %5d %-5s %-16s %4d %8ld %8s %6.1fs\n", w.rank().world().c_str(), w.rank().rank(),
                w.rank().device().c_str(), w.rank().host().c_str(), w.rank().slot(), long(w.rank().pid()),
                w.job_id() ? std::to_string(w.job_id()).c_str() : "idle", w.seen_ago_s());
  return 0;
}

// `artifacts`: the job's files on every host (Note [Artifacts] in coordinator/artifacts.h).
wire::ArtifactsReply ListArtifacts(const Options& o, int64_t id) {
  wire::Envelope request;
  request.mutable_artifacts()->set_job_id(id);
  return Expect(Request(o, request)).artifact_list();
}

int Artifacts(const Options& o, int64_t id) {
  const wire::ArtifactsReply reply = ListArtifacts(o, id);
  if (o.json) {
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : reply.files())
      files.push_back({{"path", f.path()}, {"size", f.size()}, {"host", f.host()}, {"modified", f.modified()}});
    std::cout << nlohmann::json{{"files", files},
                                {"unreachable", reply.unreachable()},
                                {"truncated", reply.truncated()}}
                     .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
    return 0;
  }
  std::printf("%-16s %12s  %-19s  %s\n", "host", "bytes", "modified", "path");
  for (const auto& f : reply.files()) {
    char when[32] = "-";
    const std::time_t t = static_cast<std::time_t>(f.modified());
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
    std::printf("%-16s %12ld  %-19s  %s\n", f.host().c_str(), long(f.size()), when, f.path().c_str());
  }
  if (reply.truncated()) std::printf("(a host had more files than one listing holds: %s)\n", "not all are shown");
  for (const auto& why : reply.unreachable()) std::fprintf(stderr, "not listed: %s\n", why.c_str());
  return 0;
}

// The host holding `path` of job `id` when the user named none: the only one, else an
// error naming them.
std::string HostOf(const Options& o, int64_t id, const std::string& path) {
  std::vector<std::string> hosts;
  const wire::ArtifactsReply listing = ListArtifacts(o, id);
  for (const auto& f : listing.files())
    if (f.path() == path) hosts.push_back(f.host());
  if (hosts.empty())
    throw Rejected(2, "job " + std::to_string(id) + " has no file " + path + " (see jobctl artifacts)");
  if (hosts.size() > 1) {
    std::string names;
    for (const auto& h : hosts) names += (names.empty() ? "" : ", ") + h;
    throw Rejected(2, path + " is on several hosts (" + names + "): name one with --host");
  }
  return hosts.front();
}

// `fetch`: one file in chunks by offset into <to>/<its name>.part, renamed when whole; a
// .part left by a fetch that broke off is resumed from its size.
int Fetch(const Options& o, int64_t id, const std::string& path, std::string host, const std::string& to) {
  if (host.empty()) host = HostOf(o, id, path);
  const std::filesystem::path target = std::filesystem::path(to) / std::filesystem::path(path).filename();
  const std::string part = target.string() + ".part";
  std::error_code error;
  int64_t offset = std::filesystem::exists(part) ? int64_t(std::filesystem::file_size(part, error)) : 0;
  std::ofstream out(part, std::ios::binary | std::ios::app);
  if (!out) throw Rejected(2, "--to " + to + ": cannot write " + part);
  const int64_t resumed_at = offset;
  for (int64_t size = -1; size < 0 || offset < size;) {
    wire::Envelope request;
    wire::FetchRequest* fetch = request.mutable_fetch();
    fetch->set_job_id(id);
    fetch->set_path(path);
    fetch->set_host(host);
    fetch->set_offset(offset);
    const wire::FetchReply reply = Expect(Request(o, request)).fetched();
    size = reply.size();
    if (offset > size)
      throw Rejected(1, part + " is longer than " + path + " on " + host + ": remove it and fetch again");
    if (reply.data().empty() && offset < size) throw Rejected(1, "the coordinator sent no bytes of " + path);
    out.write(reply.data().data(), std::streamsize(reply.data().size()));
    offset += int64_t(reply.data().size());
  }
  out.close();
  if (!out) throw Rejected(1, "cannot write " + part);
  std::filesystem::rename(part, target);
  if (o.json)
    std::cout << nlohmann::json{{"path", path},
                                {"host", host},
                                {"to", target.string()},
                                {"bytes", offset},
                                {"resumed_at", resumed_at}}
              << "\n";
  else
    std::printf("%s from %s: %ld bytes to %s%s\n", path.c_str(), host.c_str(), long(offset), target.c_str(),
                resumed_at > 0 ? (" (resumed at byte " + std::to_string(resumed_at) + ")").c_str() : "");
  return 0;
}

// CLI11's Range lets NaN through (every comparison with it is false).
CLI::Validator FiniteRange(double low, double high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        double value = 0;
        try {
          size_t used = 0;
          value = std::stod(text, &used);
          if (used != text.size()) return "'" + text + "' is not a number";
        } catch (const std::exception&) {
          return "'" + text + "' is not a number";
        }
        if (!std::isfinite(value) || value < low || value > high)
          return "'" + text + "' is not in [" + std::to_string(low) + ", " + std::to_string(high) + "]";
        return "";
      },
      "FLOAT in [" + std::to_string(low) + " - " + std::to_string(high) + "]");
}

// The subcommands' arguments.

int UsageCommand(const Options& o, bool per_user) {
  wire::Envelope request;
  request.mutable_usage()->set_per_user(per_user);
  const auto reply = Expect(Request(o, request));
  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : reply.usage_rows().rows())
      out.push_back({{"user", r.user()},
                     {"jobs", r.jobs()},
                     {"attempts", r.attempts()},
                     {"rank_seconds", r.rank_seconds()},
                     {"gpu_seconds", r.gpu_seconds()},
                     {"fairshare_rank_seconds", r.fairshare_rank_seconds()},
                     {"running_ranks", r.running_ranks()},
                     {"queued_jobs", r.queued_jobs()}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("%-16s %6s %8s %14s %14s %14s %8s %7s\n", "user", "jobs", "attempts", "rank-hours", "gpu-hours",
              "fairshare-h", "running", "queued");
  for (const auto& r : reply.usage_rows().rows())
    std::printf("%-16s %6ld %8ld %14.3f %14.3f %14.3f %8d %7d\n",
                per_user ? (r.user().empty() ? "-" : r.user().c_str()) : "all", long(r.jobs()), long(r.attempts()),
                r.rank_seconds() / 3600, r.gpu_seconds() / 3600, r.fairshare_rank_seconds() / 3600, r.running_ranks(),
                r.queued_jobs());
  return 0;
}

int RunCommand(Options& o, const std::string& command, const CommandArgs& args);

void AddSubmit(CLI::App& app, CommandArgs& args) {
  auto* submit = app.add_subcommand(
      "submit", "queue a job file, or a kind: search file (with its base file's text); prints the job id");
  submit->add_option("job", args.job_file, "job YAML file")->required()->check(CLI::ExistingFile);
  submit->add_option("--key", args.key,
                     "idempotency key (default: random); a resend with the same key makes no new job");
  submit
      ->add_option("--set", args.sets,
                   "KEY.PATH=VALUE: set a key of the job file, as `worker --set` does (repeatable); the job goes\n"
                   "as it will run, with these applied and ${VAR} expanded from this environment")
      ->allow_extra_args(false);
  submit->add_option("--ranks", args.ranks, "resources.ranks for this submission");
  submit->add_option("--priority", args.priority, "resources.priority for this submission");
  submit->add_option("--name", args.name, "the job's name for this submission");
  auto* wait = submit->add_flag("--wait", args.wait,
                                "wait for the job to end; print its final state to stderr and exit 0 if it succeeded, "
                                "1 if it\nfailed or was cancelled");
  submit
      ->add_flag("--follow", args.follow,
                 "as --wait, printing the job's output meanwhile as it comes (as `logs --output -f`)")
      ->excludes(wait);
}

// list's filters, which cancel shares (less --limit).
void AddFilters(CLI::App* command, CommandArgs& args) {
  command
      ->add_option("--state", args.states,
                   "only jobs in this state: queued, running, succeeded, failed, cancelled or stopped\n"
                   "(repeatable, or comma-separated)")
      ->allow_extra_args(false);
  command->add_option("--user", args.user, "only jobs this user owns");
  command->add_option("--name", args.name_contains, "only jobs whose name contains this text");
}

void AddQueries(CLI::App& app, CommandArgs& args) {
  auto* list = app.add_subcommand("list", "jobs, newest first, with each one's metric from its newest epoch row");
  AddFilters(list, args);
  list->add_option("--limit", args.limit, "at most this many (the newest); 0: all")->check(CLI::NonNegativeNumber);
  app.add_subcommand("status", "one job, with its events and when each happened")
      ->add_option("id", args.id, "job id")
      ->required()
      ->check(CLI::PositiveNumber);
  auto* cancel = app.add_subcommand("cancel",
                                    "cancel jobs by id, or a user's queued and running jobs (--user, narrowed by "
                                    "--state\nand --name); a running one stops on all its ranks");
  cancel->add_option("ids", args.ids, "job ids")->check(CLI::PositiveNumber);
  AddFilters(cancel, args);
  app.add_subcommand("report",
                     "one job: attempts and their outcomes, epoch timings with the step breakdown, "
                     "summary and events; a search's trials as a leaderboard")
      ->add_option("id", args.id, "job id")
      ->required()
      ->check(CLI::PositiveNumber);
  app.add_subcommand("workers", "the registered worker ranks and what each runs");
  app.add_subcommand("usage",
                     "rank-hours and GPU-hours used by every attempt that ran (running ones until now), from\n"
                     "when its ranks started to when it ended")
      ->add_flag("--user", args.per_user, "one row per job owner, instead of a total");
  app.add_subcommand("artifacts",
                     "the job's files on every host it used, with sizes and times: model, checkpoints, epochs,\n"
                     "predictions, plots, reports, output (its owner or an admin)")
      ->add_option("id", args.id, "job id")
      ->required()
      ->check(CLI::PositiveNumber);
  auto* fetch = app.add_subcommand(
      "fetch", "copy one of the job's files here over the coordinator's wire, resuming a fetch that broke off");
  fetch->add_option("id", args.id, "job id")->required()->check(CLI::PositiveNumber);
  fetch->add_option("path", args.path, "the file, as `jobctl artifacts` names it")->required();
  fetch->add_option("--host", args.host, "the host to read it from (needed when it is on several)");
  fetch->add_option("--to", args.to, "the folder to write it into (default .)")->check(CLI::ExistingDirectory);
  auto* logs = app.add_subcommand(
      "logs", "the job's epoch rows, as the worker's epoch table (CSV with --csv; with --json one object a line)");
  logs->add_option("id", args.id, "job id")->required()->check(CLI::PositiveNumber);
  logs->add_flag("--csv", args.csv, "print epochs.csv's header and lines instead of the table");
  logs->add_flag("-f,--follow", args.follow,
                 "keep printing rows until the job ends, then print its final state to stderr and exit 0 if it\n"
                 "succeeded, 1 if it failed or was cancelled");
  auto* output =
      logs->add_flag("--output", args.output,
                     "the ranks' stdout and stderr (the attempt's output.log: \"[rank R] \" before each line of a\n"
                     "job of several ranks) instead of the epoch rows; with --json one object a line");
  logs->add_option("--attempt", args.attempt,
                   "--output: this attempt (default: the latest; with -f, each new one as the job is retried)")
      ->check(CLI::PositiveNumber)
      ->needs(output);
  logs->add_option("--rank", args.rank, "--output: only the lines of this job rank (and mpirun's own)")
      ->check(CLI::NonNegativeNumber)
      ->needs(output);
}

int Main(int argc, char** argv) {
  CLI::App app{"jobctl: submit and inspect Trainyard jobs.\nExit codes: 0 ok, 2 bad input, 1 failure."};
  Options o;
  // Subcommands take the flags above wherever they stand ("jobctl list --json").
  app.fallthrough();
  app.add_option("--coordinator", o.coordinator,
                 "coordinator endpoint; default $TRAINYARD_COORDINATOR, else tcp://127.0.0.1:5555")
      ->envname("TRAINYARD_COORDINATOR");
  app.add_option("--timeout", o.timeout_s, "seconds to wait for each reply, 0.01 to 3600 (default 2.5)")
      ->check(FiniteRange(0.01, 3600.0));
  app.add_option("--retries", o.retries, "tries before giving up, 1 to 100 (default 3)")->check(CLI::Range(1, 100));
  app.add_flag("--json", o.json, "machine-readable output");
  app.add_option("--keys", o.keys_dir,
                 "key folder made by `coordinator --init` (client.key, coordinator.pub); default $TRAINYARD_KEYS,\n"
                 "else ./keys");
  app.add_flag("--insecure", o.insecure, "development only: talk to a coordinator started with --insecure");
  app.require_subcommand(1);
  CommandArgs args;
  AddSubmit(app, args);
  AddQueries(app, args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return RunCommand(o, app.get_subcommands().front()->get_name(), args);
}

// Runs `command`; exit code 2 for what the user must fix, 1 for other failures.
int RunCommand(Options& o, const std::string& command, const CommandArgs& args) {
  try {
    if (!o.insecure) o.keys = trainyard::LoadPeerKeys(o.keys_dir, trainyard::WireRole::kClient);
    if (command == "submit") return Submit(o, args);
    if (command == "logs" && args.output) return OutputLogs(o, args.id, args.follow, args.attempt, args.rank);
    if (command == "logs") return Logs(o, args.id, args.follow, args.csv);
    if (command == "report") return Report(o, args.id);
    if (command == "workers") return Workers(o);
    if (command == "usage") return UsageCommand(o, args.per_user);
    if (command == "artifacts") return Artifacts(o, args.id);
    if (command == "fetch") return Fetch(o, args.id, args.path, args.host, args.to);
    if (command == "list") return List(o, args);
    if (command == "cancel") return Cancel(o, args);
    return Status(o, args.id);
  } catch (const trainyard::SpecError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const trainyard::KeyError& e) {
    std::fprintf(stderr, "error: %s (or --insecure, if the coordinator runs with it)\n", e.what());
    return 2;
  } catch (const Rejected& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.code == 2 ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {  // from setting up the command line
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
