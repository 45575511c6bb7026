// SPDX-License-Identifier: Apache-2.0
// Findings at residency boundaries (see resident_findings.h).
#include "resident_findings.h"

#include "text.h"
#include "units.h"

namespace cmg::resident_findings {
namespace {

constexpr std::size_t kListed = 16;  // objects listed in a finding's state, the rest counted

std::string call_text(const EventRef &e, int res, const char *res_name) {
  return std::string(e.api ? e.api : "a call") + " at " + at_seq(e) + " returned " +
         std::to_string(res) + (res_name && *res_name ? std::string(" (") + res_name + ")" : "");
}

std::string made_json(const WakeMade &m, std::uint64_t bytes, bool mapped) {
  std::string s = "{\"handle\":\"" + hex(m.handle) + "\",\"bytes\":" + std::to_string(bytes);
  if (mapped) s += ",\"va\":\"" + hex(m.va) + "\",\"size\":" + std::to_string(m.size);
  return s + ",\"seq\":" + std::to_string(m.ev.seq) + "}";
}

std::string bytes_phrase(std::uint64_t b) {
  return std::to_string(b) + " bytes, " + human_bytes(static_cast<std::int64_t>(b));
}

}  // namespace

Finding failed_wake(const WakeRun &w, const std::vector<Left> &left, const char *res_name) {
  Finding f;
  f.cls = FindingClass::FailedWake;
  std::size_t mapped = 0, held = 0;
  std::uint64_t bytes = 0;
  for (const Left &l : left) {
    (l.mapped ? mapped : held) += 1;
    bytes += l.bytes;
  }
  f.bytes = bytes;
  f.msg = "a wake-up that began at " + at_seq(w.first) +
          " failed: " + call_text(w.failed_call, w.failed_res, res_name) + "; " +
          std::to_string(mapped) + " mapping" + (mapped == 1 ? "" : "s") + " and " +
          std::to_string(held) + " created handle" + (held == 1 ? "" : "s") + " it made (" +
          bytes_phrase(bytes) +
          ") were not rolled back: they stay resident, and an allocator that still counts them "
          "as asleep will not free them";
  f.related.push_back({"failed call", w.failed_call});
  f.related.push_back({"wake-up began", w.first});
  if (!left.empty()) f.related.push_back({"made by the wake-up", left.front().made.ev});
  std::string st = "{\"failed_api\":\"" + std::string(w.failed_call.api ? w.failed_call.api : "") +
                   "\",\"failed_res\":" + std::to_string(w.failed_res) +
                   ",\"failed_seq\":" + std::to_string(w.failed_call.seq) +
                   ",\"woken\":" + std::to_string(w.woken) + ",\"left\":[";
  for (std::size_t i = 0; i < left.size() && i < kListed; ++i)
    st += (i ? "," : "") + made_json(left[i].made, left[i].bytes, left[i].mapped);
  st += "],\"left_count\":" + std::to_string(left.size()) + "}";
  f.state_json = std::move(st);
  return f;
}

Finding stayed_mapped(const SleepRun &s, const std::vector<Leftover> &stayed,
                      const char *res_name) {
  Finding f;
  f.cls = FindingClass::StayedMapped;
  std::uint64_t bytes = 0;
  for (const Leftover &l : stayed) bytes += l.made.size;
  f.bytes = bytes;
  const Leftover &first = stayed.front();
  f.msg = std::to_string(stayed.size()) + " range" + (stayed.size() == 1 ? "" : "s") + " (" +
          bytes_phrase(bytes) + ") mapped by a failed wake-up (" +
          call_text(first.failed_call, first.failed_res, res_name) +
          ") stayed mapped across the sleep that began at " + at_seq(s.first) +
          ", while the same allocator put " + std::to_string(s.ranges) + " range" +
          (s.ranges == 1 ? "" : "s") + " (" + bytes_phrase(s.bytes) +
          ") to sleep: the memory is still resident while the allocator is asleep";
  f.related.push_back({"sleep began", s.first});
  f.related.push_back({"mapped by the failed wake-up", first.made.ev});
  f.related.push_back({"failed call", first.failed_call});
  std::string st = "{\"asleep_ranges\":" + std::to_string(s.ranges) +
                   ",\"asleep_bytes\":" + std::to_string(s.bytes) + ",\"stayed\":[";
  for (std::size_t i = 0; i < stayed.size() && i < kListed; ++i)
    st += (i ? "," : "") + made_json(stayed[i].made, stayed[i].made.size, true);
  st += "],\"stayed_count\":" + std::to_string(stayed.size()) + "}";
  f.state_json = std::move(st);
  return f;
}

Finding stray_device(int dev, bool context, const DeviceUse::Verdict &v, bool by_comm,
                     const EventRef &first) {
  Finding f;
  f.cls = FindingClass::StrayDevice;
  const std::string what = context ? "a context" : "memory";
  std::string why;
  if (by_comm)
    why = "its communicator is on device " + std::to_string(v.home);
  else if (v.home_first.ev.known())
    why = "its first " + std::string(v.home_first.context ? "context" : "memory") +
          " was on device " + std::to_string(v.home) + " at " + at_seq(v.home_first.ev);
  else
    why = "its communicators are on device " + std::to_string(v.home);
  f.msg = what + " was created on device " + std::to_string(dev) + " at " + at_seq(first) +
          ", a device this rank otherwise does not use (" + why +
          "): a thread that never selected its device gets device 0 from the runtime, and what it "
          "creates there takes memory from whichever process owns that GPU";
  f.related.push_back({"first use of device " + std::to_string(dev), first});
  if (v.home_first.ev.known())
    f.related.push_back({"first use of device " + std::to_string(v.home), v.home_first.ev});
  f.state_json = "{\"device\":" + std::to_string(dev) + ",\"home\":" + std::to_string(v.home) +
                 ",\"what\":\"" + (context ? "context" : "memory") + "\",\"judged\":\"" +
                 (by_comm ? "communicator" : "first-use") + "\"}";
  return f;
}

}  // namespace cmg::resident_findings
