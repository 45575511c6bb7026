// SPDX-License-Identifier: Apache-2.0
// Findings about what NCCL holds, phrased from the model (see nccl_holds.h): the message, the
// earlier events that make the call a finding, and a state object for the log.
#include "nccl_holds.h"
#include "text.h"
#include "units.h"

namespace cmg::nccl_findings {
namespace {

std::string hold_json(const Hold &h) {
  std::string o = "{\"kind\":\"" + std::string(hold_kind_name(h.kind)) + "\"";
  if (h.kind == HoldKind::Registration || h.kind == HoldKind::Window)
    o += ",\"comm\":\"" + hex(h.owner) + "\"";
  else
    o += ",\"multicast\":\"" + hex(h.owner) + "\",\"mc_offset\":" + std::to_string(h.mc_offset) +
         ",\"dev\":" + std::to_string(h.dev);
  o += ",\"handle\":\"" + hex(h.handle) + "\",\"va\":\"" + hex(h.va) +
       "\",\"size\":" + std::to_string(h.size) + "}";
  return o;
}

std::string ranges_json(const std::vector<SleepingRange> &ranges) {
  std::string o = "[";
  for (const SleepingRange &r : ranges)
    o += (o.size() > 1 ? "," : "") + std::string("{\"va\":\"") + hex(r.va) +
         "\",\"size\":" + std::to_string(r.size) + "}";
  return o + "]";
}

}  // namespace

Finding freed_while_held(const std::string &what, const Hold &h) {
  Finding f;
  switch (h.kind) {
    case HoldKind::Registration:
      f.cls = FindingClass::FreeRegistered;
      f.msg = what + " while NCCL still has it registered: ncclCommRegister of " +
              range_text(h.va, h.size) + " with communicator " + hex(h.owner) + " at " +
              at_seq(h.made) + " returned handle " + hex(h.handle) +
              "; NCCL may still read or write it. Deregister it first (ncclCommDeregister)";
      f.related.push_back({"registration", h.made});
      break;
    case HoldKind::Window:
      f.cls = FindingClass::FreeRegistered;
      f.msg = what + " while it is in window " + hex(h.handle) + " of communicator " +
              hex(h.owner) + " (ncclCommWindowRegister of " + range_text(h.va, h.size) + " at " +
              at_seq(h.made) +
              "); NCCL keeps the memory mapped in its own range and peers still write into it. "
              "Deregister the window first (ncclCommWindowDeregister)";
      f.related.push_back({"window registration", h.made});
      break;
    case HoldKind::BindMem:
    case HoldKind::BindAddr:
      f.cls = FindingClass::FreeBound;
      f.msg = what + " while it is bound to multicast object " + hex(h.owner) + " at offset " +
              std::to_string(h.mc_offset) + " for device " + std::to_string(h.dev) + " (" +
              (h.kind == HoldKind::BindMem ? "cuMulticastBindMem" : "cuMulticastBindAddr") +
              " at " + at_seq(h.made) + ", " + human_bytes(h.size) +
              "); multicast writes still reach it. Unbind it first (cuMulticastUnbind)";
      f.related.push_back({"multicast binding", h.made});
      break;
  }
  f.bytes = h.size;
  f.state_json = "{\"holds\":" + hold_json(h) + "}";
  return f;
}

Finding ended_again(const char *api, std::uint64_t comm, const EventRef &end) {
  Finding f;
  f.cls = FindingClass::CommEnded;
  f.msg = std::string(api) + " of communicator " + hex(comm) + ", which already ended at " +
          at_seq(end) + "; NCCL would read the communicator's freed memory";
  f.related.push_back({"end of the communicator", end});
  f.state_json = "{\"comm\":\"" + hex(comm) + "\"}";
  return f;
}

Finding suspended_again(std::uint64_t comm, const EventRef &since) {
  Finding f;
  f.cls = FindingClass::CommSuspend;
  f.msg = "ncclCommSuspend(NCCL_SUSPEND_MEM) of communicator " + hex(comm) + ", suspended since " +
          at_seq(since) +
          ": NCCL refuses a second suspend (ncclInvalidUsage, 2.29.7 src/mem_manager.cc)";
  f.related.push_back({"suspend", since});
  f.state_json = "{\"comm\":\"" + hex(comm) + "\",\"state\":\"suspended\"}";
  return f;
}

Finding resume_running(std::uint64_t comm, bool known) {
  Finding f;
  f.cls = FindingClass::CommSuspend;
  f.msg = "ncclCommResume of communicator " + hex(comm) +
          (known ? ", which is not suspended" : ", which the shim never saw created") +
          ": NCCL refuses to resume a running communicator (ncclInvalidUsage, 2.29.7 "
          "src/mem_manager.cc)";
  f.state_json = "{\"comm\":\"" + hex(comm) + "\",\"state\":\"running\"}";
  return f;
}

Finding teardown_suspended(const char *api, std::uint64_t comm, const EventRef &since,
                           const std::vector<SleepingRange> &ranges, int res) {
  Finding f;
  f.cls = FindingClass::CommSuspend;
  std::uint64_t bytes = 0;
  for (const SleepingRange &r : ranges) bytes += r.size;
  f.msg = std::string(api) + " of communicator " + hex(comm) + ", suspended since " +
          at_seq(since) + " with " + std::to_string(ranges.size()) +
          (ranges.size() == 1 ? " range" : " ranges") + " (" + human_bytes(bytes) +
          ") unmapped, failed with " + std::to_string(res) +
          ": NCCL 2.29.7 frees its buffers with ncclCuMemFree, whose "
          "cuMemRetainAllocationHandle fails on an unmapped address. Resume it first "
          "(ncclCommResume); the communicator is still suspended";
  f.related.push_back({"suspend", since});
  f.bytes = bytes;
  f.state_json = "{\"comm\":\"" + hex(comm) +
                 "\",\"state\":\"suspended\",\"sleeping\":" + ranges_json(ranges) + "}";
  return f;
}

Finding imports_after_end(const char *api, std::uint64_t comm,
                          const std::vector<PeerImport> &imports, std::uint64_t bytes) {
  Finding f;
  f.cls = FindingClass::CommImportMapped;
  f.msg = std::to_string(imports.size()) + (imports.size() == 1 ? " import" : " imports") +
          " of peer memory (" + human_bytes(bytes) + ") that NCCL mapped while communicator " +
          hex(comm) + " was live " + (imports.size() == 1 ? "is" : "are") + " still mapped after " +
          api +
          ": each communicator lifetime keeps them until the process exits (NCCL's abort "
          "leaves the NET proxy's shared buffers mapped, NVIDIA/nccl#1968)";
  std::string handles = "[";
  for (std::size_t i = 0; i < imports.size(); ++i) {
    if (i < 4) f.related.push_back({"import", imports[i].imported});
    handles += (i ? ",\"" : "\"") + hex(imports[i].handle) + "\"";
  }
  f.bytes = bytes;
  f.state_json = "{\"comm\":\"" + hex(comm) + "\",\"imports\":" + handles + "]}";
  return f;
}

}  // namespace cmg::nccl_findings
