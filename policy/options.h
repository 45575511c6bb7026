// SPDX-License-Identifier: Apache-2.0
// CUMEMGUARD_* options: the struct, the table behind it and the parser (one snapshot, parsed once).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "findings.h"

namespace cmg {

enum class Profile : unsigned char { Guard, Debug };
enum class Mode : unsigned char { Guard, Report, Strict };
enum class LogLevel : unsigned char { Error, Warn, Info, Debug };
enum class IpcMode : unsigned char { Report, Deny, Bridge };
enum class FlushPolicy : unsigned char { Allow, Report, Defer };
enum class BusyCheck : unsigned char { Off, Query, Sync };
enum class SnapshotSignal : unsigned char { Off, Usr1, Usr2, Urg, Winch, Pwr, Hup };
// CUMEMGUARD_ACTION_<CLASS>: "default" follows the mode.
enum class ActionOverride : unsigned char { Default, Skip, Forward, Abort };

enum class OptionKind : unsigned char { Bool, Int, Size, String, Enum };

inline constexpr std::string_view kOptionPrefix = "CUMEMGUARD_";
// A variable the options are read from or checked against: the prefix in any case, so that
// cumemguard_stacks is reported as a misspelt CUMEMGUARD_STACKS (names themselves are exact).
constexpr bool has_option_prefix(std::string_view name) {
  if (name.size() < kOptionPrefix.size()) return false;
  for (std::size_t i = 0; i < kOptionPrefix.size(); ++i) {
    const char c = name[i] >= 'a' && name[i] <= 'z' ? static_cast<char>(name[i] - 32) : name[i];
    if (c != kOptionPrefix[i]) return false;
  }
  return true;
}
// One variable holding many options, NAME=VALUE entries separated by ':' (ASan's and jemalloc's
// habit: CUMEMGUARD_OPTIONS=mode=strict:stacks=16). Names are the table's, any case, with or
// without the prefix; a value holding ':' is quoted ('...' or "..."). A separate CUMEMGUARD_<NAME>
// variable wins over an entry here; a later entry wins over an earlier one.
inline constexpr std::string_view kOptionsVariable = "CUMEMGUARD_OPTIONS";

// A name with the prefix misspelt (CUMEMGAURD_STACKS, CUMEMGUARG_OPTIONS): the part before its
// first '_' one or two edits from CUMEMGUARD and the rest an option's name (any case) or OPTIONS.
// Such a variable is read by nothing; it is reported as an unknown option with the name it
// meant, and `cumemguard run` refuses it as one. Empty when `name` is not one.
std::string misspelt_prefix_meant(std::string_view name);

struct Options {
#define CMG_OPTION(field, name, kind, type, def, debug_def, choices, help, ...) type field{};
#include "options.def"
#undef CMG_OPTION
  std::array<ActionOverride, kFindingClassCount> action{};

  // What the shim does for a finding of class c under the mode and the per-class override.
  // Leak and unseen-reissue findings are only ever reported; config findings abort only with
  // strict_config.
  Action action_for(FindingClass c) const;
};

// One row of the table, for listings (`cumemguard config`, the README check).
struct OptionSpec {
  std::string_view field;
  std::string_view name;  // without the prefix
  OptionKind kind;
  std::string_view default_value;  // the guard profile's
  std::string_view debug_value;    // the debug profile's
  std::string_view choices;        // "a|b|c" for Enum; "auto" for a Size that takes it
  std::string_view help;
  bool internal = false;  // set (or read, SHIM_PATH) by `cumemguard run` or the shim itself
};

// The table rows, then one ACTION_<CLASS> row per finding class.
std::span<const OptionSpec> option_specs();
std::string_view option_kind_name(OptionKind k);

// Where a value comes from. Default: the table's guard default (or a debug default equal to it);
// Profile: the debug profile's own default; Options: an entry of CUMEMGUARD_OPTIONS;
// Environment: its own CUMEMGUARD_<NAME> variable.
enum class OptionSource : unsigned char { Default, Profile, Options, Environment };
std::string_view option_source_name(OptionSource s);  // "default", "profile", "options", "environment"

struct OptionValue {
  const OptionSpec *spec;
  OptionSource source;
  std::string raw;        // as set (empty for Default and Profile), or the value rejected
  std::string effective;  // as used, printed form
  bool rejected = false;  // set, but the value was refused (the default was kept)
};

// What a problem line is about. `cumemguard run` stops for the kinds that leave a setting the
// user asked for not applied (an unknown name, a bad value, a malformed entry) and lets a repeated
// name through (the shim says which entry it used).
enum class ProblemKind : unsigned char { Unknown, BadValue, Repeated, Malformed };

struct ParsedOptions {
  Options options;
  std::vector<OptionValue> values;     // one per option_specs() row, same order
  std::vector<std::string> problems;   // one line each: bad values, unknown names, duplicates
  std::vector<ProblemKind> problem_kinds;  // the kind of each line of problems, same order
  bool fatal = false;                  // a problem with strict_config set
  OptionSource profile_source = OptionSource::Default;  // where CUMEMGUARD_PROFILE came from
  bool has_options_variable = false;   // CUMEMGUARD_OPTIONS present
  std::string options_variable;        // its value
};

// A problem line without what the shim does about it when it runs on ("; ignored", "; keeping
// '0'", "; defaults kept", which entry of a repeated name is used): the words when nothing runs on,
// under CUMEMGUARD_STRICT_CONFIG (the process aborts) or in `cumemguard run` (not started).
std::string problem_without_fallback(std::string_view problem);

// Each kind of problem (unknown name, bad value, repeated name, malformed CUMEMGUARD_OPTIONS entry)
// is reported this many times, then counted in one more line: 20,000 bad entries are 9 lines.
inline constexpr std::size_t kMaxProblemsPerKind = 8;

// env: NAME=VALUE pairs of the whole environment in its order (other variables are ignored). A
// name present twice is read as getenv() reads it: the first entry wins (the rest are reported).
ParsedOptions parse_options(std::span<const std::pair<std::string_view, std::string_view>> env);
// Convenience over a NULL-terminated environ-style array.
ParsedOptions parse_options(char *const *envp);

// "4G" -> 4 GiB. Accepts a plain number or K, M, G, T (optionally followed by B or iB), any case.
bool parse_size(std::string_view s, std::uint64_t &out);
bool parse_bool(std::string_view s, bool &out);
// How a value or name from the environment is quoted in a one-line message: control characters
// escaped (a newline must not start a second line, an escape sequence must not reach the
// terminal) and long text shortened to 64 bytes (a megabyte of garbage is still one short line).
std::string shown(std::string_view s);
// s with control bytes, UTF-8 C1 controls and the bidirectional controls (U+202E and the others
// of Bidi_Control, U+2028/U+2029) written as \xNN per byte, cut once the result reaches max_out
// bytes; consumed says how many bytes of s it covers. Every diagnostic line goes through it
// (options, the shim's stderr, every text of `cumemguard report`).
std::string escape_controls(std::string_view s, std::size_t max_out, std::size_t &consumed);
// The length in bytes of the character at s[i] when escape_controls escapes it, else 0.
std::size_t control_length(std::string_view s, std::size_t i);
// The same into out[0, cap) without allocating (kShownMax bytes hold any); returns the length.
inline constexpr std::size_t kShownMax = 64 * 8 + 32;
std::size_t shown_to(std::string_view s, char *out, std::size_t cap);
// escape_controls into out[0, cap) without allocating (the shim's diagnostics after exit began):
// stops at max_out bytes or where the next character's escape would not fit; returns the length.
std::size_t escape_controls_to(std::string_view s, std::size_t max_out, char *out,
                               std::size_t cap, std::size_t &consumed);
// Case-insensitive edit distance (optimal string alignment: an adjacent swap counts one), for
// "did you mean" hints on misspelt names.
std::size_t edit_distance(std::string_view a, std::string_view b);
// The index in `names` of the one closest to `key` (a third of its letters may differ: typos, not
// guesses), or names.size() when none is that close: the "did you mean" of option and variable
// names alike.
std::size_t closest_name(std::string_view key, std::span<const std::string_view> names);
// " (did you mean 'strict'?)" when `value` is close to one of the '|'-separated `choices`, else "".
std::string choice_hint(std::string_view choices, std::string_view value);

}  // namespace cmg

namespace cmg {

// CUMEMGUARD_QUARANTINE=auto: the Size option's value that asks for a quarantine sized to the
// device, resolved at run time by quarantine_for_device(). The parser accepts the word for a Size
// option whose choices are "auto" and only carries it.
inline constexpr std::uint64_t kAutoSize = ~std::uint64_t{0};

// The quarantine `auto` gives a device of `total` bytes: 1/256 of its memory, at least 64 MiB and at
// most 1 GiB (docs/performance.md, "Quarantine"). A stale free is caught while the address it
// names is still held: the common bug (free, allocate again, free the old pointer) needs only the
// allocation's own size; the floor covers allocations of tens of MiB on small devices, and the cap
// keeps what is held far below what a program on a large device can notice (an allocation that runs
// out of memory releases everything held and is retried once anyway).
constexpr std::uint64_t quarantine_for_device(std::uint64_t total) {
  constexpr std::uint64_t floor = 64ull << 20, cap = 1ull << 30;
  const std::uint64_t q = total / 256;
  return q < floor ? floor : (q > cap ? cap : q);
}

}  // namespace cmg
