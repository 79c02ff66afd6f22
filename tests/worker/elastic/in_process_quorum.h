// The coordinator's QuorumService reached in process by replicas on threads of one
// test (the wire's part is tested elsewhere): elastic_replica_test and the elastic
// trainer's test.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "coordinator/quorum_service.h"
#include "worker/elastic/quorum_link.h"

namespace trainyard {

// The quorum service behind a lock, its timers advanced every 5 ms by a thread of its
// own, each replica's calls answered from the decisions it has made.
class InProcessQuorum {
 public:
  explicit InProcessQuorum(QuorumService::Options options) : service_(options, 0) {
    driver_ = std::thread([this] {
      while (!stop_) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          for (StepDecision& d : service_.Advance(SteadySeconds())) decisions_.push_back(std::move(d));
          for (const auto& [name, beating] : beating_)
            if (beating) service_.Beat(name, 0, SteadySeconds());
        }
        changed_.notify_all();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  ~InProcessQuorum() {
    stop_ = true;
    driver_.join();
  }
  // A replica's process ended, as its agent reports.
  void Remove(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    beating_[name] = false;
    service_.RemoveReplica(name, SteadySeconds());
  }
  bool GivenUp() {
    std::lock_guard<std::mutex> lock(mutex_);
    return service_.given_up();
  }
  int64_t CommittedSteps() {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t committed = 0;
    for (const StepDecision& d : decisions_)
      if (d.commit) committed = std::max(committed, d.step);
    return committed;
  }

  class Link : public QuorumLink {
   public:
    Link(InProcessQuorum& q, std::string name, int port) : q_(q), name_(std::move(name)), port_(port) {}
    std::optional<QuorumView> Join(int64_t committed_step, const std::function<bool()>& /*stop*/) override {
      std::unique_lock<std::mutex> lock(q_.mutex_);
      const size_t from = q_.decisions_.size();
      q_.service_.Join(name_, {"127.0.0.1", port_}, committed_step, SteadySeconds());
      q_.beating_[name_] = true;
      std::optional<QuorumView> view;
      q_.changed_.wait(lock, [&] {
        for (size_t i = from; i < q_.decisions_.size() && !view; ++i) view = ViewOf(q_.decisions_[i]);
        return view.has_value() || q_.service_.given_up();  // none will form again
      });
      return view;
    }
    StepVerdict Vote(uint64_t id, int64_t step, bool ok, const std::string& /*why*/) override {
      std::unique_lock<std::mutex> lock(q_.mutex_);
      if (q_.service_.Vote(name_, id, step, ok, SteadySeconds()) == VoteAnswer::kFenced) return {false, {}, "fenced"};
      StepVerdict verdict;
      q_.changed_.wait(lock, [&] {
        for (const StepDecision& d : q_.decisions_)
          if (d.quorum_id == id && d.step == step) {
            verdict = {d.commit, ViewOf(d), d.why};
            return true;
          }
        return false;
      });
      return verdict;
    }

   private:
    // The decision's next quorum as this replica sees it, if it is a member.
    std::optional<QuorumView> ViewOf(const StepDecision& d) const {
      if (!d.next) return std::nullopt;
      QuorumView view{d.next->id, d.next->step, -1, {}, {}, ""};
      std::map<std::string, int> position;
      for (size_t i = 0; i < d.next->members.size(); ++i) {
        position[d.next->members[i]] = static_cast<int>(i);
        view.rings.push_back({d.next->rings[i].host, d.next->rings[i].port});
      }
      if (!position.count(name_)) return std::nullopt;
      view.position = position[name_];
      for (const HealPair& h : d.next->heals) view.heals.emplace_back(position[h.source], position[h.target]);
      return view;
    }
    InProcessQuorum& q_;
    std::string name_;
    int port_;
  };

 private:
  QuorumService service_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<StepDecision> decisions_;
  std::map<std::string, bool> beating_;
  std::atomic<bool> stop_{false};
  std::thread driver_;
};

}  // namespace trainyard
