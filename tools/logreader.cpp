// SPDX-License-Identifier: Apache-2.0
// Event log reader: lines from a descriptor in large reads, each line's fields read with simdjson's
// On-Demand API (logfields.cpp) and interpreted by kind, events released in seq order through a
// bounded reorder window, and the merge of several logs. Free-form values are re-written bounded
// (json_bounded.h); nothing recurses on input.
#include "logreader.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <queue>

#include <fmt/format.h>

#include "json_bounded.h"
#include "log_files.h"
#include "logfields.h"
#include "options.h"

namespace cmg::report {
namespace od = simdjson::ondemand;
using simdjson::SUCCESS;
using namespace std::string_view_literals;
using namespace fields;

namespace {

class FdSource final : public ByteSource {
 public:
  FdSource(int fd, bool owned) : fd_(fd), owned_(owned) {}
  ~FdSource() override {
    if (owned_ && fd_ >= 0) ::close(fd_);
  }
  long read(char *buf, std::size_t n) override {
    for (;;) {
      const ssize_t r = ::read(fd_, buf, n);
      if (r < 0 && errno == EINTR) continue;
      return static_cast<long>(r);
    }
  }

 private:
  int fd_;
  bool owned_;
};

class TextSource final : public ByteSource {
 public:
  explicit TextSource(std::string_view t) : text_(t) {}
  long read(char *buf, std::size_t n) override {
    const std::size_t k = std::min(n, text_.size() - pos_);
    std::memcpy(buf, text_.data() + pos_, k);
    pos_ += k;
    return static_cast<long>(k);
  }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace

std::string clean(std::string_view s, std::size_t max) {
  bool plain = s.size() <= max;
  for (std::size_t i = 0; plain && i < s.size(); ++i)
    if (control_length(s, i)) plain = false;
  if (plain) return std::string(s);
  std::size_t used = 0;
  std::string out = escape_controls(s, max, used);
  if (used < s.size()) out += fmt::format("...[{} bytes]", s.size());
  return out;
}

const char *status_name(Status s) {
  switch (s) {
    case Status::Complete: return "complete";
    case Status::Crashed: return "crashed";
    case Status::Aborted: return "aborted";
    case Status::Truncated: return "truncated";
  }
  return "?";
}

Status Log::status() const {
  if (!end_ts) return Status::Truncated;
  if (end_signal) return Status::Crashed;
  if (end_aborted) return Status::Aborted;
  return Status::Complete;
}

std::unique_ptr<ByteSource> fd_source(int fd, bool owned) {
  return std::make_unique<FdSource>(fd, owned);
}

std::unique_ptr<ByteSource> text_source(std::string_view text) {
  return std::make_unique<TextSource>(text);
}

std::optional<std::uint64_t> parse_hex(std::string_view sv) {
  int base = 10;
  if (sv.size() > 2 && sv[0] == '0' && (sv[1] == 'x' || sv[1] == 'X')) {
    sv.remove_prefix(2);
    base = 16;
  }
  if (sv.empty()) return std::nullopt;
  std::uint64_t out = 0;
  auto [p, ec] = std::from_chars(sv.data(), sv.data() + sv.size(), out, base);
  if (ec != std::errc() || p != sv.data() + sv.size()) return std::nullopt;
  return out;
}

std::string hex(std::uint64_t v) {
  char buf[32];
  auto [p, ec] = std::to_chars(buf + 2, buf + sizeof buf, v, 16);
  (void)ec;
  buf[0] = '0';
  buf[1] = 'x';
  return std::string(buf, p);
}

struct LogReader::Impl {
  std::unique_ptr<ByteSource> src;
  Log log;
  ReadStatus status = ReadStatus::Ok;
  std::string error;
  bool opened = false;

  // The line buffer: [begin, end) holds unread bytes; SIMDJSON_PADDING readable bytes follow
  // the capacity, as simdjson requires after a document. `usual` is the size it starts at and
  // comes back to after a longer line; it is freed when the log has been read to its end.
  std::vector<char> buf;
  std::size_t cap = 0, begin = 0, end = 0, usual = kMaxBuffer;
  bool eof = false, skipping = false, finished = false;

  // One pair of parsers for every log of the process: a parser keeps the capacity of the longest
  // document it read (four bytes of index per byte of it), which thousands of logs must not each
  // hold. A line is parsed and interpreted before the next is read, so sharing them is safe.
  od::parser &parser = shared_parser(0);
  od::parser &aux = shared_parser(1);  // re-reads a finding's bounded arguments

  static od::parser &shared_parser(int which) {
    thread_local od::parser parsers[2];
    return parsers[which];
  }

  struct Pending {
    Event e;
    std::uint64_t order;
  };
  std::vector<Pending> heap;
  std::uint64_t order = 0, last_seq = 0;
  bool released_any = false, lines_done = false;

  std::optional<Event> ready;  // in order already: released without the heap

  bool releasable(std::uint64_t seq) const { return released_any ? seq <= last_seq + 1 : seq <= 1; }

  void push(Event &&e) {
    if (heap.empty() && !ready && releasable(e.seq)) {
      ready = std::move(e);
      return;
    }
    heap.push_back({std::move(e), order++});
    std::push_heap(heap.begin(), heap.end(), later);
  }

  static bool later(const Pending &a, const Pending &b) {
    return a.e.seq != b.e.seq ? a.e.seq > b.e.seq : a.order > b.order;
  }

  void grow(std::size_t want) {
    cap = want;
    buf.resize(cap + simdjson::SIMDJSON_PADDING);
  }

  // Back to the usual size once what is unread fits in it (after a line longer than that).
  void shrink() {
    if (cap <= usual || end - begin > usual) return;
    std::memmove(buf.data(), buf.data() + begin, end - begin);
    end -= begin;
    begin = 0;
    cap = usual;
    std::vector<char> smaller(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(end));
    smaller.resize(cap + simdjson::SIMDJSON_PADDING);
    buf.swap(smaller);
  }

  // The end of the log: its buffer and its descriptor are given back.
  void finish() {
    finished = true;
    std::vector<char>().swap(buf);
    cap = begin = end = 0;
    src->release();
  }

  // The next line without its '\n'; false at the end (or on a read error).
  bool next_line(std::string_view &line, bool &unterminated) {
    if (finished) return false;
    if (buf.empty()) {
      // No larger than the file (and its padding): a log of 2 KB costs 4 KiB, not a megabyte.
      std::size_t want = usual;
      if (auto n = src->size_hint(); n && *n + 1 < want)
        want = std::max<std::size_t>(kMinBuffer, *n + 1);
      grow(want);
    }
    for (;;) {
      if (const void *nl = std::memchr(buf.data() + begin, '\n', end - begin)) {
        const std::size_t at = static_cast<const char *>(nl) - buf.data();
        line = std::string_view(buf.data() + begin, at - begin);
        begin = at + 1;
        if (skipping) {  // the tail of an overlong line
          skipping = false;
          continue;
        }
        unterminated = false;
        return true;
      }
      if (eof) {
        if (begin < end && !skipping) {
          line = std::string_view(buf.data() + begin, end - begin);
          begin = end;
          unterminated = true;
          return true;
        }
        finish();
        return false;
      }
      shrink();
      if (begin > 0) {
        std::memmove(buf.data(), buf.data() + begin, end - begin);
        end -= begin;
        begin = 0;
      }
      if (end == cap) {
        if (cap > kMaxLine) {
          // One line longer than any the shim writes: skipped, and counted.
          ++log.overlong;
          ++log.malformed;
          skipping = true;
          end = 0;
        } else {
          grow(std::min(cap * 2, kMaxLine + 1));  // a line of kMaxLine bytes and its '\n' fit
        }
      }
      const long n = src->read(buf.data() + end, cap - end);
      if (n < 0) {
        status = ReadStatus::Unreadable;
        // errno is what the failed read(2) left: EIO for a bad disk, ESTALE for a log replaced
        // by another file while the report read it.
        const int e = errno ? errno : EIO;
        error = std::string("cannot read: ") +
                (e == ESTALE ? "the file was replaced while it was read" : std::strerror(e));
        eof = true;
        finish();
        return false;
      }
      if (n == 0) eof = true;
      end += static_cast<std::size_t>(n);
    }
  }

  // The padding simdjson reads past a line: the rest of the buffer and its padding.
  std::size_t room(std::string_view line) const {
    return static_cast<std::size_t>(buf.data() + buf.size() - line.data());
  }

  bool header(std::string_view line) {
    Fields f;
    Header &h = log.header;
    od::document doc;
    bool ok = parser.iterate(line.data(), line.size(), room(line)).get(doc) == SUCCESS;
    od::object obj;
    ok = ok && doc.get_object().get(obj) == SUCCESS;
    if (ok) {
      for (auto field : obj) {
        std::string_view key;
        od::value v;
        if (field.unescaped_key().get(key) != SUCCESS || field.value().get(v) != SUCCESS) {
          ok = false;
          break;
        }
        od::json_type t;
        if (v.type().get(t) != SUCCESS) {
          ok = false;
          break;
        }
        if (key == "cumemguard_log"sv) {
          od::number n;
          if (t != od::json_type::number || v.get_number().get(n) != SUCCESS) {
            ok = false;
            break;
          }
          if (n.is_int64()) h.format = n.get_int64();
          else if (n.is_uint64()) h.format = std::numeric_limits<std::int64_t>::max();
          else {
            ok = false;
            break;
          }
          f.cumemguard_log = h.format;
        } else if (key == "argv"sv && t == od::json_type::array) {
          od::array a;
          if (v.get_array().get(a) != SUCCESS) break;
          for (auto el : a) {
            od::value ev;
            if (el.get(ev) != SUCCESS) break;
            if (auto s = str_of(ev); s && h.argv.size() < 256) h.argv.push_back(*s);
          }
        } else if (key == "options"sv && t == od::json_type::object) {
          od::object o;
          if (v.get_object().get(o) != SUCCESS) break;
          for (auto of : o) {
            std::string_view name;
            od::value ov;
            if (of.unescaped_key().get(name) != SUCCESS || of.value().get(ov) != SUCCESS) break;
            od::json_type ot;
            if (ov.type().get(ot) != SUCCESS) break;
            std::string value;
            if (ot == od::json_type::string) {
              value = str_of(ov).value_or("");
            } else if (auto raw = raw_of(ov)) {
              value = bounded_json(*raw, kMaxValueDepth, kMaxValueBytes);
            }
            if (h.options.size() < 256) h.options.emplace_back(clean(name, 256), std::move(value));
          }
        } else if (key == "tool"sv) h.tool = str_of(v).value_or("");
        else if (key == "pid"sv) h.pid = i64_of(v).value_or(0);
        else if (key == "ppid"sv) h.ppid = i64_of(v).value_or(0);
        else if (key == "rank"sv) h.rank = i64_of(v).value_or(-1);
        else if (key == "host"sv) h.host = str_of(v).value_or("");
        else if (key == "start_unix_ns"sv) h.start_unix_ns = i64_of(v).value_or(0);
        else if (key == "mode"sv) h.mode = str_of(v).value_or("");
      }
    }
    if (!ok || !f.cumemguard_log) {
      status = ReadStatus::NotALog;
      error = "not a cumemguard log (the first line is not a log header)";
      return false;
    }
    if (h.format > kLogFormat) {
      status = ReadStatus::NewerFormat;
      error = fmt::format("log format {} is newer than this cumemguard understands ({})", h.format,
                          kLogFormat);
      return false;
    }
    if (h.format < 1) {
      status = ReadStatus::NotALog;
      error = fmt::format("not a cumemguard log (format {})", h.format);
      return false;
    }
    return true;
  }

  template <class T>
  void keep(std::vector<T> &v, T &&x) {
    if (v.size() < kMaxListed) v.push_back(std::move(x));
    else ++log.dropped;
  }

  // A record of a known or unknown kind; false when a known record lacks what it needs.
  bool record(Fields &f, const std::function<void(Leak &&)> &on_leak) {
    const std::string &k = f.k;
    if (f.ts) log.max_ts = std::max(log.max_ts, *f.ts);
    if (k == "call"sv || k == "finding"sv || k == "nccl"sv || k == "cuda_error"sv) {
      if (!f.seq) return false;
      Event e;
      e.seq = *f.seq;
      e.ts = f.ts.value_or(0);
      e.tid = f.tid.value_or(0);
      e.stack = f.stack;
      if (k == "call"sv) {
        if (!f.api || f.api->empty()) return false;
        Call &c = e.body.emplace<Call>();
        c.api = std::move(*f.api);
        c.res = f.res.value_or(0);
        c.dur = f.dur.value_or(0);
        if (f.args_is_object && !f.call_args_done) {
          // args came before k: read them again from their raw text.
          if (!aux_args(f.args_raw, f.call_args)) return false;
        }
        c.args = std::move(f.call_args.text);
        c.ptr = f.call_args.ptr;
        c.size = f.call_args.size;
        c.handle = f.call_args.handle;
        c.dev = f.dev.value_or(-1);
        if (f.mem) c.mem = std::move(*f.mem);
        c.delta = f.delta.value_or(0);
        c.skipped = f.skipped;
        c.deferred = f.deferred;
        if (f.released_from) c.released_from = std::move(*f.released_from);
      } else if (k == "finding"sv) {
        if (!f.cls || f.cls->empty()) return false;
        Finding x;
        x.cls = std::move(*f.cls);
        x.api = f.api.value_or("");
        x.action = f.action.value_or("");
        x.res = f.res.value_or(0);
        if (f.args_is_object) {
          if (f.call_args_done) {
            x.args = std::move(f.call_args.text);
          } else {
            x.args_json = bounded_json(f.args_raw, kMaxValueDepth, kMaxValueBytes);
            ArgsInfo a;
            if (aux_args(x.args_json, a)) x.args = std::move(a.text);
          }
        }
        x.msg = f.msg.value_or("");
        x.related = std::move(f.related);
        if (f.have_state) x.state_json = std::move(f.state_json);
        x.bytes = f.bytes;
        x.blocked_ns = f.blocked_ns;
        x.call_seq = f.call_seq;
        x.suppressed = f.suppressed_rule.value_or("");
        e.body = std::move(x);
      } else if (k == "nccl"sv) {
        if (!f.event || f.event->empty()) return false;
        Nccl n;
        n.event = std::move(*f.event);
        n.api = f.api.value_or("");
        n.comm = f.comm.value_or("");
        n.rank = f.rank;
        n.nranks = f.nranks;
        n.dev = f.dev;
        n.res = f.res.value_or(0);
        n.live = f.live;
        n.suppressed = f.suppressed_flag;
        n.buff = f.buff.value_or("");
        if (f.object_field == "handle") n.handle = f.object.value_or("");
        n.size = f.size;
        n.flags = f.flags;
        n.stat = f.stat;
        n.value = f.value;
        n.ranges = f.ranges;
        n.range_bytes = f.range_bytes;
        e.body = std::move(n);
      } else {
        if (!f.api || !f.res) return false;
        CudaError c;
        c.api = std::move(*f.api);
        c.res = *f.res;
        c.name = f.name.value_or("");
        c.sticky = f.sticky;
        c.ret_seq = f.ret_seq;
        e.body = std::move(c);
      }
      push(std::move(e));
    } else if (k == "stack"sv) {
      if (!f.id || !f.have_pcs || !f.pcs_ok || !f.py_ok) return false;
      log.stacks[*f.id] = std::move(f.pcs);
      if (!f.py.empty() || f.py_end)
        log.py_stacks[*f.id] = PyStackRec{std::move(f.py), clean(f.py_end.value_or(""), 32)};
    } else if (k == "pycode"sv) {
      if (!f.id || !f.file || !f.name) return false;
      if (log.pycodes.size() < kMaxPyCodes || log.pycodes.count(*f.id))
        log.pycodes[*f.id] = PyCode{std::move(*f.file), std::move(*f.name), f.first.value_or(0)};
    } else if (k == "module"sv) {
      if (!f.path || f.path->empty() || !f.base) return false;
      Module m;
      m.path = std::move(*f.path);
      m.base = *f.base;
      m.size = f.mod_size.value_or(0);
      m.build_id = f.build_id.value_or("");
      keep(log.modules, std::move(m));
    } else if (k == "leak"sv) {
      Leak l;
      l.what = f.what.value_or("");
      l.api = f.api.value_or("");
      if (f.object) {
        l.object_field = f.object_field.value_or("");
        l.object = std::move(*f.object);
      }
      l.size = f.size.value_or(0);
      l.dev = f.dev.value_or(-1);
      l.seq = f.seq;
      l.stack = f.stack;
      l.capture = f.capture;
      if (on_leak) on_leak(std::move(l));
    } else if (k == "config"sv) {
      ConfigRecord c;
      c.var = f.var.value_or("");
      c.original = f.original.value_or("");
      c.result = f.result.value_or("");
      c.msg = f.msg.value_or("");
      c.applied = f.applied;
      keep(log.configs, std::move(c));
    } else if (k == "note"sv) {
      Note n;
      n.ts = f.ts.value_or(0);
      n.level = f.level.value_or("info");
      n.msg = f.msg.value_or("");
      keep(log.notes, std::move(n));
    } else if (k == "summary"sv) {
      Summary s;
      s.ts = f.ts.value_or(0);
      s.calls = std::move(f.calls);
      s.bytes = std::move(f.summary_bytes);
      s.live = std::move(f.live_counts);
      s.findings = std::move(f.findings);
      s.suppressed = std::move(f.rules);
      s.bridge = std::move(f.bridge);
      s.every_call_failed = std::move(f.all_failed);
      log.summary = std::move(s);
    } else if (k == "end"sv) {
      log.end_ts = f.ts.value_or(0);
      log.end_signal = f.signal;
      log.end_signal_name = f.signal_name.value_or("");
      log.end_aborted = f.aborted;
      log.end_quick_exit = f.quick_exit;
    } else if (k == "crash"sv) {
      if (!f.signal) return false;
      Crash c;
      c.ts = f.ts.value_or(0);
      c.tid = f.tid.value_or(0);
      c.signal = *f.signal;
      c.signal_name = f.signal_name.value_or("");
      c.addr = f.addr;
      c.stack = f.stack;
      log.crash = std::move(c);
    } else if (k.empty()) {
      return false;
    } else {
      // A later minor version's record: skipped by contract, counted by kind.
      if (log.unknown_kinds.size() < 64 || log.unknown_kinds.count(k)) ++log.unknown_kinds[k];
      else ++log.unknown_kinds["(other kinds)"];
    }
    return true;
  }

  bool aux_args(std::string_view raw, ArgsInfo &a) {
    const simdjson::padded_string aux_text(raw);
    od::document doc;
    if (aux.iterate(aux_text).get(doc) != SUCCESS) return false;
    od::object o;
    if (doc.get_object().get(o) != SUCCESS) return false;
    return read_args(o, a);
  }

  // Reads lines until an event can be released or the log ends.
  void fill(const std::function<void(Leak &&)> &on_leak,
            const std::function<void(std::string_view)> &on_snapshot) {
    std::string_view line;
    bool unterminated = false;
    while (!lines_done && !ready) {
      if (!heap.empty()) {
        const std::uint64_t top = heap.front().e.seq;
        if (releasable(top)) return;
        if (heap.size() >= (released_any ? kReorderWindow : 1024)) return;
      }
      if (!next_line(line, unterminated)) {
        lines_done = true;
        return;
      }
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      Fields f;
      if (!read_record(parser, line, room(line), f)) {
        if (unterminated) log.partial_last_line = true;
        else ++log.malformed;
        continue;
      }
      ++log.records;
      if (f.k == "snapshot"sv) {
        if (on_snapshot) on_snapshot(line);
        continue;
      }
      if (!record(f, on_leak)) ++log.malformed;
      // A parser keeps the capacity of its longest document: back to a usual one after a long
      // line, so that one 16 MiB line does not hold 80 MB for the rest of the report.
      if (line.size() > kMaxBuffer) {
        [[maybe_unused]] const auto a = parser.allocate(kMaxBuffer);
        [[maybe_unused]] const auto b = aux.allocate(kMaxBuffer);
      }
    }
  }
};

LogReader::LogReader(std::unique_ptr<ByteSource> src, std::string name, std::string open_error)
    : impl_(std::make_unique<Impl>()) {
  impl_->src = std::move(src);
  impl_->log.file = std::move(name);
  impl_->error = std::move(open_error);
}

LogReader::~LogReader() = default;

bool LogReader::open() {
  Impl &d = *impl_;
  if (d.opened) return d.status == ReadStatus::Ok;
  d.opened = true;
  if (d.status != ReadStatus::Ok) return false;
  if (!d.src) {
    d.status = ReadStatus::Unreadable;
    if (d.error.empty()) d.error = "cannot open";
    return false;
  }
  std::string_view line;
  bool unterminated = false;
  if (!d.next_line(line, unterminated)) {
    if (d.status == ReadStatus::Ok) {
      d.status = ReadStatus::NotALog;
      d.error = "not a cumemguard log (the file is empty)";
    }
    return false;
  }
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return d.header(line);
}

void LogReader::set_buffer(std::size_t bytes) {
  impl_->usual = std::clamp(bytes, kMinBuffer, kMaxBuffer);
}

ReadStatus LogReader::status() const {
  return impl_->status;
}

const std::string &LogReader::error() const {
  return impl_->error;
}

bool LogReader::next(Event &e) {
  Impl &d = *impl_;
  if (!d.opened && !open()) return false;
  if (d.status != ReadStatus::Ok && d.heap.empty() && !d.ready) return false;
  d.fill(on_leak, on_snapshot);
  if (d.ready) {
    e = std::move(*d.ready);
    d.ready.reset();
  } else {
    if (d.heap.empty()) return false;
    std::pop_heap(d.heap.begin(), d.heap.end(), Impl::later);
    e = std::move(d.heap.back().e);
    d.heap.pop_back();
  }
  if (d.released_any && e.seq < d.last_seq) ++d.log.late;
  d.last_seq = d.released_any ? std::max(d.last_seq, e.seq) : e.seq;
  d.released_any = true;
  return true;
}

Log &LogReader::log() {
  return impl_->log;
}

const Log &LogReader::log() const {
  return impl_->log;
}

ReadResult read_all(LogReader &r) {
  ReadResult out;
  r.on_leak = [&](Leak &&l) { out.leaks.push_back(std::move(l)); };
  if (r.open()) {
    Event e;
    while (r.next(e)) out.events.push_back(std::move(e));
  }
  out.status = r.status();
  out.error = r.error();
  out.log = std::move(r.log());
  return out;
}

ReadResult read_log_text(std::string_view text, std::string name) {
  LogReader r(text_source(text), std::move(name));
  return read_all(r);
}

ReadResult read_log_file(const std::string &path) {
  auto r = open_log_file(path);
  return read_all(*r);
}

bool is_log_header(std::string_view first_line) {
  std::string text(first_line);
  LogReader r(text_source(text), "");
  if (r.open()) return true;
  return r.status() == ReadStatus::NewerFormat;
}

void merge_logs(std::vector<LogReader *> &readers,
                const std::function<void(std::size_t, const Event &)> &sink) {
  std::int64_t t0 = std::numeric_limits<std::int64_t>::max();
  for (auto *r : readers) t0 = std::min(t0, r->log().header.start_unix_ns);
  struct Head {
    std::int64_t t;
    std::size_t log;
  };
  // Earliest time first, then the log given first: a deterministic order for equal times.
  auto later = [](const Head &a, const Head &b) { return a.t != b.t ? a.t > b.t : a.log > b.log; };
  std::priority_queue<Head, std::vector<Head>, decltype(later)> heads(later);
  if (readers.size() == 1) {  // one log: nothing to merge
    Event e;
    while (readers[0]->next(e)) sink(0, e);
    return;
  }
  std::vector<Event> cur(readers.size());
  for (std::size_t i = 0; i < readers.size(); ++i)
    if (readers[i]->next(cur[i])) heads.push({rel_time(readers[i]->log().header, cur[i].ts, t0), i});
  while (!heads.empty()) {
    const Head h = heads.top();
    heads.pop();
    sink(h.log, cur[h.log]);
    if (readers[h.log]->next(cur[h.log]))
      heads.push({rel_time(readers[h.log]->log().header, cur[h.log].ts, t0), h.log});
  }
}

}  // namespace cmg::report
