#!/usr/bin/env bash
# Installs everything Trainyard needs on a Debian 12 machine. Idempotent: a second
# run only checks and returns in seconds.
#   - Debian packages: compilers, Open MPI, ZeroMQ, protobuf, spdlog, GoogleTest,
#     yaml-cpp, SQLite, nlohmann-json, SentencePiece, CLI11, ICU, RE2, gRPC and Boost
#     (Beast: serving's HTTP), clang-format and
#     clang-tidy, clang with its libFuzzer runtime (scripts/fuzz/run.sh), rsvg-convert
#     (tests render the SVG plots), libcurl (MLflow tracking), chromium with its
#     driver and Chart.js (the dashboard and its browser test), Slurm's daemons, client
#     and munge (the Slurm tests run their own Slurm on the cluster rig, with their own
#     configuration and munge keys; Debian's Slurm services do not start without
#     /etc/slurm/slurm.conf), and the fortunes data.
#   - A Python virtual environment with the torch wheel (its libtorch is what the C++
#     build links), Hugging Face transformers and peft (the independent references in tests),
#     the serving tests' independent clients (tritonclient, prometheus_client), pyzmq (the
#     chaos soak's squatter),
#     TensorBoard's reader and selenium; and a second venv with an MLflow tracking server.
# The venv lives outside the checkout (TRAINYARD_VENV, default ~/.cache/trainyard/venv)
# so fresh clones reuse the several-GB torch install.
set -euo pipefail

TORCH_VERSION="${TRAINYARD_TORCH_VERSION:-2.11.0}"
TRANSFORMERS_VERSION="4.57.6"
PEFT_VERSION="0.21.2"  # the LoRA reference in tests; pulls in accelerate
TRITONCLIENT_VERSION="2.73.0"  # serving tests: an independent KServe V2 client (HTTP and gRPC)
PROMETHEUS_CLIENT_VERSION="0.26.0"  # serving tests: parses /metrics
ACCELERATE_VERSION="1.15.0"  # HF Trainer's dependency (scripts/bench/finetune_vs_hf_trainer.sh)
ONNXRUNTIME_VERSION="1.23.2"  # the reference column of scripts/bench/inference_vs_pytorch.sh ...
ONNX_VERSION="1.23.2"         # ... with the exporter torch.onnx needs
ONNXSCRIPT_VERSION="0.7.2"
TENSORBOARD_VERSION="2.20.0"  # tests read our event files with its EventAccumulator
SELENIUM_VERSION="4.50.0"     # the dashboard test drives Debian's chromium with it
PYZMQ_VERSION="27.3.0"        # the chaos soak's squatter: an independent CURVE client of the coordinator
SCIKIT_LEARN_VERSION="1.9.1"  # evaluation metrics' reference (tests/reference/metrics_parity.py)
WHEEL_VERSION="0.45.1"        # pip install ./python (the Python client) without fetching build tools
# A real MLflow tracking server for the MLflow test, in a venv of its own: its many
# dependencies (pandas, pyarrow, scikit-learn, SQLAlchemy...) stay out of torch's venv.
MLFLOW_VERSION="3.5.1"
MLFLOW_SQLALCHEMY="2.0.58"    # mlflow 3.5 imports a pool class SQLAlchemy 2.1 removed
VENV="${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}"
MLFLOW_VENV="${TRAINYARD_MLFLOW_VENV:-$HOME/.cache/trainyard/mlflow-venv}"

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git python3 python3-venv python3-pip
  openmpi-bin libopenmpi-dev
  libzmq3-dev cppzmq-dev libsodium-dev
  libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev
  libgtest-dev googletest
  libyaml-cpp-dev
  libsqlite3-dev sqlite3
  nlohmann-json3-dev
  libsentencepiece-dev sentencepiece
  libcli11-dev libicu-dev libre2-dev
  libgrpc++-dev protobuf-compiler-grpc libboost-dev
  clang-format clang-tidy
  clang libclang-rt-dev
  librsvg2-bin
  libcurl4-openssl-dev
  openssh-server openssh-client iproute2 util-linux
  slurmctld slurmd slurm-client munge libpmix2 libpmix-dev
  mkdocs
  chromium chromium-driver libjs-chart.js
  fortunes fortunes-de fortunes-it fortunes-es fortunes-br fortunes-pl fortunes-ru fortunes-cs fortunes-eo fortunes-zh
)

log() { echo "[setup] $*"; }

missing_apt_packages() {
  local p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"
  done
}

install_apt_packages() {
  local missing
  missing=$(missing_apt_packages)
  if [[ -z "$missing" ]]; then
    log "Debian packages: all present"
    return
  fi
  log "Debian packages to install: $(echo $missing | tr '\n' ' ')"
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  local apt_log
  apt_log=$(mktemp)
  # shellcheck disable=SC2086
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
           --no-install-recommends $missing; } > "$apt_log" 2>&1; then
    cat "$apt_log"
    echo "[setup] apt-get failed" >&2
    exit 1
  fi
  rm -f "$apt_log"
}

venv_is_ready() {
  [[ -x "$VENV/bin/python" ]] || return 1
  "$VENV/bin/python" - "$TORCH_VERSION" "$TRANSFORMERS_VERSION" "$PEFT_VERSION" "$TRITONCLIENT_VERSION" \
    "$PROMETHEUS_CLIENT_VERSION" "$ACCELERATE_VERSION" "$ONNXRUNTIME_VERSION" "$ONNX_VERSION" \
    "$ONNXSCRIPT_VERSION" "$TENSORBOARD_VERSION" "$SELENIUM_VERSION" "$PYZMQ_VERSION" "$SCIKIT_LEARN_VERSION" \
    "$WHEEL_VERSION" <<'PY' 2>/dev/null
import sys, importlib.metadata as md
want_torch, want_tf, want_peft, want_triton, want_prom, want_acc, want_ort, want_onnx, want_script, want_tb, \
    want_selenium, want_pyzmq, want_sklearn, want_wheel = sys.argv[1:15]
ok = md.version("torch").split("+")[0] == want_torch and md.version("transformers") == want_tf
ok = ok and md.version("peft") == want_peft and md.version("tritonclient") == want_triton
ok = ok and md.version("prometheus_client") == want_prom and md.version("accelerate") == want_acc
ok = ok and md.version("onnxruntime") == want_ort and md.version("onnx") == want_onnx
ok = ok and md.version("onnxscript") == want_script and md.version("tensorboard") == want_tb
ok = ok and md.version("selenium") == want_selenium and md.version("pyzmq") == want_pyzmq
ok = ok and md.version("scikit-learn") == want_sklearn and md.version("wheel") == want_wheel
import yaml  # noqa: F401  (the Python client's; transformers brings it)
import tritonclient.grpc, tritonclient.http  # noqa: F401
import numpy, safetensors  # noqa: F401
sys.exit(0 if ok else 1)
PY
}

install_python_env() {
  if venv_is_ready; then
    log "Python venv $VENV: torch $TORCH_VERSION and transformers $TRANSFORMERS_VERSION present"
    return
  fi
  log "creating Python venv $VENV (torch $TORCH_VERSION, transformers $TRANSFORMERS_VERSION)"
  mkdir -p "$(dirname "$VENV")"
  [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION" \
    "peft==$PEFT_VERSION" "tritonclient[http,grpc]==$TRITONCLIENT_VERSION" \
    "prometheus_client==$PROMETHEUS_CLIENT_VERSION" "accelerate==$ACCELERATE_VERSION" \
    "onnxruntime==$ONNXRUNTIME_VERSION" "onnx==$ONNX_VERSION" "onnxscript==$ONNXSCRIPT_VERSION" \
    "tensorboard==$TENSORBOARD_VERSION" "selenium==$SELENIUM_VERSION" "pyzmq==$PYZMQ_VERSION" "scikit-learn==$SCIKIT_LEARN_VERSION" numpy safetensors \
    pillow "wheel==$WHEEL_VERSION" pyyaml
}

install_mlflow_env() {
  if [[ -x "$MLFLOW_VENV/bin/python" ]] && "$MLFLOW_VENV/bin/python" -c "
import sys, importlib.metadata as md
sys.exit(0 if md.version('mlflow') == '$MLFLOW_VERSION' and md.version('sqlalchemy') == '$MLFLOW_SQLALCHEMY' else 1)
" 2>/dev/null; then
    log "MLflow venv $MLFLOW_VENV: mlflow $MLFLOW_VERSION present"
    return
  fi
  log "creating the MLflow venv $MLFLOW_VENV (mlflow $MLFLOW_VERSION, for the MLflow test's tracking server)"
  [[ -x "$MLFLOW_VENV/bin/python" ]] || python3 -m venv "$MLFLOW_VENV"
  "$MLFLOW_VENV/bin/python" -m pip install -q "mlflow==$MLFLOW_VERSION" "sqlalchemy==$MLFLOW_SQLALCHEMY"
}

install_apt_packages
install_python_env
install_mlflow_env
log "done: venv at $VENV, MLflow server venv at $MLFLOW_VENV"
