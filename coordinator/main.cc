// coordinator: the Trainyard daemon. Queues jobs durably in SQLite, answers jobctl, and
// gang-schedules them onto registered worker ranks.
// SIGHUP re-reads the allowlists (workers.allow, clients.allow) for new connections.
// Exit codes: 0 after SIGINT/SIGTERM (and after --init), 2 for bad options, missing or
// unusable keys, a corrupt or read-only state database, a runs folder that cannot be
// written, or (--slurm) a slurmctld that does not answer.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>

#include "common/open_file_limit.h"
#include "coordinator/server.h"
#ifdef TRAINYARD_HAVE_DASHBOARD
#include "coordinator/dashboard_server.h"
#endif

namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_reload_keys{false};
void OnSignal(int) { g_stop = true; }
void OnHangup(int) { g_reload_keys = true; }

int InitKeys(const std::string& dir) {
  try {
    trainyard::InitKeyDir(dir);
  } catch (const trainyard::KeyError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  std::printf(
      "keys made in %s\n"
      "  workers:  mpirun -n N worker --coordinator ENDPOINT --keys %s\n"
      "  jobctl:   jobctl --keys %s ...   (or export TRAINYARD_KEYS=%s)\n"
      "Copy the folder only to hosts and users you trust: worker.key lets a process act as a worker rank,\n"
      "client.key lets it submit and cancel jobs.\n",
      dir.c_str(), dir.c_str(), dir.c_str(), dir.c_str());
  return 0;
}

// --add-client: a named client key (Note [Client keys name users] in common/curve/curve_keys.h).
int AddClient(const std::string& keys_dir, const std::string& user, const std::string& role, std::string out_dir) {
  if (out_dir.empty()) out_dir = (std::filesystem::path(keys_dir) / "clients" / user).string();
  try {
    trainyard::AddClientKey(keys_dir, user, role, out_dir);
  } catch (const trainyard::KeyError& e) {
    std::fprintf(stderr, "error: --add-client: %s\n", e.what());
    return 2;
  }
  std::printf(
      "client key for %s (%s) made in %s and added to %s/clients.allow\n"
      "  jobctl:   jobctl --keys %s ...\n"
      "A running coordinator admits the key once it re-reads clients.allow: kill -HUP its pid\n",
      user.c_str(), role.c_str(), out_dir.c_str(), keys_dir.c_str(), out_dir.c_str());
  return 0;
}

// What the command line says beyond the server's own options.
struct CommandLine {
  trainyard::ServerOptions server;
  bool init = false;
  std::string add_client, client_role = "user", client_dir;
  CLI::Option* keys = nullptr;
  std::string http_address;
  int64_t max_output_mb = 64;
  std::string chartjs = "/usr/share/javascript/chart.js/chart.min.js";
};

void AddSlurmOptions(CLI::App& app, CommandLine* c) {
  trainyard::SlurmOptions& s = c->server.slurm;
  auto* slurm = app.add_flag("--slurm", s.enabled,
                             "run each attempt as a Slurm batch job (sbatch) instead of on pool agents: Slurm\n"
                             "decides where and when; the script is kept as <runs>/<id>/attempt-<n>/job.sbatch.\n"
                             "An elastic job's replicas are a Slurm job each (job.replica-<r>.sbatch).\n"
                             "Needs Slurm's client commands here and slurmctld answering (else exit 2)");
  // They become #SBATCH lines of every script: a name, nothing that could end the line.
  const CLI::Validator slurm_name(
      [](const std::string& v) {
        const bool plain = !v.empty() && std::all_of(v.begin(), v.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == ',';
        });
        return plain ? std::string() : "expected a Slurm name: letters, digits, '.', '_', '-' and ','";
      },
      "NAME");
  app.add_option("--slurm-partition", s.partition, "--slurm: the partition to submit to (default: Slurm's)")
      ->check(slurm_name)
      ->needs(slurm);
  app.add_option("--slurm-account", s.account, "--slurm: the account to charge (default: Slurm's)")
      ->check(slurm_name)
      ->needs(slurm);
  app.add_option("--slurm-time", s.time_limit_minutes,
                 "--slurm: each attempt's time limit in minutes (default 0: the partition's)")
      ->check(CLI::Range(0, 525600))
      ->needs(slurm);
  app.add_option("--slurm-signal", s.signal_lead_s,
                 "--slurm: seconds before the time limit at which Slurm sends the ranks SIGUSR1, so they\n"
                 "stop after a step with a checkpoint and the job is requeued without counting a restart\n"
                 "(default 60; 0: no signal)")
      ->check(CLI::Range(0, 65535))
      ->needs(slurm);
  app.add_option("--slurm-worker", s.worker,
                 "--slurm: the worker binary, at the same path on every node (default: the worker beside\n"
                 "this coordinator)")
      ->needs(slurm);
  app.add_option("--advertise", s.endpoint,
                 "--slurm: the endpoint the Slurm jobs' ranks reach this coordinator at (default: --listen)")
      ->needs(slurm);
}

void AddKeyOptions(CLI::App& app, CommandLine* c) {
  app.add_flag("--init", c->init,
               "make the CURVE keys in the --keys folder (0700, secrets 0600) and exit; workers and jobctl\n"
               "use the same folder (their --keys, or $TRAINYARD_KEYS)");
  auto* add = app.add_option("--add-client", c->add_client,
                             "make a client key pair for the user NAME, add it to clients.allow and exit: jobs it\n"
                             "submits belong to NAME, and it may cancel only those unless --client-role is admin");
  app.add_option("--client-role", c->client_role, "--add-client: user (default) or admin")
      ->check(CLI::IsMember({"user", "admin"}))
      ->needs(add);
  app.add_option("--client-dir", c->client_dir,
                 "--add-client: where to write its client.key and coordinator.pub, the folder jobctl --keys\n"
                 "takes (default: <keys>/clients/NAME)")
      ->needs(add);
  c->keys = app.add_option("--keys", c->server.keys_dir,
                           "key folder: coordinator.key, workers.allow, clients.allow (default: $TRAINYARD_KEYS,\n"
                           "else keys/ beside the --state file)");
}

void AddSchedulingOptions(CLI::App& app, CommandLine* c) {
  trainyard::SchedulingPolicy& p = c->server.policy;
  app.add_option("--preemption", p.preemption,
                 "on: a queued job that cannot be placed stops the fewest running preemptible jobs of lower\n"
                 "priority, which checkpoint after their step in progress and are requeued without counting a\n"
                 "restart (default off)")
      ->transform(CLI::IsMember(std::map<std::string, bool>{{"on", true}, {"off", false}}));
  app.add_option("--preempt-grace", p.preempt_grace_s,
                 "seconds a preempted job has to stop before its ranks are killed; it then resumes from its\n"
                 "last checkpoint (default 60)")
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--fairshare-half-life", p.fairshare_half_life_h,
                 "hours over which a user's past usage counts half as much, for fair share among jobs of equal\n"
                 "priority (default 168, a week, as Slurm's PriorityDecayHalfLife; 0: never decays)")
      ->check(CLI::Range(0.0, 87600.0));
  app.add_option("--user-max-ranks", p.user_max_ranks,
                 "most ranks one user's jobs may run at once; their other jobs wait (default 0: no limit)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--user-max-queued", p.user_max_queued,
                 "most jobs one user may have queued; a submission past it is refused, and a search counts as\n"
                 "its max_concurrent trials (default 0: no limit)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--user-max-priority", p.user_max_priority,
                 "highest resources.priority a user key's job may ask; admin keys may ask more, and only they\n"
                 "may submit preemptible: false (default 0)")
      ->check(CLI::Range(-1000000, 1000000));
}

void AddOptions(CLI::App& app, CommandLine* c) {
  trainyard::ServerOptions& o = c->server;
  app.add_option("--listen", o.listen, "ZeroMQ endpoint to bind (default tcp://127.0.0.1:5555: loopback only)");
  app.add_option("--state", o.state_path, "SQLite state database (created if missing; default trainyard.db)");
  app.add_option("--runs", o.runs_dir,
                 "folder for <job id>/ (default runs); a job's ranks use the same path on their own hosts\n"
                 "(model and logs on its rank 0's host, checkpoints on each host's own disk): it need not be shared");
  app.add_flag("--fresh", o.fresh, "set a corrupt state database aside (<state>.corrupt) and start empty");
  AddKeyOptions(app, c);
  app.add_flag("--insecure", o.insecure,
               "development only: no encryption and no authentication; anyone who can reach --listen can\n"
               "submit jobs and forge worker messages");
  app.add_option("--max-message-bytes", o.max_message_bytes, "largest message accepted (default 16 MiB)")
      ->check(CLI::Range(int64_t(1024), int64_t(1) << 32));
  app.add_option("--max-ranks-per-worker-key", o.max_ranks_per_worker_key,
                 "ranks registered at once with one worker key (default 4096); a registration past it is\n"
                 "refused, so what a key holder makes the coordinator keep is bounded")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  app.add_option("--list-page", o.list_page,
                 "jobs in one reply to a listing (default 500); jobctl list and the Python client ask\n"
                 "page after page, so a long history never holds the loop for long")
      ->check(CLI::Range(int64_t(1), int64_t(100000)));
  app.add_option("--keep-history", o.keep_history_days,
                 "forget the jobs that ended more than this many days ago (their rows, not their run\n"
                 "folders), keeping their totals for usage, fair share and /metrics (default 0: keep all)")
      ->check(CLI::Range(0.0, 36500.0));
  app.add_option("--max-output-mb", c->max_output_mb,
                 "each attempt's output (<runs>/<job id>/attempt-<n>/output.log) is rotated to output.log.1\n"
                 "when it would grow past this many MiB (default 64)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  app.add_option("--max-submit-bytes", o.submit_budget.max_bytes,
                 "largest job file accepted by a submission (default 1 MiB); files are also capped at\n"
                 "10000 YAML nodes and 32 levels of nesting, checked before they are parsed")
      ->check(CLI::Range(size_t(1024), size_t(64) << 20));
  app.add_option("--heartbeat", o.heartbeat_s, "seconds between heartbeats (default 1)")->check(CLI::Range(0.05, 60.0));
  app.add_option("--liveness", o.liveness, "heartbeats a rank may miss before it counts as lost (default 3)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--grace", o.grace_s,
                 "seconds for ranks to start an assignment, or to re-register after a restart (default 30)")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--restart-backoff", o.restart_backoff_s,
                 "seconds before the first retry of a failed job; doubles per retry, at most 60 (default 2)")
      ->check(CLI::Range(0.0, 60.0));
  app.add_option("--http", c->http_address,
                 "serve the web dashboard, its JSON API (/api) and Prometheus metrics (/metrics) on\n"
                 "[HOST:]PORT, e.g. 127.0.0.1:8265 (HOST defaults to 127.0.0.1; default: no dashboard).\n"
                 "The dashboard is read-only but has no authentication: keep it on loopback");
  app.add_option("--chartjs", c->chartjs, "Chart.js for the dashboard's charts (default: Debian's libjs-chart.js)");
  AddSchedulingOptions(app, c);
  AddSlurmOptions(app, c);
}

// Runs the coordinator until SIGINT or SIGTERM; exit code 2 for what the user must fix.
int Serve(const CommandLine& c) {
  const trainyard::ServerOptions& o = c.server;
  const std::string& http_address = c.http_address;
#ifdef TRAINYARD_HAVE_DASHBOARD
  trainyard::DashboardOptions dashboard_options;
  dashboard_options.chartjs_path = c.chartjs;
  if (!http_address.empty()) {
    try {
      trainyard::ParseHttpAddress(http_address, &dashboard_options);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    }
  }
#else
  if (!http_address.empty()) {
    std::fprintf(stderr, "error: --http: this coordinator was built without Boost.Beast, so it has no dashboard\n");
    return 2;
  }
#endif
  // A connection, hence a descriptor, per agent rank and client: as many as allowed.
  trainyard::RaiseOpenFileLimit(std::numeric_limits<size_t>::max());
  try {
    trainyard::Server server(o);
    spdlog::info("coordinator listening on {} (state {})", server.endpoint(), o.state_path);
#ifdef TRAINYARD_HAVE_DASHBOARD
    std::unique_ptr<trainyard::DashboardServer> dashboard;
    if (!http_address.empty()) {
      try {
        dashboard = std::make_unique<trainyard::DashboardServer>(server.context(), dashboard_options);
      } catch (const std::runtime_error& e) {
        std::fprintf(stderr, "error: --http %s: %s\n", http_address.c_str(), e.what());
        return 2;
      }
      if (dashboard_options.host != "127.0.0.1" && dashboard_options.host != "localhost")
        spdlog::warn("the dashboard listens on {}, beyond loopback, without authentication", dashboard_options.host);
      spdlog::info("dashboard on http://{}:{}/ (API: /api, metrics: /metrics)", dashboard_options.host,
                   dashboard->port());
    }
#endif
    server.Run(g_stop, &g_reload_keys);
    spdlog::info("coordinator stopping; {} bad frames dropped", server.bad_frames());
    return 0;
  } catch (const trainyard::StoreError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const trainyard::KeyError& e) {
    std::fprintf(stderr, "error: %s (or run with --insecure, for development only)\n", e.what());
    return 2;
  } catch (const trainyard::ConfigError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const zmq::error_t& e) {
    std::fprintf(stderr, "error: cannot listen on %s: %s\n", o.listen.c_str(), e.what());
    return 2;
  }
}

int Main(int argc, char** argv) {
  CLI::App app{
      "Trainyard coordinator: a crash-safe job queue (SQLite, WAL) behind a ZeroMQ socket.\n"
      "Once: coordinator --init (makes the CURVE keys in keys/ beside the state file).\n"
      "Worker pools join with: mpirun -n N worker --coordinator ENDPOINT --keys KEYS\n"
      "Submit and inspect jobs with jobctl. Each attempt's epochs.csv, summary.json and its ranks'\n"
      "output (output.log) go to <runs>/<job id>/attempt-<n>/, the job's combined epochs.csv to\n"
      "<runs>/<job id>/.\n"
      "With --http 127.0.0.1:8265 it also serves a web dashboard, its read-only JSON API (GET /api)\n"
      "and Prometheus metrics (GET /metrics).\n"
      "With --slurm each attempt runs as a Slurm batch job (srun of the worker) instead of on pool agents."};
  CommandLine c;
  AddOptions(app, &c);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (c.keys->count() == 0) {  // $TRAINYARD_KEYS, else keys/ beside the state file
    const char* env_keys = std::getenv("TRAINYARD_KEYS");
    c.server.keys_dir = env_keys && *env_keys
                            ? std::string(env_keys)
                            : (std::filesystem::path(c.server.state_path).parent_path() / "keys").string();
  }
  c.server.max_output_bytes = c.max_output_mb << 20;
  if (c.init) return InitKeys(c.server.keys_dir);
  if (!c.add_client.empty()) return AddClient(c.server.keys_dir, c.add_client, c.client_role, c.client_dir);
  if (c.server.slurm.enabled && c.server.slurm.worker.empty())
    c.server.slurm.worker = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "worker").string();
  spdlog::set_pattern("[%H:%M:%S] %v");
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGHUP, OnHangup);
  std::signal(SIGPIPE, SIG_IGN);
  return Serve(c);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
