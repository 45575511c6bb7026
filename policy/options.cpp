// SPDX-License-Identifier: Apache-2.0
// Parser for the CUMEMGUARD_* table: bad values warn once and keep the default (jemalloc-style,
// fatal only with CUMEMGUARD_STRICT_CONFIG), unknown CUMEMGUARD_* names warn with a suggestion.
#include "options.h"

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <utility>
#include <type_traits>

namespace cmg {
namespace {

constexpr std::size_t kTableRows = 0
#define CMG_OPTION(field, name, kind, type, def, debug_def, choices, help, ...) +1
#include "options.def"
#undef CMG_OPTION
    ;

constexpr std::string_view kActionChoices = "default|skip|forward|abort";

std::array<OptionSpec, kTableRows + kFindingClassCount> build_specs() {
  std::array<OptionSpec, kTableRows + kFindingClassCount> specs{};
  std::size_t i = 0;
#define CMG_OPTION(field, name, kind, type, def, debug_def, choices, help, ...) \
  specs[i++] = OptionSpec{#field, name, OptionKind::kind, def, debug_def, choices, help, \
                          std::string_view(#__VA_ARGS__) == "Internal"};
#include "options.def"
#undef CMG_OPTION
  // What each class's option lists: default and the actions that can apply to the class.
  static const auto *choices = [] {
    auto *a = new std::array<std::string, kFindingClassCount>;
    for (std::size_t c = 0; c < kFindingClassCount; ++c)
      (*a)[c] = "default|" + std::string(finding_info(static_cast<FindingClass>(c)).accepts);
    return a;
  }();
  for (std::size_t c = 0; c < kFindingClassCount; ++c) {
    const FindingInfo &f = finding_info(static_cast<FindingClass>(c));
    specs[i++] = OptionSpec{"action", f.option, OptionKind::Enum, "default", "default",
                            (*choices)[c],
                            "per-class override of what the mode does for this finding class"};
  }
  return specs;
}

// A function-local static, not a global: the shim parses options from its load-time constructor,
// which may run before this file's dynamic initializers.
const std::array<OptionSpec, kTableRows + kFindingClassCount> &specs() {
  static const auto s = build_specs();
  return s;
}

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

// Index of s among '|'-separated choices, or -1.
int choice_index(std::string_view choices, std::string_view s) {
  int idx = 0;
  while (true) {
    std::size_t bar = choices.find('|');
    std::string_view c = choices.substr(0, bar);
    if (iequals(c, s)) return idx;
    if (bar == std::string_view::npos) return -1;
    choices.remove_prefix(bar + 1);
    ++idx;
  }
}

std::string_view choice_at(std::string_view choices, int idx) {
  for (int i = 0; i < idx; ++i) choices.remove_prefix(choices.find('|') + 1);
  return choices.substr(0, choices.find('|'));
}

bool parse_int(std::string_view s, std::int64_t &out) {
  if (s.empty()) return false;
  const char *b = s.data(), *e = s.data() + s.size();
  if (*b == '+') ++b;
  auto [p, ec] = std::from_chars(b, e, out);
  return ec == std::errc() && p == e;
}

}  // namespace

std::size_t control_length(std::string_view s, std::size_t i) {
  const auto at = [&](std::size_t k) {
    return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u;
  };
  const unsigned c = at(0);
  if (c < 0x80) return c < 0x20 || c == 0x7f ? 1 : 0;  // ASCII, the common case: one test
  // U+0080..U+009F in UTF-8: C1 controls (CSI is U+009B), which some terminals obey too.
  if (c == 0xC2 && at(1) >= 0x80 && at(1) <= 0x9F) return 2;
  // The Unicode Bidi_Control characters and the two separators: U+202E (right-to-left override)
  // in a name makes the terminal print what follows reversed ("Trojan Source", CVE-2021-42574),
  // so a path or a finding can read as something else. U+061C (D8 9C); U+200E, U+200F,
  // U+2028, U+2029, U+202A..U+202E (E2 80 ..); U+2066..U+2069 (E2 81 A6..A9).
  if (c == 0xD8 && at(1) == 0x9C) return 2;
  if (c == 0xE2 && at(1) == 0x80 &&
      (at(2) == 0x8E || at(2) == 0x8F || (at(2) >= 0xA8 && at(2) <= 0xAE)))
    return 3;
  if (c == 0xE2 && at(1) == 0x81 && at(2) >= 0xA6 && at(2) <= 0xA9) return 3;
  return 0;
}

std::size_t escape_controls_to(std::string_view s, std::size_t max_out, char *out,
                               std::size_t cap, std::size_t &consumed) {
  static const char digits[] = "0123456789abcdef";
  std::size_t n = 0, i = 0;
  while (i < s.size() && n < max_out) {
    const std::size_t len = control_length(s, i);
    if (len == 0) {
      if (n + 1 > cap) break;
      out[n++] = s[i++];
      continue;
    }
    if (n + 4 * len > cap) break;  // a character is escaped whole or not at all
    for (std::size_t k = 0; k < len; ++k, ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      out[n++] = '\\';
      out[n++] = 'x';
      out[n++] = digits[c >> 4];
      out[n++] = digits[c & 15];
    }
  }
  consumed = i;
  return n;
}

std::string escape_controls(std::string_view s, std::size_t max_out, std::size_t &consumed) {
  // Each byte escapes to at most 4; an escape adds at most 12 bytes past max_out (a 3-byte
  // character started below it).
  const std::size_t cap = std::min(s.size() * 4, max_out > s.size() * 4 ? max_out : max_out + 12);
  std::string out(cap, '\0');
  out.resize(escape_controls_to(s, max_out, out.data(), out.size(), consumed));
  return out;
}

std::size_t shown_to(std::string_view s, char *out, std::size_t cap) {
  constexpr std::size_t kMax = 64;
  std::size_t used = 0;
  std::size_t n = escape_controls_to(s.substr(0, kMax), std::string_view::npos, out, cap, used);
  if (s.size() > kMax) {
    char tail[40];
    const int k = std::snprintf(tail, sizeof tail, "... (%zu bytes)", s.size());
    for (int i = 0; i < k && n < cap; ++i) out[n++] = tail[i];
  }
  return n;
}

std::string shown(std::string_view s) {
  char buf[kShownMax];
  return std::string(buf, shown_to(s, buf, sizeof buf));
}

namespace {

// Names longer than this get no "did you mean": typos are short, and the distance is quadratic.
constexpr std::size_t kMaxSuggestLength = 64;

}  // namespace

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two adjacent
// letters (MOED for MODE) each count 1, the typos people make.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev2(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1]))
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::size_t closest_name(std::string_view key, std::span<const std::string_view> names) {
  std::size_t best = std::max<std::size_t>(2, key.size() / 3 + 1), best_i = names.size();
  for (std::size_t i = 0; i < names.size() && key.size() <= kMaxSuggestLength; ++i) {
    const std::size_t d = edit_distance(key, names[i]);
    if (d < best) best = d, best_i = i;
  }
  return best_i;
}

// Typed application of one raw value (outside the anonymous namespace for the macro above).
// " (did you mean 'strict'?)" for a value close to one of the '|'-separated choices, or "": a
// misspelt value is named like a misspelt option name.
std::string choice_hint(std::string_view choices, std::string_view raw) {
  std::vector<std::string_view> names;
  for (std::string_view rest = choices; !rest.empty();) {
    const std::size_t bar = rest.find('|');
    names.push_back(rest.substr(0, bar));
    rest = bar == std::string_view::npos ? std::string_view{} : rest.substr(bar + 1);
  }
  const std::size_t i = closest_name(raw, names);
  return i < names.size() ? " (did you mean '" + std::string(names[i]) + "'?)" : "";
}

namespace detail {
template <typename T>
bool apply_value(OptionKind kind, T &dst, std::string_view raw, std::string_view choices,
                 std::string &why) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!parse_bool(raw, dst)) {
      why = "expected 1/true/yes/on or 0/false/no/off";
      return false;
    }
    return true;
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    if (!parse_int(raw, dst)) {
      why = "not a whole number";
      return false;
    }
    return true;
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {
    if (choices == "auto" && iequals(raw, "auto")) {
      dst = kAutoSize;
      return true;
    }
    if (!parse_size(raw, dst) || (choices == "auto" && dst == kAutoSize)) {
      why = choices == "auto" ? "not a size (a number of bytes, optionally with K, M, G or T) "
                                "nor auto"
                              : "not a size (a number of bytes, optionally with K, M, G or T)";
      return false;
    }
    return true;
  } else if constexpr (std::is_same_v<T, std::string>) {
    dst.assign(raw);
    return true;
  } else {
    int idx = choice_index(choices, raw);
    if (idx < 0) {
      why = "expected one of ";
      why.append(choices);
      why += choice_hint(choices, raw);
      return false;
    }
    dst = static_cast<T>(idx);
    return true;
  }
  (void)kind;
}
}  // namespace detail

namespace {

bool apply_row(Options &o, std::size_t row, std::string_view raw, std::string &why) {
  std::size_t i = 0;
#define CMG_OPTION(field, name, kind, type, def, debug_def, choices, help, ...) \
  if (i++ == row) return detail::apply_value(OptionKind::kind, o.field, raw, choices, why);
#include "options.def"
#undef CMG_OPTION
  std::size_t c = row - kTableRows;
  if (c < kFindingClassCount) {
    int idx = choice_index(kActionChoices, raw);
    if (idx < 0) {
      why = "expected one of default|skip|forward|abort" + choice_hint(kActionChoices, raw);
      return false;
    }
    o.action[c] = static_cast<ActionOverride>(idx);
    return true;
  }
  return false;
}

// Range checks that the table's types cannot express.
bool validate(const Options &o, std::size_t row, std::string &why) {
  std::string_view n = specs()[row].name;
  if (n == "STACKS" && (o.stacks < 0 || o.stacks > 64)) {
    why = "must be between 0 and 64";
    return false;
  }
  if (n == "WARN_FRAMES" && (o.warn_frames < 0 || o.warn_frames > 64)) {
    why = "must be between 0 and 64";
    return false;
  }
  if (n == "STACK_SAMPLE" && o.stack_sample < 1) {
    why = "must be at least 1";
    return false;
  }
  if (n == "WARN_LIMIT" && o.warn_limit < 0) {
    why = "must not be negative";
    return false;
  }
  if (row >= kTableRows) {
    // An action the class cannot take would be accepted and do nothing (a leak is found at exit,
    // nothing is left to abort or skip): refused, with what the class does take.
    const FindingInfo &f = finding_info(static_cast<FindingClass>(row - kTableRows));
    const ActionOverride a = o.action[row - kTableRows];
    if (a != ActionOverride::Default &&
        choice_index(f.accepts, choice_at(kActionChoices, static_cast<int>(a))) < 0) {
      why = "";
      why.append(choice_at(kActionChoices, static_cast<int>(a)));
      why += " cannot apply to ";
      why.append(f.id);
      why += " findings (";
      why += f.cls == FindingClass::Leak     ? "they are found at exit"
             : f.cls == FindingClass::Config ? "CUMEMGUARD_STRICT_CONFIG makes them fatal"
             : f.cls == FindingClass::UnseenReissue
                 ? "the driver holds the memory live: the call is the program's legitimate one"
             : a == ActionOverride::Skip     ? "the shim cannot prove the call redundant"
                                             : "nothing is left to do it to";
      why += "); it takes default|";
      why.append(f.accepts);
      return false;
    }
  }
  return true;
}

template <typename T>
std::string to_text(const T &v, std::string_view choices) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "1" : "0";
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {
    if (choices == "auto" && v == kAutoSize) return "auto";
    // Sizes print as they are written (options.def's defaults, the README): "4G" rather than
    // 4294967296, with the largest suffix that is exact, so the text parses back to the value.
    static constexpr std::pair<unsigned, char> kSuffixes[] = {{40, 'T'}, {30, 'G'}, {20, 'M'}, {10, 'K'}};
    for (const auto &[shift, suffix] : kSuffixes)
      if (v != 0 && v % (std::uint64_t{1} << shift) == 0)
        return std::to_string(v >> shift) + suffix;
    return std::to_string(v);
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    return std::to_string(v);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v;
  } else {
    return std::string(choice_at(choices, static_cast<int>(v)));
  }
}

std::string printable(const Options &o, std::size_t row) {
  std::size_t i = 0;
#define CMG_OPTION(field, name, kind, type, def, debug_def, choices, help, ...) \
  if (i++ == row) return to_text(o.field, choices);
#include "options.def"
#undef CMG_OPTION
  std::size_t c = row - kTableRows;
  return std::string(choice_at(kActionChoices, static_cast<int>(o.action[c])));
}

}  // namespace

Action Options::action_for(FindingClass c) const {
  // Neither is a call the program got wrong: a leak is found at exit, and an unseen re-issue is a
  // legitimate free the shim could not see being allocated (strict mode must not abort for it).
  if (c == FindingClass::Leak || c == FindingClass::UnseenReissue) return Action::Forward;
  switch (action[static_cast<std::size_t>(c)]) {
    case ActionOverride::Skip: return Action::Skip;
    case ActionOverride::Forward: return Action::Forward;
    case ActionOverride::Abort: return Action::Abort;
    case ActionOverride::Default: break;
  }
  const Action def = finding_info(c).guard_action;
  switch (mode) {
    case Mode::Guard: return def;
    case Mode::Report: return def == Action::Defer ? Action::Defer : Action::Forward;
    case Mode::Strict:
      if (c == FindingClass::Config && !strict_config) return Action::Forward;
      return Action::Abort;
  }
  return Action::Forward;
}

std::span<const OptionSpec> option_specs() { return specs(); }

std::string_view option_kind_name(OptionKind k) {
  switch (k) {
    case OptionKind::Bool: return "bool";
    case OptionKind::Int: return "int";
    case OptionKind::Size: return "size";
    case OptionKind::String: return "string";
    case OptionKind::Enum: return "enum";
  }
  return "?";
}

bool parse_bool(std::string_view s, bool &out) {
  for (std::string_view t : {"1", "true", "yes", "on"})
    if (iequals(s, t)) return out = true, true;
  for (std::string_view f : {"0", "false", "no", "off"})
    if (iequals(s, f)) return out = false, true;
  return false;
}

bool parse_size(std::string_view s, std::uint64_t &out) {
  if (s.empty()) return false;
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p == s.data()) return false;
  std::string_view suf = s.substr(static_cast<std::size_t>(p - s.data()));
  unsigned shift = 0;
  if (!suf.empty()) {
    switch (lower(suf[0])) {
      case 'k': shift = 10; break;
      case 'm': shift = 20; break;
      case 'g': shift = 30; break;
      case 't': shift = 40; break;
      case 'b':
        if (suf.size() == 1) return out = v, true;
        return false;
      default: return false;
    }
    suf.remove_prefix(1);
    if (!(suf.empty() || iequals(suf, "b") || iequals(suf, "ib"))) return false;
  }
  if (shift && v > (UINT64_MAX >> shift)) return false;
  out = v << shift;
  return true;
}

namespace {

// One kind of problem: the first kMaxProblemsPerKind lines, then one line with the rest's count.
class Capped {
 public:
  Capped(ParsedOptions &r, ProblemKind kind, const char *rest) : r_(r), kind_(kind), rest_(rest) {}
  void add(std::string msg) {
    if (++n_ <= kMaxProblemsPerKind) push(std::move(msg));
  }
  // Whether the next problem is still printed: its message is built only then (a suggestion costs
  // an edit distance per option name; 20,000 unknown names must not cost 20,000 of them).
  bool room() const { return n_ < kMaxProblemsPerKind; }
  void count() { ++n_; }
  void finish() {
    if (n_ > kMaxProblemsPerKind)
      push("and " + std::to_string(n_ - kMaxProblemsPerKind) + " more " + rest_);
  }

 private:
  void push(std::string msg) {
    r_.problems.push_back(std::move(msg));
    r_.problem_kinds.push_back(kind_);
  }
  ParsedOptions &r_;
  ProblemKind kind_;
  const char *rest_;
  std::size_t n_ = 0;
};

// The row of a name (without the prefix; `exact` false: any case, as CUMEMGUARD_OPTIONS takes it).
std::size_t row_of(std::string_view key, bool exact) {
  for (std::size_t i = 0; i < specs().size(); ++i)
    if (exact ? specs()[i].name == key : iequals(specs()[i].name, key)) return i;
  return specs().size();
}

}  // namespace

std::string misspelt_prefix_meant(std::string_view name) {
  constexpr std::string_view kWord = kOptionPrefix.substr(0, kOptionPrefix.size() - 1);
  const std::size_t us = name.find('_');
  // A word of 8 to 12 letters: at most two edits from the prefix's 10.
  if (us == std::string_view::npos || us + 2 < kWord.size() || us > kWord.size() + 2) return {};
  const std::string_view word = name.substr(0, us), rest = name.substr(us + 1);
  if (word == kWord || has_option_prefix(name)) return {};
  std::string up;
  for (char c : rest) up += c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c;
  if (up != kOptionsVariable.substr(kOptionPrefix.size()) && row_of(up, true) == specs().size())
    return {};
  const std::size_t d = edit_distance(word, kWord);
  if (d == 0 || d > 2) return {};
  return std::string(kOptionPrefix) + up;
}

namespace {

std::string unknown_message(std::string_view shown_as, std::string_view key, bool upper) {
  std::string msg = "unknown option ";
  msg += shown(shown_as);
  std::vector<std::string_view> names;
  names.reserve(specs().size());
  for (const auto &spec : specs()) names.push_back(spec.name);
  const std::size_t best_row = closest_name(key, names);
  if (best_row < specs().size()) {
    msg += " (did you mean ";
    if (upper) {
      msg += "CUMEMGUARD_";
      msg.append(specs()[best_row].name);
    } else {
      for (char c : specs()[best_row].name) msg += lower(c);
    }
    msg += "?)";
  }
  msg += "; ignored";
  return msg;
}

// CUMEMGUARD_OPTIONS split into NAME=VALUE entries: ':' separates, '...' or "..." quote a value
// that holds one (the quotes are dropped), empty entries are skipped. A quote that is never
// closed is taken as a plain character (the entry ends at the next ':' as usual) and flagged: it
// used to swallow every entry after it without a word.
struct OptionsEntry {
  std::string name, value;
  bool has_value;
  bool unclosed_quote = false;
};

std::vector<OptionsEntry> split_options(std::string_view s) {
  std::vector<OptionsEntry> out;
  std::size_t i = 0;
  while (i < s.size()) {
    OptionsEntry e{{}, {}, false};
    std::string *cur = &e.name;
    while (i < s.size() && s[i] != ':') {
      const char c = s[i];
      if (cur == &e.name && c == '=') {
        e.has_value = true;
        cur = &e.value;
        ++i;
      } else if (cur == &e.value && (c == '\'' || c == '"') &&
                 s.find(c, i + 1) != std::string_view::npos) {
        const std::size_t close = s.find(c, i + 1);
        cur->append(s.substr(i + 1, close - i - 1));
        i = close + 1;
      } else if (cur == &e.value && (c == '\'' || c == '"')) {
        e.unclosed_quote = true;
        *cur += c;
        ++i;
      } else {
        *cur += c;
        ++i;
      }
    }
    if (i < s.size()) ++i;  // the ':'
    if (!e.name.empty() || e.has_value) out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

std::string_view option_source_name(OptionSource s) {
  switch (s) {
    case OptionSource::Default: return "default";
    case OptionSource::Profile: return "profile";
    case OptionSource::Options: return "options";
    case OptionSource::Environment: return "environment";
  }
  return "?";
}

ParsedOptions parse_options(std::span<const std::pair<std::string_view, std::string_view>> env) {
  ParsedOptions r;
  const std::size_t rows = specs().size();
  Capped unknown(r, ProblemKind::Unknown, "unknown CUMEMGUARD_* names; ignored");
  Capped bad(r, ProblemKind::BadValue, "invalid CUMEMGUARD_* values; defaults kept");
  Capped repeated(r, ProblemKind::Repeated,
                  "names set more than once; the first entry of each is used");
  Capped malformed(r, ProblemKind::Malformed, "malformed CUMEMGUARD_OPTIONS entries; ignored");

  // 1. The variables, first entry of a name winning as getenv() has it; each repeat counted.
  struct Set {
    std::size_t row;
    std::string value;
    OptionSource source;
    std::string label;  // how a problem names it
  };
  std::vector<Set> vars;
  // Each name once, in the order of its first entry, with that entry's value and its count
  // (hashed: a hostile environment of many entries costs linear time).
  struct Seen {
    std::string_view first;
    std::size_t times;
  };
  std::unordered_map<std::string_view, Seen> seen;
  std::vector<std::string_view> order_seen;
  std::optional<std::string_view> options_var;
  for (const auto &[name, value] : env) {
    if (!has_option_prefix(name)) {
      if (const std::string meant = misspelt_prefix_meant(name); !meant.empty()) {
        if (unknown.room())
          unknown.add("unknown option " + shown(name) + " (did you mean " + meant + "?); ignored");
        else
          unknown.count();
      }
      continue;
    }
    auto [it, fresh] = seen.try_emplace(name, Seen{value, 0});
    if (++it->second.times > 1) continue;
    order_seen.push_back(name);
    if (name == kOptionsVariable) {
      options_var = value;
      continue;
    }
    // Names are exact, prefix included: cumemguard_stacks is a misspelt CUMEMGUARD_STACKS (it
    // used to pass without a word, neither read nor reported).
    const bool exact_prefix = name.substr(0, kOptionPrefix.size()) == kOptionPrefix;
    const std::string_view key = name.substr(kOptionPrefix.size());
    const std::size_t row = exact_prefix ? row_of(key, true) : rows;
    if (row == rows) {
      if (unknown.room())
        unknown.add(unknown_message(name, key, true));
      else
        unknown.count();
      continue;
    }
    vars.push_back(Set{row, std::string(value), OptionSource::Environment,
                       "CUMEMGUARD_" + std::string(specs()[row].name)});
  }
  for (std::string_view name : order_seen) {
    const Seen &e = seen[name];
    if (e.times < 2) continue;
    if (!repeated.room()) {
      repeated.count();
      continue;
    }
    repeated.add(std::string(shown(name)) + " is set " + std::to_string(e.times) +
                 " times in the environment; the first ('" + shown(e.first) +
                 "') is used, as getenv() does");
  }

  // 2. CUMEMGUARD_OPTIONS: a later entry of a name replaces an earlier one.
  std::vector<Set> entries;
  std::vector<std::size_t> entry_at(rows, SIZE_MAX);  // index in entries of each row's entry
  if (options_var) {
    r.has_options_variable = true;
    r.options_variable.assign(*options_var);
    for (OptionsEntry &e : split_options(*options_var)) {
      if (e.unclosed_quote) {
        if (malformed.room())
          malformed.add("CUMEMGUARD_OPTIONS: the quote in '" + shown(e.name + "=" + e.value) +
                        "' is not closed; taken as a plain character, the entry ends at the "
                        "next ':'");
        else
          malformed.count();
      }
      std::string_view key = e.name;
      if (key.size() > kOptionPrefix.size() && iequals(key.substr(0, kOptionPrefix.size()), kOptionPrefix))
        key.remove_prefix(kOptionPrefix.size());
      if (!e.has_value || key.empty()) {
        if (malformed.room())
          malformed.add("CUMEMGUARD_OPTIONS: '" + shown(e.name + (e.has_value ? "=" + e.value : "")) +
                        "' is not NAME=VALUE; ignored");
        else
          malformed.count();
        continue;
      }
      const std::size_t row = row_of(key, false);
      if (row == rows) {
        if (unknown.room())
          unknown.add("CUMEMGUARD_OPTIONS: " + unknown_message(e.name, key, false));
        else
          unknown.count();
        continue;
      }
      // One entry per row, the later replacing the earlier in place (linear in the entries).
      if (entry_at[row] != SIZE_MAX) entries[entry_at[row]].row = rows;
      entry_at[row] = entries.size();
      std::string label = "CUMEMGUARD_OPTIONS entry ";
      for (char c : specs()[row].name) label += lower(c);
      entries.push_back(Set{row, std::move(e.value), OptionSource::Options, std::move(label)});
    }
  }

  // 3. The profile first: it chooses the defaults every other row starts from.
  const std::size_t profile_row = row_of("PROFILE", true);
  std::vector<const Set *> order;  // rows set explicitly, the variables last so that they win
  for (const Set &e : entries)
    if (e.row < rows) order.push_back(&e);
  for (const Set &v : vars) order.push_back(&v);
  // The last valid one wins, as for every row; invalid ones are reported with the other values.
  auto valid_profile = [&](const Set *x) {
    Options trial;
    std::string why;
    return apply_row(trial, profile_row, x->value, why);
  };
  const Set *profile_set = nullptr;
  for (const Set *x : order)
    if (x->row == profile_row && valid_profile(x)) profile_set = x;
  std::string why0;
  if (profile_set) apply_row(r.options, profile_row, profile_set->value, why0);
  const bool debug = r.options.profile == Profile::Debug;
  r.profile_source = profile_set ? profile_set->source : OptionSource::Default;

  // 4. Defaults of that profile, from the table's own strings (the table is the only place they
  // live), then the explicit values: entries of CUMEMGUARD_OPTIONS, then the variables.
  std::vector<OptionSource> source(rows, OptionSource::Default);
  for (std::size_t row = 0; row < rows; ++row) {
    if (row == profile_row) continue;
    const OptionSpec &sp = specs()[row];
    std::string why;
    apply_row(r.options, row, debug ? sp.debug_value : sp.default_value, why);
    if (debug && sp.debug_value != sp.default_value) source[row] = OptionSource::Profile;
  }
  std::vector<std::string> raw(rows);
  std::vector<bool> rejected(rows, false);
  for (const Set *x : order) {
    const std::size_t row = x->row;
    if (row == profile_row && x == profile_set) {
      source[row] = x->source;
      raw[row] = x->value;
      continue;
    }
    if (row == profile_row && valid_profile(x)) continue;  // a valid one set later won
    Options trial = r.options;
    std::string why;
    if (!apply_row(trial, row, x->value, why) || !validate(trial, row, why)) {
      std::string msg = x->label;
      msg += ": '";
      msg += shown(x->value);
      msg += "' ";
      msg += why.empty() ? std::string("is not valid") : "is not valid: " + why;
      msg += "; keeping ";
      msg += printable(r.options, row).empty() ? std::string("the default")
                                                : "'" + shown(printable(r.options, row)) + "'";
      bad.add(std::move(msg));
      rejected[row] = true;
      // The value refused, for `cumemguard config` to show, unless a valid one was set before.
      if (source[row] == OptionSource::Default || source[row] == OptionSource::Profile)
        raw[row] = x->value;
      continue;
    }
    r.options = std::move(trial);
    raw[row] = x->value;
    source[row] = x->source;
    rejected[row] = false;
  }
  unknown.finish();
  bad.finish();
  repeated.finish();
  malformed.finish();
  for (std::size_t row = 0; row < rows; ++row)
    r.values.push_back(OptionValue{&specs()[row], source[row], raw[row], printable(r.options, row),
                                   rejected[row] && (source[row] == OptionSource::Default ||
                                                     source[row] == OptionSource::Profile)});
  r.fatal = r.options.strict_config && !r.problems.empty();
  // Strict config aborts at these lines: none of them may say what the run would have done.
  if (r.fatal)
    for (std::string &msg : r.problems) msg = problem_without_fallback(msg);
  return r;
}

std::string problem_without_fallback(std::string_view problem) {
  std::string s(problem);
  // A bad value: the kept value is the last part (rfind: the refused value comes before it).
  if (const std::size_t at = s.rfind("; keeping "); at != std::string::npos) return s.substr(0, at);
  for (std::string_view tail :
       {"; ignored", "; defaults kept", "; the first entry of each is used"})
    if (s.ends_with(tail)) return s.substr(0, s.size() - tail.size());
  // A repeated name: the used entry's value follows (find: the name comes before it).
  constexpr std::string_view used = " in the environment; the first ('";
  if (const std::size_t at = s.find(used); at != std::string::npos)
    return s.substr(0, at + std::string_view(" in the environment").size());
  return s;
}

ParsedOptions parse_options(char *const *envp) {
  std::vector<std::pair<std::string_view, std::string_view>> env;
  for (char *const *e = envp; e && *e; ++e) {
    std::string_view kv(*e);
    const std::size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    if (!has_option_prefix(kv) && misspelt_prefix_meant(kv.substr(0, eq)).empty()) continue;
    env.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return parse_options(env);
}

}  // namespace cmg
