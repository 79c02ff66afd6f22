#include "common/spec/yaml_budget.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <sstream>

#include "common/spec/job_spec.h"

namespace trainyard {
namespace {

// Counts nodes and depth; throws SpecError as soon as either is over the budget, so
// the cost of a hostile text is bounded by the budget, not by the text.
class BudgetCounter : public YAML::EventHandler {
 public:
  BudgetCounter(const std::string& source, const YamlBudget& budget) : source_(source), budget_(budget) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Count(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Count(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    Count(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    Open(mark);
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    Open(mark);
  }
  void OnMapEnd() override { --depth_; }

 private:
  void Count(const YAML::Mark& mark) {
    if (++nodes_ > budget_.max_nodes)
      Fail(mark,
           "<document>: more than " + std::to_string(budget_.max_nodes) + " YAML nodes; a job file needs far fewer");
  }
  void Open(const YAML::Mark& mark) {
    Count(mark);
    if (++depth_ > budget_.max_depth)
      Fail(mark, "<document>: malformed YAML: nested deeper than " + std::to_string(budget_.max_depth) + " levels");
  }
  [[noreturn]] void Fail(const YAML::Mark& mark, const std::string& what) const {
    throw SpecError(source_ + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1) + ": " +
                    what);
  }

  const std::string& source_;
  const YamlBudget& budget_;
  size_t nodes_ = 0, depth_ = 0;
};

}  // namespace

void CheckYamlBudget(const std::string& text, const std::string& source, const YamlBudget& budget) {
  if (text.size() > budget.max_bytes)
    throw SpecError(source + ":0:0: <file>: the job file is " + std::to_string(text.size()) + " bytes; at most " +
                    std::to_string(budget.max_bytes) + " are accepted");
  std::istringstream in(text);
  BudgetCounter counter(source, budget);
  try {
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(counter)) {
    }
  } catch (const YAML::Exception& e) {
    throw SpecError(source + ":" + std::to_string(std::max(e.mark.line, 0) + 1) + ":" +
                    std::to_string(std::max(e.mark.column, 0) + 1) + ": <document>: malformed YAML: " + e.msg);
  }
}

}  // namespace trainyard
