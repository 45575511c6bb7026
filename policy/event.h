// SPDX-License-Identifier: Apache-2.0
// Small value types shared by the model, the decisions and the shim: references to earlier events,
// memory kinds, and the finding record the policy hands to the shim to report.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "findings.h"

namespace cmg {

// A reference to an event the log already has (or will have): enough to name it in a finding.
struct EventRef {
  std::uint64_t seq = 0;       // 0 = unknown
  std::uint64_t ts = 0;        // ns since the log started
  std::uint32_t tid = 0;
  std::uint32_t stack = 0;     // stack id, 0 = none
  const char *api = nullptr;   // static string: the API the program called
  bool known() const { return seq != 0; }
};

// What kind of memory an allocation or a call concerns (log field `mem`).
// Graph: memory of CUDA graphs (allocations made while a capture was open on the thread, such as
// PyTorch's graph private pools, and graph allocations while live).
enum class MemKind : std::uint8_t { Linear, Async, Managed, Host, Vmm, Va, Ipc, Graph };
inline constexpr int kMemKinds = 8;
constexpr std::string_view mem_kind_name(MemKind k) {
  switch (k) {
    case MemKind::Linear: return "linear";
    case MemKind::Async: return "async";
    case MemKind::Managed: return "managed";
    case MemKind::Host: return "host";
    case MemKind::Vmm: return "vmm";
    case MemKind::Va: return "va";
    case MemKind::Ipc: return "ipc";
    case MemKind::Graph: return "graph";
  }
  return "?";
}

// Physical allocation location (CUmemLocationType reduced to what the model needs).
enum class Location : std::uint8_t { Device, Host, HostNuma, Other };

struct Related {
  std::string what;  // "first release", "sleep-time unmap", "current mapping", "allocation"
  EventRef ev;
};

// A finding as decided by the policy; the shim stamps seq/ts/tid/stack and writes it.
struct Finding {
  FindingClass cls{};
  std::string msg;                // one line, no trailing newline
  std::vector<Related> related;
  std::string state_json;         // a JSON object text with class-specific context, or empty
  std::uint64_t bytes = 0;
  std::uint64_t blocked_ns = 0;
};

}  // namespace cmg
