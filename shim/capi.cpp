// SPDX-License-Identifier: Apache-2.0
// The C API of include/cumemguard.h: the cleanup contract on the shim's transport registry,
// the counters a test suite asserts on, and the PyTorch allocator-settings rewrite of the shim's
// own policy (policy/torch_rewrite). It works whether or not the program makes CUDA calls, and
// with CUMEMGUARD_DISABLE (then it writes nothing and only explicit suppression counts, since
// NCCL is no longer intercepted).
#include "cumemguard.h"

#include <cxxabi.h>

#include <string>

#include "cmg_config.h"
#include "flush.h"
#include "handlers_capture.h"
#include "held.h"
#include "loader.h"
#include "resident.h"
#include "state.h"
#include "torch_host.h"
#include "torch_rewrite.h"

extern char **environ;

using namespace cmg::shim;
using cmg::EventRef;

namespace {

// An event for one C API call; seq 0 (nothing logged) when the shim is disabled.
EventRef begin(const char *api) {
  EventRef ev;
  if (disabled()) return ev;
  activate();  // the program talks to the shim: its log exists from here on
  State &s = state();
  if (s.opts.disable) return ev;
  ev.seq = s.seq.fetch_add(1, std::memory_order_relaxed) + 1;
  ev.ts = now_ns();
  ev.tid = thread_id();
  ev.api = api;
  return ev;
}

}  // namespace

// No exception leaves these (shield.h): a failure inside the shim still keeps each one's contract.
CMG_EXPORT void cumemguard_suppress_opportunistic_cleanup(void) {
  bool done = false;
  try {
    const EventRef ev = begin("cumemguard_suppress_opportunistic_cleanup");
    const bool turned_on = state().transport.suppress_external(ev);
    done = true;
    if (ev.seq) capi_suppress_record(ev, turned_on);
  } catch (abi::__forced_unwind &) {
    throw;
  } catch (...) {
    if (done) return;
    try {
      state().transport.suppress_external(EventRef{});
    } catch (abi::__forced_unwind &) {
      throw;
    } catch (...) {
    }
  }
}

CMG_EXPORT int cumemguard_maybe_empty_cache(void (*flush)(void *), void *arg) {
  int ran = -1;  // the flush's fate once decided
  try {
    const EventRef ev = begin("cumemguard_maybe_empty_cache");
    ran = state().transport.run_flush(flush, arg) ? 1 : 0;
    if (ev.seq)
      capi_call_record("cumemguard_maybe_empty_cache", ev, ran, now_ns() - ev.ts, "ran", ran);
    return ran;
  } catch (abi::__forced_unwind &) {
    throw;
  } catch (...) {
    if (ran >= 0) return ran;
  }
  // The bookkeeping failed before the flush was decided: the contract still holds.
  if (state().transport.suppressed()) return 0;
  if (flush) flush(arg);
  return 1;
}

CMG_EXPORT int cumemguard_opportunistic_cleanup_suppressed(void) {
  return state().transport.suppressed() ? 1 : 0;
}

CMG_EXPORT size_t cumemguard_release_deferred(void) {
  std::uint64_t bytes = 0;
  try {
    const EventRef ev = begin("cumemguard_release_deferred");
    // Inside an open stream capture the frees would invalidate it: they wait for its end.
    bytes = capture_open() && !may_release_held("cumemguard_release_deferred")
                ? 0
                : held().release_all(HoldReason::Deferred);
    if (ev.seq)
      capi_call_record("cumemguard_release_deferred", ev, 0, now_ns() - ev.ts, "bytes", bytes);
  } catch (abi::__forced_unwind &) {
    throw;
  } catch (...) {
  }
  return static_cast<size_t>(bytes);
}

CMG_EXPORT const char *cumemguard_version(void) {
  return CMG_VERSION;
}

// Counters only: atomic loads, no lock, no CUDA call (callable from any thread at any time).
CMG_EXPORT size_t cumemguard_stats_json(char *buf, size_t len) {
  try {
    State &s = state();
    std::string j = "{\"version\":\"" CMG_VERSION "\",\"disabled\":";
    j += disabled() || s.opts.disable ? "true" : "false";
    j += ",\"findings\":{";
    bool first = true;
    for (std::size_t i = 0; i < cmg::kFindingClassCount; ++i) {
      const std::uint64_t n = s.findings[i].load(std::memory_order_relaxed);
      if (!n) continue;
      j += std::string(first ? "" : ",") + "\"" +
           std::string(cmg::finding_id(static_cast<cmg::FindingClass>(i))) +
           "\":" + std::to_string(n);
      first = false;
    }
    j += "},\"memory\":[";
    first = true;
    s.counters.visit([&](const cmg::ByteCounters::Row &r) {
      j += std::string(first ? "" : ",") + "{\"device\":" + std::to_string(r.dev) + ",\"kind\":\"" +
           std::string(cmg::mem_kind_name(r.kind)) + "\",\"current\":" + std::to_string(r.current) +
           ",\"peak\":" + std::to_string(r.peak) + ",\"total\":" + std::to_string(r.total) + "}";
      first = false;
    });
    j += "],\"opportunistic_cleanup_suppressed\":";
    j += s.transport.suppressed() ? "true" : "false";
    j += "}";
    return cmg::torchconf::copy_out(j, buf, len);
  } catch (...) {
    return cmg::torchconf::copy_out("{}", buf, len);
  }
}

CMG_EXPORT size_t cumemguard_torch_alloc_conf(const char *base, const char *overrides,
                                              const char *torch_version, char *buf, size_t len) {
  namespace tc = cmg::torchconf;
  try {
    tc::RewriteRequest q = tc::request_from_c(base, overrides, torch_version);
    // Not named: the release of the libtorch this process loaded.
    if (!(torch_version && *torch_version)) {
      if (auto found = torch_loaded_version()) {
        q.version = found->version;
        q.version_source = found->source;
      }
    }
    return tc::copy_out(tc::rewrite_json(tc::rewrite(tc::Env::from_envp(environ), q)), buf, len);
  } catch (...) {
    return tc::copy_out("{\"error\":\"internal error\"}", buf, len);
  }
}

CMG_EXPORT size_t cumemguard_snapshot(const char *label) {
  if (disabled()) return 0;
  activate();  // the program talks to the shim: its log exists from here on
  try {
    return static_cast<size_t>(snapshot_requested(label ? label : "", SnapshotTrigger::Api));
  } catch (...) {
    return 0;  // never across the C ABI (an allocation failed)
  }
}

CMG_EXPORT int cumemguard_torch_settings_applied(const char *conf) {
  if (disabled()) return -1;
  return torch_settings_applied(conf);
}
