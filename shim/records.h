// SPDX-License-Identifier: Apache-2.0
// The records that carry text of any length from the program or the policy (the header's argv and
// options, a finding's message, related events and state), written through the log's fixed-size
// line writer (LogLine): no heap string per record, and a long one still reaches the log whole.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "interposers.h"
#include "state.h"

namespace cmg::shim {

// A call's arguments as the record's "args" object (the call record and the finding record).
// Inline, for either writer (JsonLine or its Unchecked members): the call record builds it in
// place (docs/performance.md, the log's cost per call).
template <class W>
inline void put_args(W &j, const Args &args) {
  j.begin_object("args");
  for (int i = 0; i < args.n; ++i) {
    const Args::A &a = args.a[i];
    const std::string_view k(a.k, a.kn);
    switch (a.t) {
      case Args::T::Hex: j.hex(k, a.v); break;
      case Args::T::U: j.unum(k, a.v); break;
      case Args::T::I: j.num(k, static_cast<std::int64_t>(a.v)); break;
      case Args::T::S: j.str(k, a.s ? a.s : ""); break;
    }
  }
  j.end_object();
}

// The most bytes put_args writes (as JsonLine::fits counts them), or none when an argument is a
// string (escaped, of any length: the arguments are then written with a check each).
inline constexpr std::size_t kNoBound = std::size_t{1} << 40;
inline std::size_t args_bound(const Args &args) {
  std::size_t n = 4 + 4 + 1 + 1 + 1;  // "args" and its key's bytes, the braces, its depth
  for (int i = 0; i < args.n; ++i) {
    if (args.a[i].t == Args::T::S) return kNoBound;
    n += args.a[i].kn + 4 + JsonLine::kNumMax;
  }
  return n;
}

// The first line of the log: format, tool, pid, ppid, rank, host, start time, argv, mode, the
// options set in the environment and the interposers loaded before the shim. Written through to
// the file at once.
void write_header_record(const std::vector<Interposer> &before);

// A finding at a call (seq, ts and its stack already taken for it); `suppressed` names the rule
// (CLASS:PATTERN) that suppressed it, or is null.
void write_finding_record(const Call &c, const Finding &f, Action action, int res,
                          const Args &args, std::uint64_t seq, std::uint64_t ts,
                          std::uint32_t stack, const char *suppressed);
// A finding that belongs to no call (`where` names it); kept until the log opens when it is not
// open yet.
// `stack`: the stack the finding is shown with (0: none); related events are written as for a
// finding at a call.
void write_finding_without_call(const Finding &f, const char *where, std::uint64_t seq,
                                std::uint64_t ts, std::uint32_t stack = 0);

// CUMEMGUARD_LOG expanded for this process (logname.h); a placeholder kept as written is said
// once on stderr and in the log.
std::string log_path_for(std::string_view pattern, int rank);

}  // namespace cmg::shim
