// SPDX-License-Identifier: Apache-2.0
// The VMM model's findings, phrased from what the model holds: the message, the earlier events that
// make the call a finding, and a state object for the log.
#include <algorithm>

#include "text.h"
#include "units.h"
#include "vmm_model.h"

namespace cmg::vmm_findings {

std::string describe_range(const Reservation &r, std::uint64_t off, std::uint64_t size) {
  std::string out = "[";
  std::uint64_t cur = off;
  const std::uint64_t end = off + size;
  auto piece = [&](std::uint64_t a, std::uint64_t b, const Mapping *m) {
    if (out.size() > 1) out += ",";
    out += "{\"offset\":" + std::to_string(a) + ",\"size\":" + std::to_string(b - a) +
           ",\"mapped\":" + (m ? "true" : "false");
    if (m) out += ",\"handle\":\"" + hex(m->handle) + "\"";
    out += "}";
  };
  auto it = r.maps.upper_bound(off);
  if (it != r.maps.begin()) --it;
  for (; it != r.maps.end() && it->second.off < end; ++it) {
    const Mapping &m = it->second;
    if (m.off + m.size <= cur) continue;
    if (m.off > cur) piece(cur, m.off, nullptr);
    piece(std::max(cur, m.off), std::min(end, m.off + m.size), &m);
    cur = std::min(end, m.off + m.size);
  }
  if (cur < end) piece(cur, end, nullptr);
  return out + "]";
}

Finding map_over_mapped(std::uint64_t va, std::uint64_t size, std::uint64_t handle,
                        const Reservation &r, const Mapping &m) {
  Finding f;
  f.cls = FindingClass::MapOverMapped;
  f.msg = "cuMemMap of handle " + hex(handle) + " onto " + range_text(va, size) + ", but " +
          hex(r.base + m.off) + " is already mapped to handle " + hex(m.handle) + " (mapped at " +
          at_seq(m.mapped) + "); the driver refuses the map and handle " + hex(handle) +
          " leaks unless it is released";
  f.related.push_back({"current mapping", m.mapped});
  f.state_json = "{\"reservation\":\"" + hex(r.base) + "\",\"current_handle\":\"" + hex(m.handle) +
                 "\",\"new_handle\":\"" + hex(handle) + "\",\"range\":" +
                 describe_range(r, va - r.base, size) + "}";
  return f;
}

Finding unmap_unmapped(std::uint64_t va, std::uint64_t size, const VmmTicket::Noop &r,
                       const ThreadVmmState &ts) {
  Finding f;
  f.cls = FindingClass::UnmapUnmapped;
  std::string last;
  for (unsigned i = 0; i < ts.nlast; ++i) {
    f.related.push_back({"earlier unmap (put to sleep)", ts.last[i].unmapped});
    if (!last.empty()) last += ",";
    last += "\"" + hex(ts.last[i].handle) + "\"";
  }
  const bool is_asleep = ts.nlast > 0;
  const char *state = is_asleep ? "asleep" : (r.ever_mapped ? "unmapped" : "reserved, never mapped");
  f.msg = "cuMemUnmap of " + range_text(va, size) + " where nothing is mapped: " +
          (is_asleep ? "the range was already unmapped at " + at_seq(f.related.front().ev) +
                           " and is asleep"
                     : std::string(r.ever_mapped ? "the range is reserved and not mapped now"
                                                 : "the range is reserved and was never mapped")) +
          "; the driver would return SUCCESS and do nothing";
  f.related.push_back({"reservation", r.reserved});
  // The first eight sleeping ranges are named; `more_asleep` says there were others.
  f.state_json = "{\"reservation\":\"" + hex(r.res_base) + "\",\"size\":" +
                 std::to_string(r.res_size) + ",\"state\":\"" + state + "\",\"last_handles\":[" +
                 last + "]" + (ts.more ? ",\"more_asleep\":true" : "") + "}";
  return f;
}

Finding partial_unmap(std::uint64_t va, std::uint64_t size, const Reservation &r,
                      const std::vector<const Mapping *> &hit) {
  Finding f;
  f.cls = FindingClass::PartialUnmap;
  f.msg = "cuMemUnmap of " + range_text(va, size) +
          " covers only part of what is mapped there, or cuts a mapping; the driver unmaps only "
          "whole mapped ranges and refuses this call";
  const std::uint64_t off = va - r.base;
  std::uint64_t lo = off, hi = off + size;
  for (const Mapping *m : hit) {
    f.related.push_back({"mapping", m->mapped});
    lo = std::min(lo, m->off);
    hi = std::max(hi, m->off + m->size);
  }
  f.state_json = "{\"reservation\":\"" + hex(r.base) + "\",\"range\":" +
                 describe_range(r, lo, hi - lo) + "}";
  return f;
}

Finding release_unknown(std::uint64_t handle) {
  Finding f;
  f.cls = FindingClass::ReleaseUnknown;
  f.msg = "cuMemRelease of handle " + hex(handle) +
          (handle == 0 ? ", which is never a valid handle"
                       : ", which this process never created, retained or imported");
  return f;
}

Finding stale_release_paired(std::uint64_t handle, const ThreadVmmState &pair,
                             const ThreadVmmState::Last &l, const HandleRec &h) {
  Finding f;
  f.cls = FindingClass::StaleRelease;
  f.msg = "cuMemRelease of handle " + hex(handle) + " right after a no-op unmap of " +
          range_text(pair.base, pair.size) + ": that range's last handle had this value and was " +
          "released when the range was put to sleep (" + at_seq(l.unmapped) + "); the value was " +
          "issued again since (" + at_seq(h.issued) + ") to another allocation, which this " +
          "release would free";
  f.related.push_back({"sleep-time unmap", l.unmapped});
  f.related.push_back({"re-issue of the value", h.issued});
  f.related.push_back({"no-op unmap", pair.noop_unmap});
  f.state_json = "{\"handle\":\"" + hex(handle) + "\",\"reservation_range\":\"" + hex(pair.base) +
                 "\",\"current_alloc\":" + std::to_string(h.alloc_id) +
                 ",\"sleeping_alloc\":" + std::to_string(l.alloc_id) +
                 ",\"current_generation\":" + std::to_string(h.gen) +
                 ",\"sleeping_generation\":" + std::to_string(l.gen) + "}";
  return f;
}

Finding released_again_forgotten(std::uint64_t handle, const ThreadVmmState &pair,
                                 const ThreadVmmState::Last &l) {
  Finding f;
  f.cls = FindingClass::DoubleRelease;
  f.msg = "cuMemRelease of handle " + hex(handle) + " right after a no-op unmap of " +
          range_text(pair.base, pair.size) + ": that range's last handle had this value and was " +
          "released when the range was put to sleep (" + at_seq(l.unmapped) + "); no call " +
          "issued the value since (the record of its release is older than the " +
          std::to_string(VmmModel::kReleasedKept) + " the shim keeps)";
  f.related.push_back({"sleep-time unmap", l.unmapped});
  f.related.push_back({"no-op unmap", pair.noop_unmap});
  f.state_json = "{\"handle\":\"" + hex(handle) + "\",\"released\":true,\"reservation_range\":\"" +
                 hex(pair.base) + "\",\"sleeping_alloc\":" + std::to_string(l.alloc_id) +
                 ",\"sleeping_generation\":" + std::to_string(l.gen) + ",\"record_aged_out\":true}";
  return f;
}

Finding released_again(std::uint64_t handle, const HandleRec &h, bool replaced,
                       const EventRef &replaced_by) {
  Finding f;
  f.cls = replaced ? FindingClass::StaleRelease : FindingClass::DoubleRelease;
  f.msg = "cuMemRelease of handle " + hex(handle) + ", which was already released at " +
          at_seq(h.released) +
          (replaced ? "; the range it backed (" + hex(h.last_res + h.last_off) +
                          ") has been mapped to another allocation since"
                    : std::string()) +
          // bug-patterns: a capability probe or a failed allocation path that releases what it
          // created before mapping it, and then again in its error handling.
          (!h.ever_mapped ? "; the handle was never mapped: an allocation path that failed or "
                            "probed half-way released it, then released it again"
                          : std::string());
  f.related.push_back({"first release", h.released});
  f.related.push_back({"handle issued", h.issued});
  if (replaced) f.related.push_back({"replacement", replaced_by});
  f.state_json = "{\"handle\":\"" + hex(handle) + "\",\"released\":true" +
                 (h.ever_mapped ? ",\"last_mapped_at\":\"" + hex(h.last_res + h.last_off) + "\""
                                : std::string(",\"never_mapped\":true")) +
                 "}";
  return f;
}

Finding unseen_release(std::uint64_t handle, const Finding &was, const DriverView &v) {
  Finding f;
  f.cls = FindingClass::UnseenReissue;
  const EventRef *first = nullptr;
  for (const Related &r : was.related)
    if (r.what == "first release") first = &r.ev;
  f.msg = "cuMemRelease of handle " + hex(handle) + ", which the shim saw released" +
          (first ? " at " + at_seq(*first) : std::string()) +
          " and never issued again, but the driver holds it live: it was issued again through " +
          (v.path ? std::string(v.path) : std::string(kUnseenPaths)) +
          "; forwarded (the driver released it)";
  f.related = was.related;
  f.state_json = "{\"handle\":\"" + hex(handle) + "\",\"model\":\"" +
                 std::string(finding_id(was.cls)) + "\",\"driver\":\"live\"}";
  return f;
}

Finding double_address_free(std::uint64_t base, std::uint64_t size, const EventRef &first) {
  Finding f;
  f.cls = FindingClass::DoubleAddressFree;
  f.msg = "cuMemAddressFree of " + range_text(base, size) + ", a reservation already freed at " +
          at_seq(first);
  f.related.push_back({"first address free", first});
  return f;
}

Finding free_mapped_va(std::uint64_t base, std::uint64_t size, const Reservation &r) {
  Finding f;
  f.cls = FindingClass::FreeMappedVa;
  std::uint64_t mapped = 0;
  for (const auto &[o, m] : r.maps) {
    mapped += m.size;
    f.related.push_back({"mapping still in place", m.mapped});
  }
  f.msg = "cuMemAddressFree of " + range_text(base, size) + " while " +
          std::to_string(r.maps.size()) + " mapping(s) (" + std::to_string(mapped) +
          " bytes) are still in place; the driver refuses it (unmap first)";
  f.state_json = "{\"reservation\":\"" + hex(base) + "\",\"range\":" +
                 describe_range(r, 0, r.size) + "}";
  return f;
}

Finding unmap_while_busy(const VmmTicket &t, const char *how, std::uint64_t waited_ns) {
  Finding f;
  f.cls = FindingClass::UnmapWhileBusy;
  const bool sync = std::string_view(how) == "sync";
  f.msg = "cuMemUnmap of " + range_text(t.va, t.size) + " while device " + std::to_string(t.dev) +
          " still had work queued (" +
          (sync ? "the context synchronised after " + human_ns(waited_ns) +
                      " before the unmap: the shim waited, so no kernel lost the range"
                : std::string("the unmapping thread's default stream was busy")) +
          "); a kernel still using the range faults with an illegal address (error 700), "
          "reported later by an unrelated call. Synchronise the stream that uses the memory "
          "before putting it to sleep";
  f.related.push_back({"mapping", t.mapped});
  f.state_json = "{\"dev\":" + std::to_string(t.dev) + ",\"check\":\"" + how +
                 "\",\"waited_ns\":" + std::to_string(waited_ns) + "}";
  return f;
}

}  // namespace cmg::vmm_findings
