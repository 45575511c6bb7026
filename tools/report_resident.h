// SPDX-License-Identifier: Apache-2.0
// The report's "Resident" section: the snapshots of what is resident (docs/log-format.md,
// `snapshot`) read from the logs, each shown by creator and by site, largest first, with what did
// not go to sleep called out after a sleep; and `cumemguard report --diff A B`, which compares two
// snapshots by site.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace cmg::report {

struct Model;
struct ReportOptions;

// One row of a snapshot, as written: its parts added up by key.
struct SnapshotRow {
  std::int64_t dev = -1;
  std::string kind, state;
  std::uint64_t stack = 0;  // 0: none
  std::uint64_t graph = 0;  // the capture that made it for a CUDA graph; 0: none
  std::int64_t count = 0, bytes = 0;
};

struct Snapshot {
  std::size_t log = 0;
  std::uint64_t id = 0;
  std::uint64_t after_seq = 0;
  std::int64_t ts = 0, tid = 0;
  std::string label, trigger;
  std::optional<std::uint64_t> stack;  // where it was asked for (the C API, Python)
  struct Run {
    std::string what;
    std::uint64_t seq = 0;
    std::int64_t tid = 0, ranges = 0, bytes = 0;
    bool failed = false;
  };
  std::optional<Run> run;  // the sleep or wake-up that ended at this boundary
  std::vector<SnapshotRow> rows;
  std::size_t parts = 0;
  bool ended = false;       // its last part was read
  bool incomplete = false;  // the shim could not read part of the model
  std::int64_t objects = 0, dur = 0;
  std::size_t rows_dropped = 0;  // past kMaxRows
};

class ResidentModel {
 public:
  static constexpr std::size_t kMaxSnapshots = 4096;             // per report
  static constexpr std::size_t kMaxRows = std::size_t{1} << 20;  // per snapshot, after adding up

  // One `snapshot` record line of log `log` (the reader hands it over as read).
  void add_line(std::size_t log, std::string_view line);
  // Every log is read: the snapshots in order (by log, then by id).
  void finish();
  const std::vector<Snapshot> &snapshots() const { return snaps_; }
  std::size_t malformed() const { return malformed_; }
  std::size_t dropped() const { return dropped_; }  // snapshots past kMaxSnapshots

 private:
  std::vector<Snapshot> snaps_;
  std::map<std::pair<std::size_t, std::uint64_t>, std::size_t> at_;    // (log, id) -> snaps_ index
  std::vector<std::unordered_map<std::string, std::size_t>> rows_at_;  // per snapshot: row key
  std::size_t malformed_ = 0, dropped_ = 0;
};

// The section, in each of the report's forms.
nlohmann::ordered_json snapshot_json(const Model &m, const ReportOptions &opt, const Snapshot &s);
void write_resident_text(const Model &m, const ReportOptions &opt, std::ostream &out);
nlohmann::ordered_json resident_json(const Model &m, const ReportOptions &opt);
// The HTML page's part: one chart (bars by creator, resident and asleep) per snapshot.
void write_resident_html(const Model &m, const ReportOptions &opt, std::ostream &out);
// Symbolizes the stacks the writers show (before the first line is written).
void resolve_resident(const Model &m, const ReportOptions &opt);

// `cumemguard report --diff A B`: each operand is LOG (its last snapshot) or LOG@N (the Nth) or
// LOG@LABEL (the last one with that label). Returns the exit status.
int diff_main(const std::string &a, const std::string &b, const ReportOptions &opt);

}  // namespace cmg::report
