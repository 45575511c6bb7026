// SPDX-License-Identifier: Apache-2.0
// The finding-class table built from findings.def.
#include "findings.h"

#include <array>

namespace cmg {
namespace {

// "double-release" -> "ACTION_DOUBLE_RELEASE", computed at compile time so the table holds views.
template <std::size_t N>
struct OptName {
  char buf[N + 7]{};
  constexpr explicit OptName(const char (&id)[N]) {
    const char prefix[] = "ACTION_";
    for (std::size_t i = 0; i < 7; ++i) buf[i] = prefix[i];
    for (std::size_t i = 0; i + 1 < N; ++i) {
      char c = id[i];
      buf[7 + i] = c == '-' ? '_' : (c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c);
    }
  }
  constexpr std::string_view view() const { return std::string_view(buf, N + 6); }
};

#define CMG_FINDING(e, id, act, stands, accepts, help) constexpr OptName kOpt_##e{id};
#include "findings.def"
#undef CMG_FINDING

const std::array<FindingInfo, kFindingClassCount> kTable = {{
#define CMG_FINDING(e, id, act, stands, accepts, help) \
  {FindingClass::e, id, kOpt_##e.view(), Action::act, Stands::stands, accepts, help},
#include "findings.def"
#undef CMG_FINDING
}};

}  // namespace

const FindingInfo &finding_info(FindingClass c) { return kTable[static_cast<std::size_t>(c)]; }

std::string_view finding_id(FindingClass c) { return finding_info(c).id; }

std::optional<FindingClass> finding_from_id(std::string_view id) {
  for (const auto &f : kTable)
    if (f.id == id) return f.cls;
  return std::nullopt;
}

std::string_view action_name(Action a) {
  switch (a) {
    case Action::Forward: return "forward";
    case Action::Skip: return "skip";
    case Action::Defer: return "defer";
    case Action::Abort: return "abort";
  }
  return "?";
}

}  // namespace cmg
