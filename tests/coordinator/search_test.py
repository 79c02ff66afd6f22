#!/usr/bin/env python3
"""Hyperparameter searches (`kind: search`) end to end: a real coordinator, a real 2-rank
pool under mpirun, real jobctl, trials that train real (small) langid jobs on 127.0.0.1.

Cases:
  asha   an ASHA search of 9 trials (1,000 examples of 32 tokens, 5 epochs; --trials,
         --examples, --max-seq-len and --epochs), train.lr log-uniform over [1e-5, 1e-1], eta 3,
         rungs at epochs 1 and 3, one trial at a time, with the coordinator killed
         (kill -9) mid-search and restarted. Checked:
           - the search drew the trial set an independent SplitMix64 gives (Note
             [Trial draws] in common/spec/search_spec.h);
           - each trial ran as one job, no epoch was logged twice, and a stopped trial
             logged every epoch up to its rung and at most the one it was in when the
             stop reached it (no trial waits for a decision; the trial that ran while
             the coordinator was down may have gone further);
           - every decision equals what ASHA's rule (Note [ASHA], implemented again
             here) makes over the metrics the trials logged, in trial order: the
             decisions a search without the kill makes, since the trials are
             deterministic; stopped trials are STOPPED, the others SUCCEEDED;
           - the best trial is the best of those run to the end, and its model folder
             exists; the search trained at most half the full runs' epochs;
             search.csv has a row per trial with its decision.
         With --reference (scripts/bench/search.sh, 12 trials), the same trials then run to the
         end (those the search stopped, as a grid of their values), and: the metric the
         search judged at a rung equals the full run's; every hopeless trial (a full run
         under half the best accuracy) but the first stopped early; the best trial is
         within 0.005 dev accuracy of the best full run; the rank-seconds of both are
         printed. --record writes the full runs' metrics, on which coordinator_test's
         AshaOnRecordedRuns checks the same claims in-process;
  draws  a random search draws what an independent SplitMix64 gives, for each kind of
         distribution; a grid search gives the product of its values, in order (the last
         parameter fastest); cancelling a search cancels its trials, and nothing is left
         running;
  bad    bad search files are refused by jobctl (exit 2, with file:line) and leave no
         job behind (ServerTest checks the coordinator's own refusal)."""
import csv
import math
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case  # noqa: E402
from harness.e2e import dev_subset, job_yaml, subset_tsv, wait_for, write  # noqa: E402
from harness.pool import POOL_FLAGS, Cluster, on_cluster  # noqa: E402

TRIALS, ETA, SEED = 9, 3, 11  # --trials
EXAMPLES, DEV_EXAMPLES, EPOCHS, RUNGS = 1000, 750, 5, [1, 3]  # --examples, --epochs
MAX_SEQ_LEN = 32  # --max-seq-len; scripts/bench/search.sh runs 1,500 examples of 64
MASK = (1 << 64) - 1
ARGS = None  # the command line, set by with_options()


def splitmix_units(seed):
    """Note [Trial draws]: SplitMix64's draws as numbers in [0, 1)."""
    state = seed
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        yield (z >> 11) * 2.0 ** -53


def expected_learning_rates(seed, count, low, high):
    units = splitmix_units(seed)
    return [math.exp(math.log(low) + next(units) * (math.log(high) - math.log(low))) for _ in range(count)]


def better(a, b):
    return not math.isnan(a) and (math.isnan(b) or a > b)


def asha_decisions(metrics_by_trial, rungs, eta):
    """Note [ASHA] over each trial's metric at each rung, trials arriving in order: the
    epoch each trial stops at (0: it runs to the end)."""
    recorded = {rung: [] for rung in rungs}
    stopped = {}
    for trial in sorted(metrics_by_trial):
        stopped[trial] = 0
        for rung in rungs:
            value = metrics_by_trial[trial][rung]
            keep = max(1, (len(recorded[rung]) + 1) // eta)
            above = sum(1 for earlier in recorded[rung] if not better(value, earlier))
            recorded[rung].append(value)
            if math.isnan(value) or above >= keep:
                stopped[trial] = rung
                break
    return stopped


def base_job(work, name="base"):
    train = os.path.join(work, f"train_{EXAMPLES}.tsv")
    if not os.path.exists(train):
        subset_tsv(work, EXAMPLES)
    dev = dev_subset(work, DEV_EXAMPLES)  # every language
    # A short warm-up: a rung inside the warm-up would judge trials before their
    # learning rates have acted.
    extra = f"""train:
  epochs: {EPOCHS}
  batch_size: 16
  warmup_ratio: 0.02
resources:
  ranks: 2
  max_restarts: 1
"""
    text = job_yaml(name, train, extra, dev=dev)
    # MAX_SEQ_LEN tokens a text (32 in the test): a language shows in its first words, and
    # the trials take the same steps as at 64 (the benchmark's), for about half the work.
    text = text.replace("max_seq_len: 64", f"max_seq_len: {MAX_SEQ_LEN}")
    return write(os.path.join(work, f"{name}.yaml"), text)


def search_file(work, name, method, params, extra=""):
    text = f"""name: {name}
kind: search
base: base.yaml
search:
  method: {method}
  metric: eval_acc
  max_concurrent: 1
  seed: {SEED}
  params:
{params}{extra}"""
    return write(os.path.join(work, f"{name}.yaml"), text)


def report(c, job):
    return c.jobctl("report", str(job))


def wait_search(c, job, timeout):
    c.wait_state(job, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout)
    return report(c, job)


KILLED_DURING_TRIAL = 3


def kill_coordinator_mid_search(c, search):
    """kill -9 while trial 3 runs, and a restart a few seconds later."""
    def third_trial_running():
        trials = report(c, search)["search"]["trials"]
        return trials[KILLED_DURING_TRIAL - 1]["state"] == "RUNNING"
    wait_for(third_trial_running, 300, f"trial {KILLED_DURING_TRIAL} to run")
    c.coordinator.send_signal(signal.SIGKILL)
    c.coordinator.wait()
    print(f"killed the coordinator (kill -9) while trial {KILLED_DURING_TRIAL} ran")
    time.sleep(4)
    c.start_coordinator()


def rank_seconds(rep):
    return sum(t["rank_seconds"] for t in rep["search"]["trials"])


def metric_at(c, job, epoch):
    with open(os.path.join(c.runs, str(job), "epochs.csv"), encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if int(row["epoch"]) == epoch:
                return float(row["eval_acc"])
    return float("nan")


def epochs_logged(c, job):
    path = os.path.join(c.runs, str(job), "epochs.csv")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


def check_trial_set(rep, rates):
    trials = rep["search"]["trials"]
    check(len(trials) == TRIALS, trials)
    for t, rate in zip(trials, rates):
        key, value = t["params"][0].split("=")
        check(key == "train.lr" and float(value) == rate, (t["params"], rate))


def case_asha(c, work):
    c.start(2)
    base_job(work)
    params = "    train.lr: {log_uniform: [1.0e-5, 1.0e-1]}\n"
    asha = search_file(work, "asha", "asha", params, f"  max_trials: {TRIALS}\n  asha: {{min_epochs: 1, "
                                                     f"reduction_factor: {ETA}, max_epochs: {EPOCHS}}}\n")
    started = time.time()
    search = c.submit(asha)
    kill_coordinator_mid_search(c, search)
    rep = wait_search(c, search, 900)
    asha_wall = time.time() - started
    check(rep["state"] == "SUCCEEDED", rep)
    trials = rep["search"]["trials"]
    rates = expected_learning_rates(SEED, TRIALS, 1e-5, 1e-1)
    check_trial_set(rep, rates)
    print(f"the search drew the {TRIALS} learning rates an independent SplitMix64 gives")

    jobs = [t["job"] for t in trials]
    check(len(set(jobs)) == TRIALS and 0 not in jobs, jobs)
    listed = [j for j in c.jobctl("list") if j.get("search") == search]
    check(len(listed) == TRIALS, listed)
    for t in trials:
        logged = epochs_logged(c, t["job"])
        last = t["stopped_at"] or EPOCHS
        check(logged == sorted(set(logged)), (t, logged))
        if t["trial"] == KILLED_DURING_TRIAL and t["stopped_at"]:
            # No trial waits for a decision: while the coordinator was down this one went on
            # past its rung, and the epochs it finished meanwhile stay logged.
            check(logged == list(range(1, max(last, len(logged)) + 1)), (t, logged))
        elif t["stopped_at"]:
            # No trial waits for a decision: one whose next epoch (a second here) ended
            # before the stop reached it has logged that epoch too, and no more.
            check(logged in (list(range(1, last + 1)), list(range(1, last + 2))), (t, logged))
        else:
            check(logged == list(range(1, last + 1)), (t, logged))
    print("each trial ran as one job; no epoch was logged twice; a stopped trial logged up to its rung, or one "
          f"epoch past it (trial {KILLED_DURING_TRIAL}, which ran while the coordinator was down, perhaps more)")

    # Every decision against the rule over the metrics the trials themselves logged. The
    # rule reads a trial's metric only at the rungs it reaches, and a stopped trial logged
    # every epoch up to the rung it stopped at, so these are all the rule needs: a trial
    # stopped too early has no metric (NaN) at the next rung and the rule stops it there
    # instead, and one kept too long meets the rule's stop at the rung it passed.
    metrics = {t["trial"]: {r: metric_at(c, t["job"], r) for r in RUNGS} for t in trials}
    expected = asha_decisions(metrics, RUNGS, ETA)
    got = {t["trial"]: t["stopped_at"] for t in trials}
    for t in trials:
        print(f"  trial {t['trial']:2d} lr {float(t['params'][0].split('=')[1]):.2e}: {t['state']:9s} "
              f"stopped at {t['stopped_at']} (expected {expected[t['trial']]}), "
              f"rung metrics {[metrics[t['trial']][r] for r in RUNGS]}")
    check(got == expected, (got, expected))
    check(all(t["state"] == "STOPPED" for t in trials if t["stopped_at"]), trials)
    check(all(t["state"] == "SUCCEEDED" for t in trials if not t["stopped_at"]), trials)
    print("every decision equals ASHA's rule over the trials' own metrics, in trial order")

    # The best trial: the best metric of the trials that ran to the end.
    best = trials[rep["search"]["best_trial"] - 1]
    check(best["best"] == max(t["best"] for t in trials if not t["stopped_at"]), (best, trials))
    check(os.path.exists(os.path.join(best["model_dir"], "model.safetensors")), best)
    trained = sum(len(epochs_logged(c, t["job"])) for t in trials)
    # The work ASHA saves, as epochs, which its decisions fix: the test shares the cores
    # with others, so its rank-seconds (scripts/bench/search.sh's figure) are not asserted.
    check(trained <= 0.5 * TRIALS * EPOCHS, (trained, TRIALS * EPOCHS))
    with open(os.path.join(c.runs, str(search), "search.csv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    check([int(r["trial"]) for r in rows] == list(range(1, TRIALS + 1)), rows)
    check([int(r["stopped_at"]) for r in rows] == [expected[i] for i in range(1, TRIALS + 1)], rows)
    print(f"figures: best trial {best['trial']} eval_acc {best['best']:.4f}; the search's wall time "
          f"{asha_wall:.0f} s; it trained {trained} of the full runs' {TRIALS * EPOCHS} epochs; "
          f"{sum(1 for t in trials if t['stopped_at'] == 0)} trials ran to the end")
    if ARGS.reference:
        against_full_runs(c, work, trials, rep)


def against_full_runs(c, work, trials, rep):
    """--reference (scripts/bench/search.sh): the same trials run to the end. A trial
    the search ran to the end is one already (the trials are deterministic); the others run
    to the end now, as a grid of their exact values. What ASHA's decisions are worth on
    these runs is asserted here and, on the runs --record wrote, by coordinator_test's
    AshaOnRecordedRuns."""
    stopped = [t for t in trials if t["stopped_at"]]
    values = ", ".join(t["params"][0].split("=")[1] for t in stopped)
    grid = wait_search(c, c.submit(search_file(work, "full", "grid", f"    train.lr: {{choice: [{values}]}}\n")),
                       1200)
    check(grid["state"] == "SUCCEEDED", grid)
    full_of = {t["trial"]: t for t in trials if not t["stopped_at"]}
    for t, ran in zip(stopped, grid["search"]["trials"]):
        check(ran["params"] == t["params"] and ran["state"] == "SUCCEEDED", (t, ran))
        full_of[t["trial"]] = ran
    for t in full_of.values():
        check(epochs_logged(c, t["job"]) == list(range(1, EPOCHS + 1)), t)
    # The metric the search judged at each rung equals the full run's there.
    for t in stopped:
        for rung in RUNGS:
            if rung <= t["stopped_at"]:
                check(metric_at(c, t["job"], rung) == metric_at(c, full_of[t["trial"]]["job"], rung), (t, rung))
    final = {n: t["best"] for n, t in full_of.items()}  # the best of each full run's epochs
    best_full = max(final.values())
    # Hopeless: a full run that never reaches half the best accuracy. The first trial at a
    # rung always goes on (Note [ASHA]); every later hopeless trial stops early.
    hopeless = [t for t in trials if final[t["trial"]] < 0.5 * best_full]
    check(hopeless, final)
    for t in hopeless:
        check(t["trial"] == 1 or t["stopped_at"] > 0, (t, final))
    best = trials[rep["search"]["best_trial"] - 1]
    check(best["best"] >= best_full - 0.005, (best, best_full))
    ours = rank_seconds(rep)
    theirs = sum(t["rank_seconds"] for t in full_of.values())
    print(f"figures: best trial {best['trial']} eval_acc {best['best']:.4f} against the full runs' best "
          f"{best_full:.4f}; rank-seconds {ours:.0f} against {theirs:.0f} ({ours / theirs:.2f}x); "
          f"{len(hopeless)} hopeless trials, "
          f"{sum(1 for t in hopeless if t['stopped_at'] == RUNGS[0])} of them stopped at the first rung")
    if ARGS.record:
        record_full_runs(c, trials, full_of, ARGS.record)


def record_full_runs(c, trials, full_of, path):
    """Every full run's eval_acc at every epoch, for coordinator_test's AshaOnRecordedRuns."""
    rows = [f"# {TRIALS} langid trials (tests/coordinator/search_test.py asha --reference, "
            f"{EXAMPLES} examples, max_seq_len {MAX_SEQ_LEN}), each run to the end: "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} cores, {cpu_name()}\n",
            "trial,lr,epoch,eval_acc\n"]
    for t in trials:
        with open(os.path.join(c.runs, str(full_of[t["trial"]]["job"]), "epochs.csv"), encoding="utf-8") as f:
            for row in csv.DictReader(f):
                rows.append(f"{t['trial']},{t['params'][0].split('=')[1]},{row['epoch']},{row['eval_acc']}\n")
    write(path, "".join(rows))
    print(f"recorded the full runs' metrics in {path}")


def cpu_name():
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "an unnamed CPU"


def case_draws(c, work):
    c.start(2)
    base_job(work)
    params = ("    train.lr: {log_uniform: [1.0e-5, 1.0e-1]}\n    seed: {int_uniform: [1, 9]}\n"
              "    train.batch_size: {choice: [8, 16, 32]}\n    train.warmup_ratio: {uniform: [0.0, 0.2]}\n")
    random_search = c.submit(search_file(work, "draws", "random", params, "  max_trials: 5\n"))
    drawn = report(c, random_search)["search"]["trials"]
    c.jobctl("cancel", str(random_search))
    units = splitmix_units(SEED)
    for t in drawn:
        u = [next(units) for _ in range(4)]
        want = [math.exp(math.log(1e-5) + u[0] * math.log(1e4)), 1 + math.floor(u[1] * 9),
                ["8", "16", "32"][math.floor(u[2] * 3)], u[3] * 0.2]
        got = [value.split("=")[1] for value in t["params"]]
        check(float(got[0]) == want[0] and int(got[1]) == want[1] and got[2] == want[2] and
              float(got[3]) == want[3], (got, want))
    print("the random search drew the 5 trials an independent SplitMix64 gives")
    params = "    train.lr: {choice: [1.0e-3, 3.0e-3]}\n    seed: {int_uniform: [1, 3]}\n"
    grid = c.submit(search_file(work, "grid", "grid", params))
    c.wait_state(grid, {"RUNNING"}, 30)
    rep = report(c, grid)
    got = [t["params"] for t in rep["search"]["trials"]]
    want = [[f"train.lr={lr}", f"seed={seed}"] for lr in ("1.0e-3", "3.0e-3") for seed in (1, 2, 3)]
    check(got == want, got)
    print("the grid is the product of its values, the last parameter fastest")
    first = wait_for(lambda: report(c, grid)["search"]["trials"][0]["state"] == "RUNNING", 60, "trial 1 to run")
    check(first, "trial 1 of the grid runs")
    cancelled = c.jobctl("cancel", str(grid))
    check(cancelled["state"] == "CANCELLED", cancelled)
    rep = report(c, grid)
    states = [t["state"] for t in rep["search"]["trials"]]
    check(states[0] == "CANCELLED" and all(s == "PENDING" for s in states[1:]), states)
    time.sleep(3)  # nothing more is submitted
    check(len([j for j in c.jobctl("list") if j.get("search") == grid]) == 1, c.jobctl("list"))
    wait_for(lambda: all(w["job_id"] == 0 for w in c.workers()), 60, "the pool to be idle")
    print("cancelling the search cancelled its running trial and submitted no other")


BAD = [
    ("method: asha\n  max_trials: 3\n  params:\n    train.lr: {log_uniform: [0, 1.0e-1]}\n",
     "search.params.train.lr.log_uniform[0]: expected a number above 0"),
    ("method: random\n  max_trials: 3\n  params:\n    train.lrr: {uniform: [0.1, 0.2]}\n",
     "search.params.train.lrr: trial 1 (train.lrr="),
    ("method: random\n  max_trials: 3\n  params:\n    train.lr: {uniform: [0.5, 0.2]}\n",
     "search.params.train.lr.uniform: expected low < high"),
    ("method: grid\n  params:\n    train.lr: {uniform: [0.1, 0.2]}\n",
     "search.params.train.lr: method: grid takes choice or int_uniform values only"),
    ("method: random\n  max_trials: 3\n  params:\n    train.epochs: {int_uniform: [0, 2]}\n",
     "search.params.train.epochs: trial"),
    ("method: asha\n  max_trials: 3\n  metric: accuracy\n  params:\n    train.lr: {choice: [1.0e-3]}\n",
     "search.metric: expected one of"),
    ("method: random\n  max_trials: 100000\n  params:\n    train.lr: {choice: [1.0e-3]}\n",
     "search.max_trials: expected an integer in [1, 1000]"),
]


def case_bad(c, work):
    c.start_coordinator()
    base_job(work)
    wait_for(lambda: c.jobctl("list") == [], 30, "the coordinator")
    for i, (section, message) in enumerate(BAD):
        path = write(os.path.join(work, f"bad{i}.yaml"),
                     f"name: bad{i}\nkind: search\nbase: base.yaml\nsearch:\n  {section}")
        r = c.run_jobctl_raw("submit", path)
        check(r.returncode == 2 and path + ":" in r.stderr and message in r.stderr, (section, r.stderr))
        print(f"jobctl refused bad{i}: {r.stderr.strip().splitlines()[-1]}")
    check(c.jobctl("list") == [], "a refused search left a job behind")


class SearchCluster(Cluster):
    def run_jobctl_raw(self, *args):
        return subprocess.run([self.args.jobctl, "--coordinator", self.endpoint, "--keys", self.keys, "--timeout",
                               "3", *args], capture_output=True, text=True, timeout=60)


def options(p):
    """The asha case's own options (scripts/bench/search.sh sets them)."""
    p.add_argument("--trials", type=int, default=TRIALS, choices=range(KILLED_DURING_TRIAL, 101), metavar="3..100",
                   help="asha's max_trials")
    p.add_argument("--examples", type=int, default=EXAMPLES, help="the trials' training examples")
    p.add_argument("--max-seq-len", type=int, default=MAX_SEQ_LEN, help="the trials' data.max_seq_len")
    p.add_argument("--epochs", type=int, default=EPOCHS, choices=range(4, 10), metavar="4..9",
                   help="asha's max_epochs, every trial's train.epochs (the rungs stay at epochs 1 and 3)")
    p.add_argument("--reference", action="store_true",
                   help="asha: then run every trial to the end and check the decisions against those runs")
    p.add_argument("--record", metavar="CSV", help="asha --reference: write the full runs' metrics there")


def with_options(case):
    """`case`, run on a SearchCluster with the settings of the command line's options."""
    def run(args, work):
        check(args.reference or not args.record, "--record needs --reference")
        globals()["MAX_SEQ_LEN"] = args.max_seq_len
        globals()["EXAMPLES"] = args.examples
        globals()["EPOCHS"] = args.epochs
        globals()["TRIALS"] = args.trials
        globals()["ARGS"] = args
        on_cluster(case, SearchCluster)(args, work)
    return run


CASES = {"asha": with_options(case_asha), "draws": with_options(case_draws), "bad": with_options(case_bad)}


if __name__ == "__main__":
    run_case(CASES, POOL_FLAGS, __doc__, options)
