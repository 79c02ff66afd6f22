#include "common/checkpoint_meta.h"

#include <algorithm>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "common/safetensors.h"

namespace trainyard {
namespace {

constexpr int64_t kMaxEpochs = 100'000;
constexpr int64_t kMaxRanks = 65'536;
// Examples are counted exactly as doubles elsewhere; 2^53 keeps them exact.
constexpr int64_t kMaxExamples = int64_t{1} << 53;

std::string Exact(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

// Reads the fields of one metadata map, each error naming the file and the field.
class MetaReader {
 public:
  MetaReader(const std::map<std::string, std::string>& meta, const std::string& path) : meta_(meta), path_(path) {}

  [[noreturn]] void Fail(const std::string& key, const std::string& problem) const {
    throw CheckpointError(path_ + ": checkpoint metadata '" + key + "': " + problem);
  }

  bool Has(const std::string& key) const { return meta_.count(key) > 0; }

  const std::string& Text(const std::string& key) const {
    auto it = meta_.find(key);
    if (it == meta_.end()) Fail(key, "missing");
    return it->second;
  }

  // A plain decimal integer (no sign but '-', no spaces, no trailing text) in [lo, hi].
  int64_t Int(const std::string& key, int64_t lo, int64_t hi) const {
    const std::string& text = Text(key);
    int64_t value = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || error != std::errc() || end != text.data() + text.size())
      Fail(key, "expected an integer, got '" + text.substr(0, 40) + "'");
    if (value < lo || value > hi)
      Fail(key, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + text);
    return value;
  }

  // A finite number in [lo, hi]; with `any_finiteness`, also inf or nan.
  double Number(const std::string& key, double lo, double hi, bool any_finiteness = false) const {
    const std::string& text = Text(key);
    double value = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || error != std::errc() || end != text.data() + text.size() ||
        (!any_finiteness && !std::isfinite(value)))
      Fail(key, "expected a finite number, got '" + text.substr(0, 40) + "'");
    if (value < lo || value > hi) Fail(key, "expected a number in [" + Exact(lo) + ", " + Exact(hi) + "], got " + text);
    return value;
  }

 private:
  const std::map<std::string, std::string>& meta_;
  const std::string& path_;
};

void CheckConsistent(const MetaReader& r, const CheckpointMeta& m) {
  const TrainProgress& p = m.progress;
  if (p.next_batch > p.global_step) r.Fail("next_batch", "exceeds global_step");
  if (p.epoch_steps > p.global_step) r.Fail("epoch_steps", "exceeds global_step");
  if (p.epoch_skipped > p.epoch_steps) r.Fail("epoch_skipped", "exceeds epoch_steps");
  if (m.optimizer_steps > p.global_step) r.Fail("optimizer_steps", "exceeds global_step");
  if (p.epoch_steps == 0 && p.epoch_examples != 0)
    r.Fail("epoch_examples", "examples counted in an epoch without steps");
  if (p.evals.step > p.global_step) r.Fail("eval_step", "exceeds global_step");
  if (p.evals.best_step > p.evals.step) r.Fail("best_step", "exceeds eval_step");
}

// The evaluations' fields, which a checkpoint of a run that never evaluated mid-run
// may lack (they are then all zero).
TrainProgress::Evaluations ParseEvaluations(const MetaReader& r) {
  TrainProgress::Evaluations e;
  if (!r.Has("eval_step")) return e;
  e.step = r.Int("eval_step", 0, kMaxCheckpointSteps);
  e.best_step = r.Int("best_step", 0, kMaxCheckpointSteps);
  e.without_gain = r.Int("evals_without_gain", 0, kMaxCheckpointSteps);
  // A diverged run's first evaluation may leave an infinite best; never NaN (Trainer::Judge).
  e.best_value = r.Number("best_value", -HUGE_VAL, HUGE_VAL, /*any_finiteness=*/true);
  return e;
}

// An elastic run's quorum sizes, which any other checkpoint lacks (then all zero).
TrainProgress::Membership ParseMembership(const MetaReader& r) {
  TrainProgress::Membership m;
  if (!r.Has("replicas_last")) return m;
  m.last = r.Int("replicas_last", 1, kMaxRanks);
  m.min = r.Int("replicas_min", 0, kMaxRanks);
  m.max = r.Int("replicas_max", m.min, kMaxRanks);
  m.changes = r.Int("replica_changes", 0, kMaxCheckpointSteps);
  return m;
}

}  // namespace

std::map<std::string, std::string> CheckpointMetaStrings(const CheckpointMeta& m) {
  const TrainProgress& p = m.progress;
  std::map<std::string, std::string> strings = {{"format", kCheckpointFormat},
                                                {"epoch", std::to_string(p.epoch)},
                                                {"next_batch", std::to_string(p.next_batch)},
                                                {"global_step", std::to_string(p.global_step)},
                                                {"epoch_loss_sum", Exact(p.epoch_loss_sum)},
                                                {"epoch_examples", std::to_string(p.epoch_examples)},
                                                {"epoch_steps", std::to_string(p.epoch_steps)},
                                                {"epoch_skipped", std::to_string(p.epoch_skipped)},
                                                {"optimizer_steps", std::to_string(m.optimizer_steps)},
                                                {"loss_scale", Exact(m.loss_scale)},
                                                {"scale_growth_tracker", std::to_string(m.scale_growth_tracker)},
                                                {"rng_ranks", std::to_string(m.rng_ranks)},
                                                {"cuda_rng", m.cuda_rng ? "1" : "0"},
                                                {"eval_step", std::to_string(p.evals.step)},
                                                {"best_step", std::to_string(p.evals.best_step)},
                                                {"evals_without_gain", std::to_string(p.evals.without_gain)},
                                                {"best_value", Exact(p.evals.best_value)}};
  if (p.replicas.last > 0) {
    strings["replicas_min"] = std::to_string(p.replicas.min);
    strings["replicas_max"] = std::to_string(p.replicas.max);
    strings["replica_changes"] = std::to_string(p.replicas.changes);
    strings["replicas_last"] = std::to_string(p.replicas.last);
  }
  return strings;
}

void NoteQuorumSize(TrainProgress::Membership& m, int64_t size) {
  m.min = m.min == 0 ? size : std::min(m.min, size);
  m.max = std::max(m.max, size);
  if (m.last != 0 && m.last != size) ++m.changes;
  m.last = size;
}

CheckpointMeta ParseCheckpointMeta(const std::map<std::string, std::string>& meta, const std::string& path) {
  MetaReader r(meta, path);
  auto format = meta.find("format");
  if (format == meta.end()) throw CheckpointError(path + ": not a Trainyard checkpoint (no 'format' metadata)");
  if (format->second != kCheckpointFormat)
    r.Fail("format", "'" + format->second.substr(0, 40) + "' is not " + kCheckpointFormat +
                         " (a checkpoint of another Trainyard version, or not a checkpoint)");
  // The checksum itself is verified by SafetensorsFile::Read; a checkpoint must have one.
  r.Text(kDataChecksumKey);
  CheckpointMeta m;
  TrainProgress& p = m.progress;
  p.epoch = r.Int("epoch", 0, kMaxEpochs);
  p.global_step = r.Int("global_step", 0, kMaxCheckpointSteps);
  p.next_batch = r.Int("next_batch", 0, kMaxCheckpointSteps);
  // Only reported, never steering training: a diverged run's inf or nan is kept as is.
  p.epoch_loss_sum = r.Number("epoch_loss_sum", 0.0, HUGE_VAL, /*any_finiteness=*/true);
  p.epoch_examples = r.Int("epoch_examples", 0, kMaxExamples);
  p.epoch_steps = r.Int("epoch_steps", 0, kMaxCheckpointSteps);
  p.epoch_skipped = r.Int("epoch_skipped", 0, kMaxCheckpointSteps);
  m.optimizer_steps = r.Int("optimizer_steps", 0, kMaxCheckpointSteps);
  // Restored into a float: it must be a positive normal float.
  m.loss_scale = r.Number("loss_scale", FLT_MIN, FLT_MAX);
  m.scale_growth_tracker = r.Int("scale_growth_tracker", 0, 1'000'000'000);
  m.rng_ranks = r.Int("rng_ranks", 1, kMaxRanks);
  m.cuda_rng = r.Int("cuda_rng", 0, 1) == 1;
  p.evals = ParseEvaluations(r);
  p.replicas = ParseMembership(r);
  CheckConsistent(r, m);
  return m;
}

}  // namespace trainyard
