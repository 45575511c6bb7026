// SPDX-License-Identifier: Apache-2.0
// The path every fake-driver export takes: configuration, call counters, fault injection, trace.
#include "driver_internal.h"
#include "fakecuda.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace fc {
namespace {

// One stderr line per bad setting, then the setting is ignored (the brief of every FAKECUDA_*).
void warn(const char *var, std::string_view value, const char *why) {
  std::fprintf(stderr, "fakecuda: ignoring %s=%.*s: %s\n", var, static_cast<int>(value.size()),
               value.data(), why);
}

bool parse_u64(std::string_view s, unsigned long long *out) {
  if (s.empty()) return false;
  unsigned long long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    if (v > (~0ULL - 9) / 10) return false;
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  *out = v;
  return true;
}

bool parse_size(std::string_view s, unsigned long long *out) {
  unsigned shift = 0;
  if (!s.empty()) {
    switch (s.back()) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      case 't': case 'T': shift = 40; break;
      default: break;
    }
    if (shift) s.remove_suffix(1);
  }
  unsigned long long v;
  if (!parse_u64(s, &v) || (shift && v > (~0ULL >> shift))) return false;
  *out = v << shift;
  return true;
}

bool parse_bool(const char *var, const char *s, bool dflt) {
  if (!s) return dflt;
  std::string_view v(s);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  warn(var, v, "expected 0 or 1");
  return dflt;
}

Config read_config() {
  Config c;
  if (const char *s = std::getenv("FAKECUDA_DEVICES")) {
    unsigned long long v;
    if (parse_u64(s, &v) && v >= 1 && v <= kMaxDevices)
      c.devices = static_cast<int>(v);
    else
      warn("FAKECUDA_DEVICES", s, "expected 1..16");
  }
  if (const char *s = std::getenv("FAKECUDA_DEVICE_MEMORY")) {
    unsigned long long v;
    // At least 64 MiB so that a few 2 MiB granules fit; at most 1 TiB of sparse file per device.
    if (parse_size(s, &v) && v >= (64ULL << 20) && v <= (1ULL << 40))
      c.device_memory = v;
    else
      warn("FAKECUDA_DEVICE_MEMORY", s, "expected a size from 64M to 1T");
  }
  c.handle_reuse = parse_bool("FAKECUDA_HANDLE_REUSE", std::getenv("FAKECUDA_HANDLE_REUSE"), true);
  c.retain_same = parse_bool("FAKECUDA_RETAIN_SAME", std::getenv("FAKECUDA_RETAIN_SAME"), true);
  if (const char *s = std::getenv("FAKECUDA_FABRIC")) {
    std::string_view v(s);
    if (v == "accept")
      c.fabric_accept = true;
    else if (v != "deny" && !v.empty())
      warn("FAKECUDA_FABRIC", v, "expected accept or deny");
  }
  c.bench = parse_bool("FAKECUDA_BENCH", std::getenv("FAKECUDA_BENCH"), false);
  c.multicast = parse_bool("FAKECUDA_MULTICAST", std::getenv("FAKECUDA_MULTICAST"), false);
  return c;
}

// ---- fault injection -------------------------------------------------------------------------

struct Rule {
  std::vector<bool> match;  // per export index
  unsigned long long nth = 1;
  bool from_on = false;     // "N+"
  CUresult err = CUDA_ERROR_OUT_OF_MEMORY;
  unsigned long long seen = 0;
  bool spent = false;
};

struct RandomFaults {
  bool on = false;
  unsigned long long state = 0;  // splitmix64
  double rate = 0;
  std::vector<CUresult> err;     // per export index; CUDA_SUCCESS = not subject to random faults
};

struct Faults {
  std::mutex mu;
  std::atomic<bool> active{false};
  std::vector<Rule> rules;
  RandomFaults rnd;
};

Faults &faults() {
  static Faults *f = new Faults;  // leaked on purpose: calls made from static destructors still work
  return *f;
}

// "api" matches an export when it is the exact name or the base name of the export.
bool match_api(std::string_view api, std::vector<bool> *out) {
  out->assign(kFnCount, false);
  bool any = false;
  for (unsigned i = 0; i < kFnCount; ++i) {
    const FnInfo &fi = fn_info(i);
    if (api == fi.name || api == fi.base) {
      (*out)[i] = true;
      any = true;
    }
  }
  return any;
}

bool parse_error(std::string_view s, CUresult *out) {
  struct Named {
    const char *name;
    CUresult r;
  };
  static const Named kNames[] = {
      {"OOM", CUDA_ERROR_OUT_OF_MEMORY},         {"OUT_OF_MEMORY", CUDA_ERROR_OUT_OF_MEMORY},
      {"INVALID_VALUE", CUDA_ERROR_INVALID_VALUE}, {"NOT_PERMITTED", CUDA_ERROR_NOT_PERMITTED},
      {"NOT_SUPPORTED", CUDA_ERROR_NOT_SUPPORTED}, {"INVALID_CONTEXT", CUDA_ERROR_INVALID_CONTEXT},
      {"NOT_INITIALIZED", CUDA_ERROR_NOT_INITIALIZED}, {"NOT_FOUND", CUDA_ERROR_NOT_FOUND},
      {"INVALID_HANDLE", CUDA_ERROR_INVALID_HANDLE}, {"UNKNOWN", CUDA_ERROR_UNKNOWN},
  };
  if (s.rfind("CUDA_ERROR_", 0) == 0) s.remove_prefix(11);
  for (const Named &n : kNames)
    if (s == n.name) {
      *out = n.r;
      return true;
    }
  unsigned long long v;
  if (parse_u64(s, &v) && v > 0 && v <= 0x7fffffff && error_name(static_cast<CUresult>(v))) {
    *out = static_cast<CUresult>(v);
    return true;
  }
  return false;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    std::size_t p = s.find(sep);
    out.push_back(s.substr(0, p));
    if (p == std::string_view::npos) break;
    s.remove_prefix(p + 1);
  }
  return out;
}

void read_fault_env(Faults &f) {
  if (const char *env = std::getenv("FAKECUDA_FAIL")) {
    for (std::string_view entry : split(env, ',')) {
      if (entry.empty()) continue;
      std::vector<std::string_view> parts = split(entry, ':');
      Rule r;
      std::string_view n = parts.size() == 3 ? parts[1] : std::string_view();
      if (!n.empty() && n.back() == '+') {
        r.from_on = true;
        n.remove_suffix(1);
      }
      if (parts.size() != 3 || !match_api(parts[0], &r.match) || !parse_u64(n, &r.nth) ||
          r.nth == 0 || !parse_error(parts[2], &r.err)) {
        warn("FAKECUDA_FAIL", entry, "expected api:N[+]:ERROR with an exported api and N >= 1");
        continue;
      }
      f.rules.push_back(std::move(r));
    }
  }
  const char *seed = std::getenv("FAKECUDA_FAIL_SEED");
  const char *rate = std::getenv("FAKECUDA_FAIL_RATE");
  const char *apis = std::getenv("FAKECUDA_FAIL_APIS");
  if (!seed && !rate && !apis) return;
  unsigned long long s = 0;
  char *end = nullptr;
  double p = rate ? std::strtod(rate, &end) : -1;
  if (!seed || !parse_u64(seed, &s)) {
    warn("FAKECUDA_FAIL_SEED", seed ? seed : "", "expected a number (random faults stay off)");
    return;
  }
  if (!rate || end == rate || *end || !(p >= 0 && p <= 1)) {
    warn("FAKECUDA_FAIL_RATE", rate ? rate : "", "expected a probability 0..1 (random faults stay off)");
    return;
  }
  f.rnd.err.assign(kFnCount, CUDA_SUCCESS);
  bool any = false;
  for (std::string_view entry : split(apis ? apis : "", ',')) {
    if (entry.empty()) continue;
    std::vector<std::string_view> parts = split(entry, ':');
    CUresult e = CUDA_ERROR_OUT_OF_MEMORY;
    std::vector<bool> m;
    if (parts.size() > 2 || !match_api(parts[0], &m) ||
        (parts.size() == 2 && !parse_error(parts[1], &e))) {
      warn("FAKECUDA_FAIL_APIS", entry, "expected api[:ERROR] with an exported api");
      continue;
    }
    for (unsigned i = 0; i < kFnCount; ++i)
      if (m[i]) f.rnd.err[i] = e;
    any = true;
  }
  if (!any) {
    warn("FAKECUDA_FAIL_APIS", apis ? apis : "", "no api named (random faults stay off)");
    return;
  }
  f.rnd.on = true;
  f.rnd.state = s;
  f.rnd.rate = p;
}

double next_uniform(unsigned long long &x) {
  unsigned long long z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);
}

// ---- calls and trace -------------------------------------------------------------------------

std::atomic<unsigned long long> g_calls[kFnCount];

struct Trace {
  int fd = -1;
};

Trace &trace() {
  static Trace *t = [] {
    auto *tr = new Trace;
    const char *p = std::getenv("FAKECUDA_TRACE");
    if (p && *p) {
      std::string path;
      for (const char *c = p; *c; ++c) {
        if (c[0] == '%' && c[1] == 'p') {
          path += std::to_string(getpid());
          ++c;
        } else {
          path += *c;
        }
      }
      tr->fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (tr->fd < 0) warn("FAKECUDA_TRACE", p, std::strerror(errno));
    }
    return tr;
  }();
  return *t;
}

struct Init {
  Init() {
    // The first driver call of the process reads the environment, before any export runs.
    (void)config();
    Faults &f = faults();
    read_fault_env(f);
    f.active = !f.rules.empty() || f.rnd.on;
    (void)trace();
  }
};

void ensure_init() { static Init once; }

}  // namespace

const Config &config() {
  static const Config c = read_config();
  return c;
}

CUresult enter(Fn fn) {
  ensure_init();
  const unsigned i = static_cast<unsigned>(fn);
  // Benchmark mode counts nothing: one counter per export would be a cache line that every
  // thread calling that export writes, and the scaling benchmarks would measure it.
  if (!config().bench) g_calls[i].fetch_add(1, std::memory_order_relaxed);
  Faults &f = faults();
  if (!f.active.load(std::memory_order_acquire)) return CUDA_SUCCESS;
  std::lock_guard<std::mutex> lk(f.mu);
  CUresult result = CUDA_SUCCESS;
  for (Rule &r : f.rules) {
    if (!r.match[i] || r.spent) continue;
    ++r.seen;
    if (r.seen == r.nth || (r.from_on && r.seen > r.nth)) {
      if (result == CUDA_SUCCESS) result = r.err;
      if (!r.from_on) r.spent = true;
    }
  }
  if (result == CUDA_SUCCESS && f.rnd.on && f.rnd.err[i] != CUDA_SUCCESS &&
      next_uniform(f.rnd.state) < f.rnd.rate)
    result = f.rnd.err[i];
  return result;
}

namespace {
// What each export last answered on this thread, so that a test can check that a caller above an
// interposer got exactly the driver's answer, call by call and thread by thread (tests/stress).
// Kept per export: an interposer may make other driver calls of its own after the one forwarded.
struct LastCall {
  unsigned long long serial = 0;  // the thread's call count when it was made; 0 = never
  CUresult result = CUDA_SUCCESS;
  bool injected = false;
};
struct ThreadCalls {
  unsigned long long calls = 0;
  LastCall last[kFnCount];
};
thread_local ThreadCalls t_calls;
std::atomic<unsigned long long> g_injected{0};
}  // namespace

void note_call(Fn fn, CUresult r, bool injected) {
  ThreadCalls &t = t_calls;
  LastCall &l = t.last[static_cast<unsigned>(fn)];
  l.serial = ++t.calls;
  l.result = r;
  l.injected = injected;
  if (injected) g_injected.fetch_add(1, std::memory_order_relaxed);
}

bool tracing() { return trace().fd >= 0; }

void trace_printf(const char *fmt, ...) {
  int fd = trace().fd;
  if (fd < 0) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = std::vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > static_cast<int>(sizeof buf) - 2) n = sizeof buf - 2;
  buf[n++] = '\n';
  // One write(2) per line with O_APPEND: lines of concurrent threads and processes never mix.
  ssize_t w = write(fd, buf, static_cast<std::size_t>(n));
  (void)w;
}

void trace_call(Fn fn, CUresult r) {
  if (fn == Fn::cuGetProcAddress || fn == Fn::cuGetProcAddress_v2) return;  // has its gpa line
  const char *name = error_name(r);
  trace_printf("call %s %s", fn_info(static_cast<unsigned>(fn)).name, name ? name : "?");
}

}  // namespace fc

// ---- control API (fakecuda.h) -------------------------------------------------------------------

FC_EXPORT int fakecuda_inject(const char *api, int nth_call_from_now, int cuda_error) {
  fc::ensure_init();
  fc::Rule r;
  if (!api || nth_call_from_now < 1 || cuda_error <= 0 || !fc::match_api(api, &r.match)) return -1;
  r.nth = static_cast<unsigned long long>(nth_call_from_now);
  r.err = static_cast<CUresult>(cuda_error);
  fc::Faults &f = fc::faults();
  std::lock_guard<std::mutex> lk(f.mu);
  f.rules.push_back(std::move(r));
  f.active = true;
  return 0;
}

FC_EXPORT void fakecuda_clear_faults(void) {
  fc::ensure_init();
  fc::Faults &f = fc::faults();
  std::lock_guard<std::mutex> lk(f.mu);
  f.rules.clear();
  f.rnd.on = false;
  f.active = false;
}

FC_EXPORT void fakecuda_set_busy(int dev, unsigned long long ns) { fc::set_busy(dev, ns); }

FC_EXPORT unsigned long long fakecuda_thread_calls(void) { return fc::t_calls.calls; }

FC_EXPORT int fakecuda_thread_last_call(const char *exact_name, struct fakecuda_call *out) {
  if (!exact_name || !out) return -1;
  for (unsigned i = 0; i < fc::kFnCount; ++i) {
    if (std::strcmp(fc::fn_info(i).name, exact_name) != 0) continue;
    const fc::LastCall &l = fc::t_calls.last[i];
    if (!l.serial) return -1;
    out->serial = l.serial;
    out->result = static_cast<int>(l.result);
    out->injected = l.injected ? 1 : 0;
    return 0;
  }
  return -1;
}

FC_EXPORT unsigned long long fakecuda_faults_injected(void) {
  return fc::g_injected.load(std::memory_order_relaxed);
}

FC_EXPORT unsigned long long fakecuda_calls(const char *exact_name) {
  if (!exact_name) return 0;
  for (unsigned i = 0; i < fc::kFnCount; ++i)
    if (std::strcmp(fc::fn_info(i).name, exact_name) == 0)
      return fc::g_calls[i].load(std::memory_order_relaxed);
  return 0;
}
