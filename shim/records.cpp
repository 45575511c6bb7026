// SPDX-License-Identifier: Apache-2.0
// Header and finding records through the fixed-size line writer (see records.h).
#include "records.h"

#include <fcntl.h>
#include <unistd.h>

#include <vector>

#include "cmg_config.h"
#include "diag.h"

namespace cmg::shim {
namespace {

std::vector<std::string> read_argv() {
  std::vector<std::string> out;
  int fd = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  std::string all;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 && all.size() < (1u << 16))
    all.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  std::size_t pos = 0;
  while (pos < all.size()) {
    std::size_t z = all.find('\0', pos);
    if (z == std::string::npos) z = all.size();
    out.emplace_back(all, pos, z - pos);
    pos = z + 1;
  }
  return out;
}

void put_related(JsonLine &j, const Finding &f) {
  if (f.related.empty()) return;
  j.begin_array("related");
  for (const Related &r : f.related) {
    j.elem_object().str("what", r.what);
    if (r.ev.known()) {
      j.unum("seq", r.ev.seq).unum("ts", r.ev.ts).unum("tid", r.ev.tid);
      if (r.ev.api) j.str("api", r.ev.api);
      if (r.ev.stack) j.unum("stack", r.ev.stack);
    }
    j.end_object();
  }
  j.end_array();
}

}  // namespace

void write_header_record(const std::vector<Interposer> &before) {
  State &s = state();
  const std::vector<std::string> argv = read_argv();
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  // The snapshot the options were parsed from, not the environment now (the program may have
  // changed it since).
  const ParsedOptions &p = parsed_options();
  LogLine j(s.log);
  j.num("cumemguard_log", 1).str("tool", CMG_VERSION).num("pid", getpid())
      .num("ppid", getppid()).num("rank", s.rank).str("host", host)
      .unum("start_unix_ns", s.start_unix_ns).begin_array("argv");
  for (const auto &a : argv) j.elem_str(a);
  j.end_array();
  // The mode, the profile and every option set in the environment (its own variable or an entry
  // of CUMEMGUARD_OPTIONS), as given.
  for (const auto &v : p.values)
    if (v.spec->name == "MODE" || v.spec->name == "PROFILE")
      j.str(v.spec->name == "MODE" ? "mode" : "profile", v.effective);
  j.begin_object("options");
  for (const auto &v : p.values)
    if (v.source == OptionSource::Environment || v.source == OptionSource::Options)
      j.str(std::string("CUMEMGUARD_") + std::string(v.spec->name), v.raw);
  j.end_object();
  if (!before.empty()) {
    j.begin_array("interposers");
    for (const Interposer &i : before) {
      j.elem_object().str("path", i.path).begin_array("symbols");
      for (const char *name : i.names) j.elem_str(name);
      j.end_array().end_object();
    }
    j.end_array();
  }
  j.commit(0);
  // On disk at once: a log whose process is killed before the next flush still says whose it is,
  // and the report reads it as cut off rather than as not a log.
  s.log.flush();
}

void write_finding_record(const Call &c, const Finding &f, Action action, int res,
                          const Args &args, std::uint64_t seq, std::uint64_t ts,
                          std::uint32_t stack, const char *suppressed) {
  State &s = state();
  LogLine j(s.log);
  j.str("k", "finding").unum("seq", seq).unum("ts", ts).unum("tid", thread_id())
      .str("class", finding_id(f.cls)).str("api", api_name(c.api()))
      .str("action", action_name(action)).num("res", res);
  put_args(j, args);
  j.str("msg", f.msg);
  if (stack) j.unum("stack", stack);
  if (suppressed) j.str("suppressed", suppressed);
  j.unum("call_seq", c.ev().seq);
  put_related(j, f);
  if (!f.state_json.empty()) j.raw("state", f.state_json);
  if (f.bytes) j.unum("bytes", f.bytes);
  if (f.blocked_ns) j.unum("blocked_ns", f.blocked_ns);
  j.commit(ts);
  s.log.flush();  // a finding must survive a crash that may follow it
}

void write_finding_without_call(const Finding &f, const char *where, std::uint64_t seq,
                                std::uint64_t ts, std::uint32_t stack) {
  auto fill = [&](JsonLine &j) {
    j.str("k", "finding").unum("seq", seq).unum("ts", ts).unum("tid", thread_id())
        .str("class", finding_id(f.cls)).str("api", where).str("action", "forward").num("res", 0)
        .str("msg", f.msg);
    if (stack) j.unum("stack", stack);
    put_related(j, f);
    if (!f.state_json.empty()) j.raw("state", f.state_json);
    if (f.bytes) j.unum("bytes", f.bytes);
  };
  State &s = state();
  if (s.log.is_open()) {
    LogLine j(s.log);
    fill(j);
    j.commit(ts);
    return;
  }
  // Before the log opens (findings about the environment at load): kept as a line until it does.
  std::string buf(1024 + f.msg.size() * 6 + f.state_json.size(), '\0');
  JsonLine j(buf.data(), buf.size());
  fill(j);
  write_or_keep(std::string(j.finish()));
}

std::string log_path_for(std::string_view pattern, int rank) {
  LogName n = expand_log_name(pattern, log_name_inputs(getpid(), rank));
  for (const auto &p : n.problems) note(LogLevel::Warn, p);
  return std::move(n.path);
}

}  // namespace cmg::shim
