// A hyperparameter search (`kind: search`): a base fine-tuning job, the parameters to
// vary and how, and the trials that come of it. Parsed and validated once, at submission,
// by jobctl and the coordinator; every trial's job file is built and checked with the job
// schema then, so a search that is accepted never fails on a trial's file. Torch-free.
//
// The file:
//   name: langid_search
//   kind: search
//   base: langid_tiny.yaml         # a job file (relative to this one), or its keys inline
//   search:
//     method: asha                 # asha | random | grid
//     metric: eval_acc             # an epochs.csv column (kSearchMetrics)
//     mode: max                    # max | min
//     max_trials: 12               # random and asha: trials drawn; grid: at most this many
//     max_concurrent: 2            # trials queued or running at once
//     seed: 7                      # of the draws
//     params:                      # dotted job keys, each with one distribution
//       train.lr: {log_uniform: [1.0e-5, 1.0e-1]}
//       train.batch_size: {choice: [16, 32]}
//     asha: {min_epochs: 1, reduction_factor: 3, max_epochs: 9}
//
// Note [Trial draws]
// Random and ASHA trials draw their values from SplitMix64 seeded with `seed`: one draw per
// parameter, in the order the file lists them, trial after trial. A draw z becomes
// u = (z >> 11) / 2^53 in [0, 1), and then
//   uniform [a, b]      a + u (b - a)
//   log_uniform [a, b]  exp(ln a + u (ln b - ln a))
//   int_uniform [a, b]  a + floor(u (b - a + 1))
//   choice [v0 .. vn-1] v_floor(u n)
// so a trial set is reproducible anywhere from the seed alone (tests/coordinator checks it
// against an independent implementation). Grid trials are the product of the values in
// file order, the last parameter varying fastest; int_uniform contributes every integer
// of its range, and uniform or log_uniform cannot be gridded.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/spec/job_spec.h"

namespace trainyard {

enum class SearchMethod { kAsha, kRandom, kGrid };
enum class Distribution { kChoice, kUniform, kLogUniform, kIntUniform };

struct SearchParam {
  std::string key;  // a dotted job key: "train.lr"
  Distribution distribution = Distribution::kChoice;
  std::vector<std::string> choices;  // kChoice: the values as written
  double low = 0, high = 0;          // the others: the closed range
  std::string where;                 // "<file>:<line>:<column>" of the parameter
};

// Asynchronous successive halving (Note [ASHA] in coordinator/search.h).
struct AshaSpec {
  int min_epochs = 1;
  int reduction_factor = 3;  // eta
  int max_epochs = 0;        // 0 in the file: the base's train.epochs
  // The epochs at which a trial is judged: min_epochs x eta^k below max_epochs.
  std::vector<int> Rungs() const;
};

// One trial: its parameter values as job-file text, and its whole job file.
struct SearchTrial {
  int index = 0;                                            // 1-based
  std::vector<std::pair<std::string, std::string>> params;  // (key, value), in file order
  std::string yaml;                                         // the trial's job file
  JobSpec spec;                                             // that file, parsed
};

struct SearchSpec {
  std::string name, source;
  // A base given as a path: that file (resolved) and its text, which jobctl sends along
  // (SearchBaseFile). Empty for an inline base.
  std::string base_path, base_text;
  SearchMethod method = SearchMethod::kRandom;
  std::string metric = "eval_acc";
  bool maximize = true;
  int max_trials = 0, max_concurrent = 1;
  uint64_t seed = 0;
  std::vector<SearchParam> params;
  AshaSpec asha;
  std::string base_dir;  // where the trials' relative paths resolve: the base file's folder
  std::vector<SearchTrial> trials;
};

// The epochs.csv columns a search may rank trials by.
const std::vector<std::string>& SearchMetrics();

// True when `yaml_text` is a mapping whose `kind` is `search`; false for anything else,
// malformed YAML included (the job parser then says what is wrong with it).
bool IsSearchFile(const std::string& yaml_text);

// A base job file as a submission carries it: jobctl reads the file and sends its text,
// so that the coordinator never opens a file a client names.
struct SearchBaseFile {
  std::string path;  // resolved, as SearchSpec::base_path
  std::string text;
};

// Parses a search file and builds every trial (Note [Trial draws]). `base_dir` resolves
// `base` and the base's relative paths. A base given as a path is read from disk, unless
// `sent` is given: then it must be that file (the coordinator's case). Throws SpecError
// ("<file>:<line>:<column>: <key.path>: <what was expected>") on any problem, a trial's
// job file included.
SearchSpec ParseSearchSpec(const std::string& yaml_text, const std::string& source_name, const std::string& base_dir,
                           const SearchBaseFile* sent = nullptr);

const char* ToString(SearchMethod method);

}  // namespace trainyard
