"""Drives two servers of the same weights with MLPerf LoadGen through tritonclient (gRPC):
the worker's `kind: serve` and the reference (MLServer with adaptive batching,
serve_reference.py). For each: the Offline scenario's throughput, and the Server
scenario's highest QPS whose p99 latency stays under --bound-ms (a bisection over LoadGen
runs, each VALID or not by LoadGen's own rule). Also the padding share of our batches with
length-aware batching on and off. Run by scripts/bench/serve_load.sh."""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import mlperf_loadgen as lg
import numpy as np
import tritonclient.grpc as tgrpc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPICS = os.path.join(ROOT, "data", "prepared", "topics")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unescape(field):
    return field.replace("\\\\", "\0").replace("\\n", "\n").replace("\\t", "\t").replace("\0", "\\")


def topics_texts(count):
    with open(os.path.join(TOPICS, "dev.tsv"), encoding="utf-8", newline="\n") as f:
        rows = [line.rstrip("\n").split("\t", 1)[1] for line in list(f)[1:]]
    return [unescape(r) for r in rows[:count]]


def make_model(folder, layers, hidden):
    """A BERT classifier (random weights; speed does not depend on them) on topics' vocab."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    labels = [l.strip() for l in open(os.path.join(TOPICS, "labels.txt"), encoding="utf-8") if l.strip()]
    vocab = sum(1 for _ in open(os.path.join(TOPICS, "vocab.txt"), encoding="utf-8"))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                        max_position_embeddings=128, id2label=dict(enumerate(labels)),
                        label2id={l: i for i, l in enumerate(labels)})
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    shutil.copy(os.path.join(TOPICS, "vocab.txt"), folder)


def wait_ready(url, process, what, limit=180):
    client = tgrpc.InferenceServerClient(url)
    deadline = time.time() + limit
    while True:
        try:
            if client.is_server_ready():
                return
        except Exception:
            pass
        if process.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{what} did not become ready")
        time.sleep(0.2)


def start_ours(args, work, repo, length_aware):
    runs = os.path.join(work, "runs")
    job = os.path.join(work, f"serve_{length_aware}.yaml")
    with open(job, "w") as f:
        f.write(f"""name: serve_bench
kind: serve
runtime: {{device: cpu, threads: {args.threads}}}
serve:
  repository: {repo}
  http_port: 0
  grpc_port: 0
  metrics_port: 0
  max_batch_size: {args.max_batch}
  max_batch_tokens: {args.max_batch * 128}
  max_queue_delay_ms: {args.delay_ms}
  max_queue: 100000
  default_timeout_ms: 600000
  poll_s: 0
  length_aware: {str(length_aware).lower()}
""")
    endpoints = os.path.join(runs, "serve_bench", "endpoints.json")
    if os.path.exists(endpoints):
        os.remove(endpoints)
    log = open(os.path.join(work, "ours.log"), "a")
    process = subprocess.Popen([args.worker, job, "--runs-dir", runs], stdout=log, stderr=subprocess.STDOUT)
    while not os.path.exists(endpoints):
        if process.poll() is not None:
            raise RuntimeError("our server did not start: see " + log.name)
        time.sleep(0.1)
    ep = json.load(open(endpoints))
    url = f"127.0.0.1:{ep['grpc_port']}"
    wait_ready(url, process, "our server")
    return process, url, ep["metrics_port"]


def start_reference(args, work, model_dir):
    folder = os.path.join(work, "mlserver")
    os.makedirs(os.path.join(folder, "topics"), exist_ok=True)
    shutil.copy(os.path.join(ROOT, "scripts", "bench", "serve_reference.py"), folder)
    grpc_port, http_port = free_port(), free_port()
    json.dump({"http_port": http_port, "grpc_port": grpc_port, "host": "127.0.0.1", "metrics_port": free_port(),
               "parallel_workers": 0, "debug": False},
              open(os.path.join(folder, "settings.json"), "w"))
    json.dump({"name": "topics", "implementation": "serve_reference.HfClassifier",
               "max_batch_size": args.max_batch, "max_batch_time": args.delay_ms / 1000.0,
               "parameters": {"uri": model_dir}},
              open(os.path.join(folder, "topics", "model-settings.json"), "w"))
    env = dict(os.environ, SERVE_REFERENCE_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads),
               PYTHONPATH=folder)
    log = open(os.path.join(work, "reference.log"), "a")
    mlserver = os.path.join(os.path.dirname(sys.executable), "mlserver")
    process = subprocess.Popen([mlserver, "start", folder], stdout=log, stderr=subprocess.STDOUT, env=env,
                               cwd=folder)
    url = f"127.0.0.1:{grpc_port}"
    wait_ready(url, process, "the reference (MLServer)")
    return process, url


def stop(process):
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class LoadGenRun:
    """One LoadGen test against a server: each query is one text in one ModelInfer call."""

    def __init__(self, url, texts, outdir):
        self.client = tgrpc.InferenceServerClient(url)
        self.texts = texts
        self.outdir = outdir
        self.errors = 0
        self.lock = threading.Lock()

    def issue(self, samples):
        for s in samples:
            text = tgrpc.InferInput("TEXT", [1], "BYTES")
            text.set_data_from_numpy(np.array([self.texts[s.index].encode()], dtype=object))

            def done(result, error, sample_id=s.id):
                if error is not None:
                    with self.lock:
                        self.errors += 1
                lg.QuerySamplesComplete([lg.QuerySampleResponse(sample_id, 0, 0)])
            self.client.async_infer("topics", [text], done, outputs=[tgrpc.InferRequestedOutput("logits")])

    def run(self, settings):
        os.makedirs(self.outdir, exist_ok=True)
        sut = lg.ConstructSUT(self.issue, lambda: None)
        qsl = lg.ConstructQSL(len(self.texts), len(self.texts), lambda s: None, lambda s: None)
        log_settings = lg.LogSettings()
        log_settings.log_output.outdir = self.outdir
        log_settings.log_output.copy_summary_to_stdout = False
        lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
        summary = open(os.path.join(self.outdir, "mlperf_log_summary.txt")).read()
        return summary


def number(summary, label):
    m = re.search(re.escape(label) + r"\s*:\s*([0-9.e+]+)", summary)
    return float(m.group(1)) if m else float("nan")


def offline(url, texts, args, outdir):
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Offline
    settings.mode = lg.TestMode.PerformanceOnly
    settings.offline_expected_qps = 200
    settings.min_duration_ms = int(args.duration_s * 1000)
    settings.min_query_count = 1
    run = LoadGenRun(url, texts, outdir)
    summary = run.run(settings)
    return number(summary, "Samples per second"), run.errors


def server_run(url, texts, args, qps, outdir):
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Server
    settings.mode = lg.TestMode.PerformanceOnly
    settings.server_target_qps = qps
    settings.server_target_latency_ns = int(args.bound_ms * 1e6)
    settings.server_target_latency_percentile = 0.99
    settings.min_duration_ms = int(args.duration_s * 1000)
    settings.min_query_count = 500  # enough queries for a p99 to mean something
    run = LoadGenRun(url, texts, outdir)
    summary = run.run(settings)
    # LoadGen's own check of the p99 against the bound (its early-stopping estimate is
    # not required: it asks for more queries than a short run makes at low QPS).
    valid = "Performance constraints satisfied : Yes" in summary and run.errors == 0
    return valid, number(summary, "99.00 percentile latency (ns)") / 1e6


def best_server_qps(url, texts, args, start_qps, outdir):
    """Bisection for the highest QPS LoadGen calls VALID (p99 <= bound)."""
    low, high = 0.0, start_qps * 1.2
    best = (0.0, float("nan"))
    for step in range(args.steps):
        qps = (low + high) / 2 if step else high
        valid, p99 = server_run(url, texts, args, qps, os.path.join(outdir, f"server_{step}"))
        print(f"    server scenario at {qps:7.1f} QPS: p99 {p99:7.1f} ms -> {'VALID' if valid else 'INVALID'}", flush=True)
        if valid:
            low, best = qps, (qps, p99)
            if step == 0:
                break
        else:
            high = qps
    return best


def padding_share(metrics_port):
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[s.name] = values.get(s.name, 0) + s.value
    padded = values.get("trainyard_serve_padded_tokens_total", 0)
    real = values.get("trainyard_serve_real_tokens_total", 0)
    return 1 - real / padded if padded else float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bound-ms", type=float, default=200)
    parser.add_argument("--duration-s", type=float, default=10)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--delay-ms", type=float, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--texts", type=int, default=1000)
    args = parser.parse_args()
    repo = os.path.join(args.work, "repo")
    model_dir = os.path.join(repo, "topics", "1")
    make_model(model_dir, args.layers, args.hidden)
    texts = topics_texts(args.texts)
    print(f"model: BERT {args.layers} x {args.hidden}, 128 positions; {len(texts)} topics dev texts; "
          f"{args.threads} thread(s) each; max batch {args.max_batch}, queue delay {args.delay_ms} ms; "
          f"p99 bound {args.bound_ms} ms", flush=True)
    results = {}
    for name in ("ours", "reference"):
        if name == "ours":
            process, url, metrics_port = start_ours(args, args.work, repo, length_aware=True)
        else:
            process, url = start_reference(args, args.work, model_dir)
        try:
            print(f"{name}:", flush=True)
            throughput, errors = offline(url, texts, args, os.path.join(args.work, name, "offline"))
            print(f"    offline: {throughput:.1f} samples/s ({errors} errors)", flush=True)
            qps, p99 = best_server_qps(url, texts, args, throughput, os.path.join(args.work, name))
            results[name] = {"offline": throughput, "server_qps": qps, "server_p99": p99}
            if name == "ours":
                results[name]["padding_on"] = padding_share(metrics_port)
        finally:
            stop(process)
    process, url, metrics_port = start_ours(args, args.work, repo, length_aware=False)
    try:
        throughput, _ = offline(url, texts, args, os.path.join(args.work, "ours_fifo", "offline"))
        results["ours"]["offline_fifo"] = throughput
        results["ours"]["padding_off"] = padding_share(metrics_port)
    finally:
        stop(process)
    ours, ref = results["ours"], results["reference"]
    print()
    print(f"| | ours | reference (MLServer) | ratio |")
    print(f"|---|---|---|---|")
    print(f"| Server: highest QPS with p99 <= {args.bound_ms:.0f} ms | {ours['server_qps']:.1f} "
          f"(p99 {ours['server_p99']:.0f} ms) | {ref['server_qps']:.1f} (p99 {ref['server_p99']:.0f} ms) | "
          f"{ours['server_qps'] / ref['server_qps'] if ref['server_qps'] else float('inf'):.2f} |")
    print(f"| Offline: samples/s | {ours['offline']:.1f} | {ref['offline']:.1f} | {ours['offline'] / ref['offline']:.2f} |")
    print(f"| padding share, length-aware on / off | {ours['padding_on']:.1%} / {ours['padding_off']:.1%} "
          f"(offline {ours['offline']:.1f} / {ours['offline_fifo']:.1f} samples/s) | | |")
    json.dump(results, open(os.path.join(args.work, "serve_load.json"), "w"), indent=2)


if __name__ == "__main__":
    main()
