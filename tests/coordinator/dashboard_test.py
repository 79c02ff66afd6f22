#!/usr/bin/env python3
"""The coordinator's dashboard and /metrics, end to end: a real coordinator started with
--http, a real 2-rank mpirun pool running real jobs, Debian's chromium driven by
selenium, and prometheus_client's parser.

  - the API: unknown jobs and paths get 404 with a JSON error, writes get 405;
  - 1,500 idle connections (more than the dashboard's 1,024) leave it answering, each
    newcomer taking the place of the longest idle;
  - a running 2-rank finetune job's page: its loss curve gains points as epochs arrive,
    and ends with exactly the epochs.csv rows the coordinator wrote; the per-rank step
    breakdown has one stacked bar per rank, with the slowest rank marked as the API says;
    the page shows the end of its output.log, rank-prefixed;
  - a benchmark job's page shows its latency heatmap (the image loads);
  - the overview lists the jobs with their states and both ranks as alive;
  - /metrics parses, and says 2 succeeded jobs, an empty queue, 2 submit-to-running
    observations, 2 succeeded attempts, 2 live ranks, and while the finetune job ran, its
    ms/step;
  - an ASHA search of 3 identical trials: the first runs to the end and the others are
    stopped at the first rung (an earlier equal result ranks first); its page draws the
    3 curves on one chart, the 2 stopped ones grey, and lists them in its table.
Screenshots of both pages are kept in --artifacts."""
import csv
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.e2e import LANGID, free_port, wait_for, write  # noqa: E402
from harness.pool import POOL_FLAGS, Cluster, on_cluster, write_job  # noqa: E402

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402


class DashboardCluster(Cluster):
    def __init__(self, args, work):
        super().__init__(args, work)
        self.http_port = free_port()
        self.base = f"http://127.0.0.1:{self.http_port}"

    def start_coordinator(self):
        log = open(os.path.join(self.work, f"coordinator-{len(self.logs)}.log"), "w")
        self.logs.append(log.name)
        self.coordinator = subprocess.Popen(
            [self.args.coordinator, "--listen", self.endpoint, "--state", self.state, "--runs", self.runs,
             "--keys", self.keys, "--heartbeat", "0.5", "--liveness", "10", "--grace", "20",
             "--http", f"127.0.0.1:{self.http_port}"],
            stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: self.get("/api")[0] == 200, 30, "the dashboard to answer")

    def get(self, path, method="GET"):
        """(status, parsed JSON or text) of one request."""
        request = urllib.request.Request(self.base + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=15) as r:
                status, body, kind = r.status, r.read().decode(), r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            status, body, kind = e.code, e.read().decode(), e.headers.get("Content-Type", "")
        except OSError:
            return 0, None
        return status, json.loads(body) if kind.startswith("application/json") else body

    def metrics(self):
        status, text = self.get("/metrics")
        check(status == 200, (status, text))
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return samples


def value(samples, metric, **labels):
    return samples.get((metric, tuple(sorted(labels.items()))))


def check_api_errors(c):
    status, body = c.get("/api/jobs/424242")
    check(status == 404 and body == {"error": "no job 424242"}, (status, body))
    status, body = c.get("/api/jobs/x1")
    check(status == 404 and "no job x1" in body["error"], (status, body))
    status, body = c.get("/api/nothing")
    check(status == 404 and "error" in body, (status, body))
    status, body = c.get("/no/such/page")
    check(status == 404, status)
    status, body = c.get("/api/jobs", method="POST")
    check(status == 405 and "read-only" in body["error"], (status, body))
    status, index = c.get("/api")
    check(status == 200 and "GET /api/jobs/<id>" in index, index)
    status, script = c.get("/static/chart.js")
    check(status == 200 and "Chart.js v3" in script[:200], "Chart.js is served from the daemon")


def check_crowd(c):
    import resource
    import socket
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    idle = [socket.create_connection(("127.0.0.1", c.http_port), timeout=10) for _ in range(1500)]
    try:
        answers = [c.get("/api/jobs")[0] for _ in range(20)]
        check(answers == [200] * 20, answers)
    finally:
        for s in idle:
            s.close()
    print("1,500 idle connections: the dashboard answered 20 of 20 requests meanwhile")


def browser(artifacts):
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1800",
                 "--disable-gpu", "--no-first-run"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver", log_output=os.path.join(artifacts,
                                                                                            "chromedriver.log")),
                            options=options)


def chart_points(driver, canvas):
    return driver.execute_script(
        "const c = window.Chart && Chart.getChart(arguments[0]); return c ? c.data.labels.length : -1;", canvas)


def write_benchmark(work):
    return write(os.path.join(work, "dash_bench.yaml"), f"""name: dash_bench
kind: benchmark
data:
  train: {LANGID}/train.tsv
  labels: {LANGID}/labels.txt
  tokenizer: {{vocab: {LANGID}/vocab.txt}}
model: {{preset: tiny}}
runtime: {{device: cpu, threads: 1}}
benchmark:
  batch_sizes: [1, 4]
  seq_lens: [16, 64]
  warmup: 1
  iters: 2
""")


def case_dashboard(c, work):
    artifacts = c.args.artifacts
    os.makedirs(artifacts, exist_ok=True)
    c.start(2)
    check_api_errors(c)
    check_crowd(c)
    # The browser starts before the job, whose steps pause: the curve must be seen growing
    # while the job runs, however slow chromium's start or fast the CPU.
    driver = browser(artifacts)
    job_file = write_job(work, "dash_train", epochs=8, examples=600, pause_ms=30)
    try:
        job = c.submit(job_file)
        driver.get(f"{c.base}/jobs/{job}?refresh=300")
        # The curve grows while the job runs: a first point, then more, before the job ends.
        first = wait_for(lambda: chart_points(driver, "chart-loss") >= 1 and chart_points(driver, "chart-loss"), 180,
                         "the first epoch on the job's loss chart")
        running = c.job(job)["state"] == "RUNNING"
        ms_metric = value(c.metrics(), "trainyard_job_ms_per_step", job=str(job), name="dash_train",
                          user=c.job(job)["user"])
        check(running, f"job {job} ended before the test saw its curve grow; make it longer")
        check(ms_metric and ms_metric > 0, f"a running job's ms/step in /metrics: {ms_metric}")
        wait_for(lambda: chart_points(driver, "chart-loss") > first, 180, "the loss chart to gain a point")
        c.wait_state(job, ("SUCCEEDED",), 300)
        with open(os.path.join(c.runs, str(job), "epochs.csv"), encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        check(len(rows) == 8, rows)
        wait_for(lambda: chart_points(driver, "chart-loss") == len(rows), 30, "every epoch on the chart")
        drawn = driver.execute_script("return Chart.getChart('chart-loss').data.datasets[0].data;")
        check([round(v, 5) for v in drawn] == [round(float(r["train_loss"]), 5) for r in rows], (drawn, rows))
        # One stacked bar per rank, six parts each, the straggler named as the API names it.
        api = c.get(f"/api/jobs/{job}")[1]
        latest = api["breakdown"][-1]
        check(len(latest["ranks"]) == 2 and all(len(r) == 6 for r in latest["ranks"]), latest)
        labels = driver.execute_script("return Chart.getChart('chart-breakdown').data.labels;")
        parts = driver.execute_script(
            "return Chart.getChart('chart-breakdown').data.datasets.map(d => [d.label, d.data]);")
        slowest = latest["slowest_rank"]
        check(labels[slowest] == f"rank {slowest} (slowest)" and len(labels) == 2, labels)
        check([p[0] for p in parts] == ["wait", "h2d", "forward", "backward", "comm", "optimizer"], parts)
        for i, (_, data) in enumerate(parts):
            check([round(v, 6) for v in data] == [round(r[i], 6) for r in latest["ranks"]], (parts, latest))
        straggler = driver.execute_script("return document.getElementById('straggler').dataset.rank;")
        check(straggler == str(slowest), straggler)
        wait_for(lambda: driver.execute_script("return document.getElementById('job-state').textContent;") ==
                 "SUCCEEDED", 30, "the page to say SUCCEEDED")
        # The output's tail: the lines of output.log, its last one ending it.
        with open(os.path.join(c.runs, str(job), "attempt-1", "output.log"), encoding="utf-8") as f:
            output = f.read()
        shown = wait_for(lambda: driver.execute_script("return document.getElementById('output-tail').textContent;"),
                         30, "the output's tail on the page")
        check("[rank 0] " in shown and output.endswith(shown) and "done: " in shown.splitlines()[-1],
              (shown[-300:], output[-300:]))
        driver.save_screenshot(os.path.join(artifacts, "job.png"))

        bench = c.submit(write_benchmark(work))
        c.wait_state(bench, ("SUCCEEDED",), 300)
        driver.get(f"{c.base}/jobs/{bench}?refresh=300")
        width = wait_for(lambda: driver.execute_script(
            "const i = document.getElementById('heatmap'); return i.complete && i.naturalWidth;"), 30,
            "the benchmark's heatmap to load")
        check(width > 100, width)
        driver.save_screenshot(os.path.join(artifacts, "benchmark.png"))

        driver.get(f"{c.base}/?refresh=300")
        wait_for(lambda: driver.execute_script("return document.querySelectorAll('#workers-table tbody tr').length;") == 2, 30,
                 "both ranks in the workers table")
        # Read in one script: the page redraws its tables on every poll, so element
        # handles from an earlier moment go stale.
        states = driver.execute_script(
            "return Object.fromEntries([...document.querySelectorAll('#jobs-table tbody tr')]"
            ".map(r => [r.dataset.job, r.querySelector('.state').textContent]));")
        check(states == {str(job): "SUCCEEDED", str(bench): "SUCCEEDED"}, states)
        owners = driver.execute_script(
            "return [...document.querySelectorAll('#jobs-table tbody tr')].map(r => r.cells[2].textContent);")
        check(owners == [c.job(job)["user"] or "-"] * 2, owners)
        alive = driver.execute_script(
            "return [...document.querySelectorAll('#workers-table tbody tr')].map(r => r.cells[8].textContent);")
        check(alive == ["yes", "yes"], alive)
        driver.save_screenshot(os.path.join(artifacts, "overview.png"))
        # One job a page (Note [Paged job listing]): the newest, then the older one by the link.
        driver.get(f"{c.base}/?limit=1&refresh=300")
        shown = lambda: driver.execute_script(
            "return [[...document.querySelectorAll('#jobs-table tbody tr')].map(r => r.dataset.job),"
            " document.getElementById('job-count').textContent, document.getElementById('older-jobs').hidden];")
        first = wait_for(lambda: shown() if shown()[0] else None, 30, "the first page of jobs")
        check(first == [[str(bench)], "(1 of 2 shown)", False], first)
        driver.find_element("id", "older-jobs").click()
        second = wait_for(lambda: shown() if shown()[0] == [str(job)] else None, 30, "the older page of jobs")
        check(second == [[str(job)], "(1 of 2 shown)", True] and "before=" in driver.current_url,
              (second, driver.current_url))
        driver.get(f"{c.base}/jobs/424242?refresh=300")
        wait_for(lambda: "no job 424242" in driver.execute_script("return document.getElementById('error').textContent;"),
                 30, "the unknown job's error")
    finally:
        driver.quit()

    m = c.metrics()
    check(value(m, "trainyard_jobs", state="SUCCEEDED") == 2, m)
    check(value(m, "trainyard_jobs", state="QUEUED") == 0 and value(m, "trainyard_queue_depth") == 0, m)
    check(value(m, "trainyard_submit_to_running_seconds_count") == 2, m)
    check(value(m, "trainyard_submit_to_running_seconds_bucket", le="+Inf") == 2, m)
    check(value(m, "trainyard_attempts_total", outcome="succeeded") == 2, m)
    check(value(m, "trainyard_running_attempts") == 0, m)
    up = [v for (name, _), v in m.items() if name == "trainyard_worker_up"]
    check(up == [1.0, 1.0], up)
    check(value(m, "trainyard_job_ms_per_step", job=str(job), name="dash_train") is None,
          "only running jobs have a ms/step gauge")
    check_search_page(c, work, artifacts)
    print(f"screenshots in {artifacts}")


def check_search_page(c, work, artifacts):
    write_job(work, "search_base", epochs=3, examples=600)
    search = c.submit(write(os.path.join(work, "search.yaml"), """name: dash_search
kind: search
base: search_base.yaml
search:
  method: asha
  max_trials: 3
  params:
    seed: {choice: [7]}
  asha: {min_epochs: 1, reduction_factor: 3}
"""))
    c.wait_state(search, ("SUCCEEDED", "FAILED"), 300)
    api = c.get(f"/api/jobs/{search}")[1]["search"]
    check([t["state"] for t in api["trials"]] == ["SUCCEEDED", "STOPPED", "STOPPED"], api)
    check([len(t["curve"]) for t in api["trials"]] == [3, 1, 1] and api["best_trial"] == 1, api)
    stopped = value(c.metrics(), "trainyard_jobs", state="STOPPED")
    check(stopped == 2, f"trainyard_jobs{{state=STOPPED}} in /metrics: {stopped}")
    driver = browser(artifacts)
    try:
        driver.get(f"{c.base}/jobs/{search}?refresh=300")
        wait_for(lambda: driver.execute_script("return document.querySelectorAll('#trials-table tbody tr').length;")
                 == 3, 30, "the search's 3 trials in its table")
        lines = driver.execute_script(
            "return Chart.getChart('chart-search').data.datasets.map(d => [d.label, d.borderColor, d.data.length]);")
        grey = driver.execute_script("return STOPPED_GREY;")
        check([line[0] for line in lines] == ["trial 1", "trial 2", "trial 3"], lines)
        check(lines[0][1] != grey and lines[1][1] == grey and lines[2][1] == grey, lines)
        check([line[2] for line in lines] == [3, 1, 1], lines)
        stopped_rows = driver.execute_script("return document.querySelectorAll('#trials-table tr.stopped').length;")
        check(stopped_rows == 2 and driver.execute_script(
            "return document.getElementById('curves').hidden;"), stopped_rows)
        driver.save_screenshot(os.path.join(artifacts, "search.png"))
    finally:
        driver.quit()


if __name__ == "__main__":
    run_test(on_cluster(case_dashboard, DashboardCluster), POOL_FLAGS + ("--artifacts",), __doc__)
