// The state store's SQLite statements, shared by its source files (state_store.cc,
// state_store_history.cc); not for use outside the store.
#pragma once

#include <sqlite3.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>

#include "coordinator/state_store.h"

namespace trainyard {

extern std::atomic<int64_t> full_scan_steps;  // FullScanSteps()

// Note [Prepared statements]
// Preparing a statement (parsing and planning its SQL) costs more than running most of
// the loop's queries, and the loop runs the same few dozen texts again and again. So each
// connection keeps one idle prepared statement per SQL text: a Statement takes it (or
// prepares one when it is taken already, as by a query nested in another's loop) and gives
// it back reset, with its binds cleared, when it goes out of scope. Texts are the store's
// own, with every value bound, so they are few; past kMaxIdle the extra ones are finalized.
// All are finalized before the connection closes.
class StatementCache {
 public:
  explicit StatementCache(sqlite3* db) : db_(db) {}
  ~StatementCache() {
    for (auto& [sql, stmt] : idle_) sqlite3_finalize(stmt);
  }
  StatementCache(const StatementCache&) = delete;
  StatementCache& operator=(const StatementCache&) = delete;
  sqlite3* db() const { return db_; }

  sqlite3_stmt* Take(const std::string& sql) {
    if (auto it = idle_.find(sql); it != idle_.end()) {
      sqlite3_stmt* stmt = it->second;
      idle_.erase(it);
      return stmt;
    }
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK)
      throw StoreError("SQLite: " + std::string(sqlite3_errmsg(db_)) + " in: " + sql);
    return stmt;
  }

  void GiveBack(const std::string& sql, sqlite3_stmt* stmt) {
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    if (idle_.size() >= kMaxIdle || !idle_.emplace(sql, stmt).second) sqlite3_finalize(stmt);
  }

 private:
  static constexpr size_t kMaxIdle = 256;
  sqlite3* db_;
  std::unordered_map<std::string, sqlite3_stmt*> idle_;
};

// A prepared statement with positional binds: the cache's (Note [Prepared statements]),
// or, made from a bare connection, one of its own. On scope exit its full-scan steps are
// added to FullScanSteps(), and it is given back or finalized.
class Statement {
 public:
  Statement(StatementCache& cache, std::string sql)
      : db_(cache.db()), cache_(&cache), sql_(std::move(sql)), stmt_(cache.Take(sql_)) {}
  Statement(sqlite3* db, const std::string& sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr) != SQLITE_OK)
      throw StoreError("SQLite: " + std::string(sqlite3_errmsg(db)) + " in: " + sql);
  }
  ~Statement() {
    full_scan_steps += sqlite3_stmt_status(stmt_, SQLITE_STMTSTATUS_FULLSCAN_STEP, 1);
    if (cache_)
      cache_->GiveBack(sql_, stmt_);
    else
      sqlite3_finalize(stmt_);
  }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  Statement& Bind(int i, int64_t v) { return Check(sqlite3_bind_int64(stmt_, i, v)); }
  Statement& Bind(int i, double v) { return Check(sqlite3_bind_double(stmt_, i, v)); }
  Statement& Bind(int i, const std::string& v) {
    return Check(sqlite3_bind_text(stmt_, i, v.c_str(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  bool Step() {  // true while a row is available
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw StoreError("SQLite: " + std::string(sqlite3_errmsg(db_)));
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const { return sqlite3_column_double(stmt_, col); }
  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::string Text(int col) const {
    const auto* text = sqlite3_column_text(stmt_, col);
    return text ? reinterpret_cast<const char*>(text) : "";
  }

 private:
  Statement& Check(int rc) {
    if (rc != SQLITE_OK) throw StoreError("SQLite bind: " + std::string(sqlite3_errmsg(db_)));
    return *this;
  }
  sqlite3* db_;
  StatementCache* cache_ = nullptr;
  std::string sql_;
  sqlite3_stmt* stmt_ = nullptr;
};

}  // namespace trainyard
