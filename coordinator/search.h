// The decisions of a hyperparameter search (`kind: search`, common/spec/search_spec.h),
// as pure functions: the coordinator's SearchDriver (search_driver.h) stores what they decide.
//
// Note [Search life cycle]
// A search is a job row of its own that never runs ranks. At submission every trial's job
// file is built and checked, and the search and its trials are stored in one transaction.
// From then on the loop keeps `max_concurrent` of its trials submitted and not finished:
// each trial is an ordinary job (priority, owner, quotas, restarts and preemption apply),
// submitted with the idempotency key "search:<id>:trial:<n>" in the transaction that
// records its job id, so a restarted coordinator never submits a trial twice. A trial's
// epoch rows are judged as they arrive (Note [ASHA]). When every trial has ended, the
// search ends: SUCCEEDED if some trial succeeded or was stopped by the search, FAILED
// otherwise. Cancelling the search cancels the trials not yet ended.
//
// Note [ASHA]
// Asynchronous successive halving (Li et al., "A System for Massively Parallel
// Hyperparameter Tuning", MLSys 2020), in its stopping form: rungs are the epochs
// min_epochs x eta^k below max_epochs. When a trial's row for a rung epoch arrives, its
// metric joins the rung's results, and the trial goes on only if it is among the best
// max(1, floor(n / eta)) of the n results recorded there, itself included; an earlier
// result as good as it counts as better, and a missing or NaN metric is the worst. So the
// first trial to reach a rung always goes on, no trial waits for another, and about one in
// eta goes on from each rung. The result and the decision are stored with the epoch row,
// in one transaction, before the row is acknowledged; a resent row finds its decision
// stored and is never judged twice. A trial told to stop gets a StopJob at once: its ranks
// agree to stop after the step in progress (Note [Stop agreement] in
// worker/jobs/job_setup.h), a step or two into the next epoch, whose row is never
// written, and the trial ends STOPPED. While the coordinator is down a trial goes on
// (nothing waits for a decision): the rows of the epochs it finished meanwhile are kept, and
// the rung's row is judged when it arrives. Decisions depend only on the order in which rung
// results arrive: with max_concurrent 1, that is the trials' order, so a search of
// deterministic trials decides the same way every time, across coordinator restarts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "coordinator/state_store.h"

namespace trainyard {

// Note [ASHA]: whether a trial whose metric at a rung is `value` goes on, given the results
// recorded there before it (in arrival order).
bool AshaPromotes(const std::vector<RungResult>& earlier, double value, bool maximize, int eta);

// The value of column `metric` in an epochs.csv line under `csv_header`; NaN when the
// column is missing or its cell is not a number.
double MetricOf(const std::string& csv_header, const std::string& csv_line, const std::string& metric);

// True when `a` is a better metric than `b` (NaN is never better).
bool Better(double a, double b, bool maximize);

}  // namespace trainyard
