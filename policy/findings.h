// SPDX-License-Identifier: Apache-2.0
// Finding classes and actions: the vocabulary shared by the policy, the shim, the log and the tools.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace cmg {

enum class Action : unsigned char { Forward, Skip, Defer, Abort };

// When a finding stands (findings.def): always, or only when the driver refuses the call.
enum class Stands : unsigned char { Always, IfRefused };

enum class FindingClass : unsigned char {
#define CMG_FINDING(e, id, act, stands, accepts, help) e,
#include "findings.def"
#undef CMG_FINDING
};

inline constexpr std::size_t kFindingClassCount = 0
#define CMG_FINDING(e, id, act, stands, accepts, help) +1
#include "findings.def"
#undef CMG_FINDING
    ;

struct FindingInfo {
  FindingClass cls;
  std::string_view id;      // "double-release"
  std::string_view option;  // "ACTION_DOUBLE_RELEASE"
  Action guard_action;      // what guard mode does by default
  Stands stands;            // IfRefused: dropped when the driver accepts the call
  std::string_view accepts;  // "skip|forward|abort": what CUMEMGUARD_ACTION_<CLASS> may ask for
  std::string_view help;
};

const FindingInfo &finding_info(FindingClass c);
std::string_view finding_id(FindingClass c);
std::optional<FindingClass> finding_from_id(std::string_view id);
std::string_view action_name(Action a);

}  // namespace cmg
