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

enum class Mode : unsigned char { Guard, Report, Strict };
enum class LogLevel : unsigned char { Error, Warn, Info, Debug };
enum class IpcMode : unsigned char { Report, Deny, Bridge };
enum class FlushPolicy : unsigned char { Allow, Report, Defer };
enum class BusyCheck : unsigned char { Off, Query, Sync };
// CUMEMGUARD_ACTION_<CLASS>: "default" follows the mode.
enum class ActionOverride : unsigned char { Default, Skip, Forward, Abort };

enum class OptionKind : unsigned char { Bool, Int, Size, String, Enum };

inline constexpr std::string_view kOptionPrefix = "CUMEMGUARD_";

struct Options {
#define CMG_OPTION(field, name, kind, type, def, choices, help) type field{};
#include "options.def"
#undef CMG_OPTION
  std::array<ActionOverride, kFindingClassCount> action{};

  // What the shim does for a finding of class c under the mode and the per-class override.
  // Leak findings are only ever reported; config findings abort only with strict_config.
  Action action_for(FindingClass c) const;
};

// One row of the table, for listings (`cumemguard config`, the README check).
struct OptionSpec {
  std::string_view field;
  std::string_view name;  // without the prefix
  OptionKind kind;
  std::string_view default_value;
  std::string_view choices;  // "a|b|c" for Enum
  std::string_view help;
};

// The table rows, then one ACTION_<CLASS> row per finding class.
std::span<const OptionSpec> option_specs();
std::string_view option_kind_name(OptionKind k);

enum class OptionSource : unsigned char { Default, Environment };

struct OptionValue {
  const OptionSpec *spec;
  OptionSource source;
  std::string raw;        // as set in the environment (empty when default)
  std::string effective;  // as used, printed form
};

struct ParsedOptions {
  Options options;
  std::vector<OptionValue> values;     // one per option_specs() row, same order
  std::vector<std::string> problems;   // one line each: bad values, unknown names
  bool fatal = false;                  // a problem with strict_config set
};

// env: NAME=VALUE pairs of the whole environment (other variables are ignored).
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
// s with control bytes (and UTF-8 C1 controls) written as \xNN, cut once the result reaches
// max_out bytes; consumed says how many bytes of s it covers. Every diagnostic line goes through
// it (options, the shim's stderr, every text of `cumemguard report`).
std::string escape_controls(std::string_view s, std::size_t max_out, std::size_t &consumed);
// Case-insensitive edit distance (optimal string alignment: an adjacent swap counts one), for
// "did you mean" hints on misspelt names.
std::size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace cmg

namespace cmg {

// CUMEMGUARD_QUARANTINE=auto: the Size option's value that asks for a quarantine sized to the
// device, resolved at run time by quarantine_for_device().
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
