// SPDX-License-Identifier: Apache-2.0
// Chrome trace-event JSON for Perfetto / chrome://tracing: one process track per log, byte counters
// per device and memory kind, instants for findings, deferred frees and NCCL, slow calls and stream
// captures (begin to end, on the thread that began them) as slices.
// Written as the merged events arrive (the trace of a 1 GB log once held 11 GB of JSON objects);
// thread names and the end-of-log instants follow the events, which the format allows.
#include <algorithm>
#include <charconv>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "json_bounded.h"
#include "report_fmt.h"
#include "report_model.h"

namespace cmg::report {
namespace {

// Linux pids stay below 2^22 (PID_MAX_LIMIT); logs whose pid repeats (ranks on different hosts)
// get a track id above that range so their tracks do not merge.
constexpr std::int64_t kSyntheticPidBase = (std::int64_t{1} << 22) + 1;
constexpr std::size_t kFlushBytes = std::size_t{1} << 20;

// The trace-event format counts in microseconds; three decimals keep the log's nanoseconds.
std::string us(std::int64_t ns) {
  const char *sign = ns < 0 ? "-" : "";
  const std::uint64_t a =
      ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
  if (a % 1000 == 0) return fmt::format("{}{}", sign, a / 1000);
  return fmt::format("{}{}.{:03}", sign, a / 1000, a % 1000);
}

// The capture number of a capture begin or end call ("stream=0x1000, mode=global, capture=1").
std::optional<std::uint64_t> capture_of(const Call &c) {
  if (c.api.find("Capture") == std::string::npos) return std::nullopt;
  const auto at = c.args.find("capture=");
  if (at == std::string::npos) return std::nullopt;
  std::uint64_t id = 0;
  const char *b = c.args.data() + at + 8, *e = c.args.data() + c.args.size();
  if (std::from_chars(b, e, id).ec != std::errc() || id == 0) return std::nullopt;
  return id;
}

std::string counter_name(std::int64_t dev, const std::string &mem) {
  return dev < 0 ? fmt::format("bytes {} (no device)", mem)
                 : fmt::format("bytes {} dev{}", mem, dev);
}

// The Python frames of a stack as "f (file:line) <- g (file:line)", innermost first (at most 4),
// or "" for a stack without them: a finding's instant then names the program's line.
std::string python_where(const Log &l, std::optional<std::uint64_t> stack) {
  if (!stack) return {};
  const auto it = l.py_stacks.find(*stack);
  if (it == l.py_stacks.end()) return {};
  std::string out;
  for (std::size_t i = 0; i < it->second.frames.size() && i < 4; ++i) {
    const PyFrameRef &r = it->second.frames[i];
    const auto c = l.pycodes.find(r.code);
    if (!out.empty()) out += " <- ";
    out += c == l.pycodes.end() ? fmt::format("<python code {}>:{}", r.code, r.line)
                                : fmt::format("{} ({}:{})", c->second.name, c->second.file, r.line);
  }
  return out;
}

class TraceWriter final : public EventSink {
 public:
  TraceWriter(const ReportOptions &opt, std::function<void(std::string_view)> write)
      : opt_(opt), write_(std::move(write)) {}

  void start(const std::vector<const Log *> &logs, const std::vector<std::string> &,
             std::int64_t t0) override {
    logs_ = logs;
    t0_ = t0;
    buf_ = "{\"traceEvents\":[";
    std::set<std::int64_t> used;
    for (std::size_t i = 0; i < logs.size(); ++i) {
      std::int64_t pid = logs[i]->header.pid;
      if (pid <= 0 || used.count(pid)) pid = kSyntheticPidBase + static_cast<std::int64_t>(i);
      used.insert(pid);
      pids_.push_back(pid);
    }
    tids_.resize(logs.size());
    last_tid_.assign(logs.size(), -1);
    for (std::size_t i = 0; i < logs.size(); ++i) {
      const Header &h = logs[i]->header;
      std::string program;
      for (const auto &a : h.argv) program += (program.empty() ? "" : " ") + a;
      if (program.empty()) program = "?";
      const std::string name = h.rank >= 0
                                   ? fmt::format("{} (rank {}, pid {})", program, h.rank, h.pid)
                                   : fmt::format("{} (pid {})", program, h.pid);
      metadata("process_name", pids_[i], 0, "name", json_string(name));
      metadata("process_sort_index", pids_[i], 0, "sort_index", std::to_string(i));
    }
  }

  void event(std::size_t li, const Event &e) override {
    const std::int64_t t = rel_time(logs_[li]->header, e.ts, t0_);
    const std::int64_t pid = pids_[li];
    // Threads are few and calls come in runs from one thread: the set is asked only on a change.
    if (e.tid != last_tid_[li] && tids_[li].size() < 100000) {
      tids_[li].insert(e.tid);
      last_tid_[li] = e.tid;
    }
    if (const auto *c = std::get_if<Call>(&e.body)) {
      if (!c->mem.empty() && c->delta != 0) {
        // Most calls step the counter the previous one did: no tree walk, no name built.
        if (!last_ || last_log_ != li || last_dev_ != c->dev || last_mem_ != c->mem) {
          auto [it, fresh] = bytes_.try_emplace({li, c->dev, c->mem});
          last_ = &it->second;
          last_log_ = li;
          last_dev_ = c->dev;
          last_mem_ = c->mem;
          if (fresh) {
            last_->name = json_string(counter_name(c->dev, c->mem));
            // Counters start from zero at the log's start so the first allocation shows as a step.
            counter(last_->name, rel_time(logs_[li]->header, 0, t0_), pid, 0, 0);
          }
        }
        last_->bytes = sat_add(last_->bytes, c->delta);
        counter(last_->name, t, pid, e.tid, last_->bytes);
      }
      if (const auto id = capture_of(*c)) capture_span(li, *id, *c, t, pid, e);
      if (c->deferred)
        instant(json_string("deferred " + c->api), "deferred", t, pid, e.tid, 't',
                fmt::format("\"call\":{},\"seq\":{}", json_string(call_text(c->api, c->args)),
                            e.seq));
      // --slow-us 0 makes every call a slice, as a threshold of 0 says.
      if (c->dur >= opt_.slow_ns) {
        begin_event();
        buf_ += fmt::format(
            "{{\"name\":{},\"cat\":\"slow call\",\"ph\":\"X\",\"ts\":{},\"dur\":{},\"pid\":{},"
            "\"tid\":{},\"args\":{{\"call\":{},\"res\":{},\"seq\":{}}}}}",
            json_string(c->api), us(t), us(c->dur), pid, e.tid,
            json_string(call_text(c->api, c->args)), c->res, e.seq);
        end_event();
      }
    } else if (const auto *f = std::get_if<Finding>(&e.body)) {
      std::string args = fmt::format(
          "\"call\":{},\"action\":{},\"res\":{},\"msg\":{},\"seq\":{}",
          json_string(call_text(f->api, f->args)), json_string(f->action), f->res,
          json_string(f->msg), e.seq);
      if (f->bytes) args += fmt::format(",\"bytes\":{}", *f->bytes);
      if (f->blocked_ns) args += fmt::format(",\"blocked_ns\":{}", *f->blocked_ns);
      if (!f->suppressed.empty()) args += ",\"suppressed\":" + json_string(f->suppressed);
      if (const std::string py = python_where(*logs_[li], e.stack); !py.empty())
        args += ",\"python\":" + json_string(py);
      instant(json_string(f->cls), f->suppressed.empty() ? "finding" : "suppressed", t, pid, e.tid,
              't', args);
    } else if (const auto *n = std::get_if<Nccl>(&e.body)) {
      std::string args = fmt::format("\"api\":{},\"comm\":{},\"res\":{},\"seq\":{}",
                                     json_string(n->api), json_string(n->comm), n->res, e.seq);
      if (n->rank) args += fmt::format(",\"rank\":{}", *n->rank);
      if (n->nranks) args += fmt::format(",\"nranks\":{}", *n->nranks);
      if (n->live) args += fmt::format(",\"live\":{}", *n->live);
      if (n->suppressed) args += ",\"suppressed\":true";
      instant(json_string("nccl " + n->event), "nccl", t, pid, e.tid, 'p', args);
    } else if (const auto *ce = std::get_if<CudaError>(&e.body)) {
      instant(json_string(fmt::format("CUDA error {}", ce->res)), "cuda error", t, pid, e.tid, 't',
              fmt::format("\"api\":{},\"name\":{},\"sticky\":{},\"seq\":{}", json_string(ce->api),
                          json_string(ce->name), ce->sticky ? "true" : "false", e.seq));
    }
  }

  void finish(const Model &m) override {
    // Captures still open when their log ends reach its end.
    for (const auto &[key, open] : captures_) {
      const std::size_t li = key.first;
      const std::int64_t end = m.time(li, m.logs[li].last_ts());
      span(key.second, open, end, pids_[li], "\"open at the end of the log\"");
    }
    for (std::size_t i = 0; i < m.logs.size() && i < tids_.size(); ++i) {
      const Log &l = m.logs[i];
      for (auto tid : tids_[i])
        metadata("thread_name", pids_[i], tid, "name",
                 json_string(tid == l.header.pid ? fmt::format("main {}", tid)
                                                 : fmt::format("thread {}", tid)));
      const std::int64_t t = m.time(i, l.last_ts());
      const auto [objects, bytes] = m.log_leaks[i];
      if (objects)
        instant("\"leaks at exit\"", "leak", t, pids_[i], l.header.pid, 'p',
                fmt::format("\"objects\":{},\"bytes\":{}", objects, bytes));
      const Outcome &o = m.outcomes[i];
      if (o.crash)
        instant(json_string("killed by " + o.signal_name), "crash", m.time(i, o.crash->ts), pids_[i],
                o.crash->tid, 'p', fmt::format("\"signal\":{}", o.crash->signal));
      if (l.truncated())
        instant("\"log cut off\"", "log", t, pids_[i], l.header.pid, 'p',
                "\"file\":" + json_string(l.file));
    }
    buf_ += "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{\"generator\":\"cumemguard report\"}}\n";
    write_(buf_);
    buf_.clear();
  }

 private:
  void begin_event() {
    buf_.append(first_ ? "\n" : ",\n");
    first_ = false;
  }
  void end_event() {
    if (buf_.size() >= kFlushBytes) {
      write_(buf_);
      buf_.clear();
    }
  }
  void metadata(const char *name, std::int64_t pid, std::int64_t tid, const char *key,
                const std::string &value) {
    begin_event();
    buf_ += fmt::format(
        "{{\"name\":\"{}\",\"ph\":\"M\",\"ts\":0,\"pid\":{},\"tid\":{},\"args\":{{\"{}\":{}}}}}",
        name, pid, tid, key, value);
    end_event();
  }
  void counter(const std::string &name, std::int64_t t, std::int64_t pid, std::int64_t tid,
               std::int64_t bytes) {
    begin_event();
    buf_ += "{\"name\":";
    buf_ += name;
    buf_ += ",\"cat\":\"memory\",\"ph\":\"C\",\"ts\":";
    append_us(t);
    buf_ += ",\"pid\":";
    append_int(pid);
    buf_ += ",\"tid\":";
    append_int(tid);
    buf_ += ",\"args\":{\"bytes\":";
    append_int(bytes);
    buf_ += "}}";
    end_event();
  }
  // Counters are most of a trace: their numbers are written with to_chars, not a format string.
  void append_int(std::int64_t v) {
    char tmp[24];
    auto [p, ec] = std::to_chars(tmp, tmp + sizeof tmp, v);
    (void)ec;
    buf_.append(tmp, p);
  }
  void append_us(std::int64_t ns) {
    const std::uint64_t a =
        ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
    if (ns < 0) buf_ += '-';
    char tmp[24];
    auto [p, ec] = std::to_chars(tmp, tmp + sizeof tmp, a / 1000);
    (void)ec;
    buf_.append(tmp, p);
    if (const std::uint64_t frac = a % 1000) {
      const char digits[4] = {'.', static_cast<char>('0' + frac / 100),
                              static_cast<char>('0' + frac / 10 % 10),
                              static_cast<char>('0' + frac % 10)};
      buf_.append(digits, 4);
    }
  }
  void instant(const std::string &name, const char *cat, std::int64_t t, std::int64_t pid,
               std::int64_t tid, char scope, const std::string &args) {
    begin_event();
    buf_ += fmt::format(
        "{{\"name\":{},\"cat\":\"{}\",\"ph\":\"i\",\"ts\":{},\"pid\":{},\"tid\":{},\"s\":\"{}\","
        "\"args\":{{{}}}}}",
        name, cat, us(t), pid, tid, scope, args);
    end_event();
  }

  // A capture's begin is remembered until its end comes (or the log ends).
  struct OpenCapture {
    std::int64_t t = 0, tid = 0;
    std::string begin;  // the begin call as text
  };
  void capture_span(std::size_t li, std::uint64_t id, const Call &c, std::int64_t t,
                    std::int64_t pid, const Event &e) {
    const bool begin = c.api.find("Begin") != std::string::npos;
    if (begin) {
      if (c.res == 0) captures_[{li, id}] = OpenCapture{t, e.tid, call_text(c.api, c.args)};
      return;
    }
    auto it = captures_.find({li, id});
    if (it == captures_.end()) return;
    span(id, it->second, t + c.dur, pid,
         fmt::format("{},\"res\":{}", json_string(call_text(c.api, c.args)), c.res));
    captures_.erase(it);
  }
  void span(std::uint64_t id, const OpenCapture &o, std::int64_t end, std::int64_t pid,
            const std::string &end_json) {
    begin_event();
    buf_ += fmt::format(
        "{{\"name\":\"capture {}\",\"cat\":\"capture\",\"ph\":\"X\",\"ts\":{},\"dur\":{},"
        "\"pid\":{},\"tid\":{},\"args\":{{\"begin\":{},\"end\":{}}}}}",
        id, us(o.t), us(std::max<std::int64_t>(end - o.t, 1)), pid, o.tid, json_string(o.begin),
        end_json);
    end_event();
  }

  std::map<std::pair<std::size_t, std::uint64_t>, OpenCapture> captures_;
  const ReportOptions &opt_;
  std::function<void(std::string_view)> write_;
  std::vector<const Log *> logs_;
  std::int64_t t0_ = 0;
  std::vector<std::int64_t> pids_;
  std::vector<std::set<std::int64_t>> tids_;
  std::vector<std::int64_t> last_tid_;
  struct Counter {
    std::string name;  // as JSON
    std::int64_t bytes = 0;
  };
  std::map<std::tuple<std::size_t, std::int64_t, std::string>, Counter> bytes_;
  Counter *last_ = nullptr;  // std::map nodes stay put
  std::size_t last_log_ = 0;
  std::int64_t last_dev_ = 0;
  std::string last_mem_;
  std::string buf_;
  bool first_ = true;
};

}  // namespace

std::unique_ptr<EventSink> trace_writer(const ReportOptions &opt,
                                        std::function<void(std::string_view)> write) {
  return std::make_unique<TraceWriter>(opt, std::move(write));
}

}  // namespace cmg::report
