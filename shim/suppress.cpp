// SPDX-License-Identifier: Apache-2.0
// Suppressions in the host (see suppress.h).
#include "suppress.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "eventlog.h"
#include "flush.h"
#include "stacks.h"
#include "state.h"
#include "suppressions.h"
#include "symtab.h"

namespace cmg::shim {
namespace {

// Frames searched: deep enough to pass the shim's, the runtime's and a vendor library's own.
constexpr int kFrames = kSuppressionFrames;
constexpr std::size_t kMaxFileBytes = kMaxSuppressionsBytes;

struct Loaded {
  Suppressions rules;
  std::unique_ptr<std::atomic<std::uint64_t>[]> hits;
};
std::atomic<const Loaded *> g_loaded{nullptr};  // set once, leaked on purpose (used until exit)

std::string read_file(const std::string &path, std::string &err) {
  // Non-blocking and regular files only: a FIFO or a device must not hang the host.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    err = std::strerror(errno);
    return {};
  }
  struct stat st;
  std::string text;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    err = "not a regular file";
  } else if (static_cast<std::uint64_t>(st.st_size) > kMaxFileBytes) {
    err = "larger than 1 MiB";
  } else {
    text.resize(static_cast<std::size_t>(st.st_size));
    std::size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    text.resize(got);
  }
  ::close(fd);
  return text;
}

}  // namespace

void suppressions_load() {
  static std::atomic<bool> once{false};
  if (once.exchange(true)) return;
  const std::string &path = state().opts.suppressions;
  if (path.empty()) return;
  try {
    std::string err;
    const std::string text = read_file(path, err);
    if (!err.empty()) {
      note(LogLevel::Warn, "CUMEMGUARD_SUPPRESSIONS: cannot read '" + shown(path) + "': " + err +
                               "; no suppressions loaded");
      return;
    }
    auto *l = new Loaded{Suppressions::parse(text, path), nullptr};
    for (const std::string &w : l->rules.warnings) note(LogLevel::Warn, "CUMEMGUARD_SUPPRESSIONS: " + w);
    if (l->rules.rules.empty()) {
      delete l;
      return;
    }
    l->hits.reset(new std::atomic<std::uint64_t>[l->rules.rules.size()]());
    g_loaded.store(l, std::memory_order_release);
  } catch (...) {
    // Out of memory while reading a few lines: no suppressions, the host goes on.
  }
}

SuppressHit suppression_for(FindingClass cls, bool count) {
  SuppressHit hit;
  const Loaded *l = g_loaded.load(std::memory_order_acquire);
  if (!l) return hit;
  try {
    Captured cap;
    capture(cap, kFrames);
    const int n = cap.n;
    if (n <= 0 && cap.py.n == 0) return hit;
    const FrameSym *fs[kFrames];
    frame_syms(cap.pc, n, patterns(), fs);
    // One entry a frame, an unnamed one too: an anchored rule counts frames.
    std::vector<SuppressionFrame> frames;
    frames.reserve(static_cast<std::size_t>(n + cap.py.n));
    for (int i = 0; i < n; ++i) {
      SuppressionFrame &f = frames.emplace_back();
      if (!fs[i]) continue;
      f.function = fs[i]->demangled.empty() ? fs[i]->name : fs[i]->demangled;
      f.module = fs[i]->module;
    }
    // Python frames as the report shows them: qualified name and the file's path (and basename).
    for (int i = 0; i < cap.py.n; ++i) {
      SuppressionFrame &f = frames.emplace_back();
      f.python = true;
      py::CodeInfo ci;
      if (!py::code_info(cap.py.f[i].code, ci)) continue;
      f.function = ci.name;
      f.module = ci.file;
    }
    hit.rule = l->rules.match(finding_id(cls), frames);
    if (!hit) return hit;
    hit.text = l->rules.rules[static_cast<std::size_t>(hit.rule)].text();
    hit.stack = intern_stack(cap);
    if (count) l->hits[static_cast<std::size_t>(hit.rule)].fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    hit = SuppressHit{};
  }
  return hit;
}

void suppressed_json(JsonLine &j) {
  const Loaded *l = g_loaded.load(std::memory_order_acquire);
  if (!l) return;
  bool any = false;
  for (std::size_t i = 0; i < l->rules.rules.size(); ++i) {
    const std::uint64_t n = l->hits[i].load(std::memory_order_relaxed);
    if (!n) continue;
    if (!any) j.begin_array("suppressed");
    any = true;
    const SuppressionRule &r = l->rules.rules[i];
    j.elem_object().str("class", r.cls).str("pattern", r.pattern).unum("count", n).end_object();
  }
  if (any) j.end_array();
}

void suppressed_text(TextBuf &t) {
  const Loaded *l = g_loaded.load(std::memory_order_acquire);
  if (!l) return;
  std::uint64_t total = 0;
  std::size_t used = 0;
  for (std::size_t i = 0; i < l->rules.rules.size(); ++i)
    if (const std::uint64_t n = l->hits[i].load(std::memory_order_relaxed)) {
      total += n;
      ++used;
    }
  if (!used) return;
  t.s("  suppressed: ").u(total).s(" (");
  bool first = true;
  for (std::size_t i = 0; i < l->rules.rules.size(); ++i) {
    const std::uint64_t n = l->hits[i].load(std::memory_order_relaxed);
    if (!n) continue;
    if (!first) t.s(", ");
    first = false;
    // The rule as "CLASS:PATTERN", quoted as shown() quotes it (its first 64 bytes escaped, the
    // length of a longer one said), built on the stack.
    const SuppressionRule &r = l->rules.rules[i];
    char rule[64];
    TextBuf rt(rule, sizeof rule);
    rt.s(r.cls).c(':').s(r.pattern);
    char text[kShownMax];
    std::size_t consumed = 0;
    t.s(std::string_view(text, escape_controls_to(rt.view(), std::string_view::npos, text,
                                                  sizeof text, consumed)));
    const std::size_t whole = r.cls.size() + 1 + r.pattern.size();
    if (whole > sizeof rule) t.s("... (").u(whole).s(" bytes)");
    if (used > 1) t.c(' ').u(n);
  }
  t.s(")\n");
}

}  // namespace cmg::shim
