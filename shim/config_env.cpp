// SPDX-License-Identifier: Apache-2.0
// The PyTorch allocator-config policy in the host: applied once at load, before any library reads
// the environment (PyTorch's parser L runs in libc10_cuda.so's static initialisation, i.e. during
// `import torch`), and checked again at the first CUDA call (bug-patterns.md P21).
#include <errno.h>
#include <link.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "diag.h"
#include "env_write.h"
#include "state.h"
#include "stderr_out.h"
#include "summary.h"
#include "textbuf.h"
#include "torch_conf.h"
#include "torch_host.h"

extern char **environ;

namespace cmg::shim {
namespace {

namespace tc = cmg::torchconf;

tc::Env *g_env_at_load = nullptr;  // leaked on purpose; read at the first CUDA call
bool g_load_reported = false;      // the environment's errors were judged at load
// What load found, said at the process's first CUDA call: a process under the shim that never
// touches CUDA (the shell, ls, a pyenv wrapper of a launcher) prints nothing. Leaked on purpose.
std::vector<Finding> *g_load_findings = nullptr;

// The kept findings as stderr lines, for a process that never reaches CUDA: `import torch`
// aborts inside libc10_cuda.so's static initialisation on some values (SIGABRT during import
// torch, docs/torch-alloc-conf-observed.md), before any CUDA call, and the shim's crash handlers
// come only with the first one. So while findings are kept, a SIGABRT handler of this file says
// them (installed only where SIGABRT has its default action, and given back at the first CUDA
// call), and so does the exit of a process that loaded libc10_cuda.so without calling CUDA (an
// import that raised). Made at load, written with write(2): nothing allocates at either moment.
char g_unsaid[8192];
std::size_t g_unsaid_len = 0;
std::atomic<bool> g_unsaid_pending{false};
struct sigaction g_abort_before {};
std::atomic<bool> g_abort_ours{false};

void say_unsaid() {
  if (!g_unsaid_pending.exchange(false, std::memory_order_acq_rel)) return;
  const int rank = state().rank;
  for (std::size_t at = 0; at < g_unsaid_len;) {
    const void *nl = std::memchr(g_unsaid + at, '\n', g_unsaid_len - at);
    const std::size_t end = nl ? static_cast<const char *>(nl) - g_unsaid : g_unsaid_len;
    char line[sizeof g_unsaid + 96];
    TextBuf t(line, sizeof line);
    t.s("cumemguard[").i(getpid());
    if (rank >= 0) t.s(" rank ").i(rank);
    t.s("]: warning: ").s(std::string_view(g_unsaid + at, end - at)).c('\n');
    stderr_write(t.view());
    at = end + 1;
  }
}

void on_abort_unsaid(int sig) {
  const int saved = errno;
  say_unsaid();
  // Then as without the shim: the default action, and the signal again (abort() raises it once
  // more itself; a kill -ABRT from outside is delivered when this handler returns).
  sigaction(sig, &g_abort_before, nullptr);
  raise(sig);
  errno = saved;
}

void keep_line(const Finding &f) {
  if (!enabled(LogLevel::Warn)) return;
  char esc[2048];
  std::size_t used = 0;
  const std::size_t n = escape_controls_to(f.msg, sizeof esc - 8, esc, sizeof esc, used);
  TextBuf t(g_unsaid + g_unsaid_len, sizeof g_unsaid - g_unsaid_len);
  t.s(finding_id(f.cls)).s(" in (load): ").s(std::string_view(esc, n)).c('\n');
  if (t.full()) return;  // a cut line is not said; the first CUDA call still says the finding
  g_unsaid_len += t.size();
  g_unsaid_pending.store(true, std::memory_order_release);
  struct sigaction old {};
  if (g_abort_ours.load() || sigaction(SIGABRT, nullptr, &old) != 0) return;
  if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;  // someone else's
  struct sigaction sa {};
  sa.sa_handler = on_abort_unsaid;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  g_abort_before = old;
  if (sigaction(SIGABRT, &sa, nullptr) == 0) g_abort_ours.store(true);
}

// Said now when this process is a PyTorch one already (libtorch linked), kept for the first CUDA
// call otherwise: every process of a job inherits CUMEMGUARD_TORCH_ALLOC_CONF (the shell, ls, a
// launcher's wrapper), and only one that reaches CUDA, or aborts or exits after loading
// libc10_cuda.so, says what was not applied.
void load_finding(Finding f, bool now) {
  if (now) {
    report_finding_without_call(std::move(f), "(load)", true);
    return;
  }
  keep_line(f);
  if (!g_load_findings) g_load_findings = new std::vector<Finding>();
  g_load_findings->push_back(std::move(f));
}

void config_record(const tc::Write &w, bool applied, const std::string &msg) {
  std::string buf(8192 + w.new_value.size() * 2, '\0');
  JsonLine j(buf.data(), buf.size());
  j.str("k", "config").str("var", tc::var_name(w.var));
  if (w.old_value)
    j.str("original", *w.old_value);
  else
    j.boolean("created", true);
  j.str("result", w.new_value).boolean("applied", applied).str("msg", msg);
  write_or_keep(std::string(j.finish()));
}

// True when PyTorch's CUDA allocator library is already initialised: a program linked against
// libtorch runs libc10_cuda.so's static initialisers (parser L) before a preloaded library's
// constructor, so a rewrite now would come after PyTorch read the variable.
bool c10_cuda_loaded() {
  int found = 0;
  dl_iterate_phdr(
      [](dl_phdr_info *info, size_t, void *data) -> int {
        if (info->dlpi_name && std::strstr(info->dlpi_name, "libc10_cuda")) {
          *static_cast<int *>(data) = 1;
          return 1;
        }
        return 0;
      },
      &found);
  return found != 0;
}

Finding config_finding(std::string msg) {
  Finding f;
  f.cls = FindingClass::Config;
  f.msg = std::move(msg);
  return f;
}

}  // namespace

void on_load() {
  State &s = state();
  try {
    tc::Env env = tc::Env::from_envp(environ);
    const bool torch_process = c10_cuda_loaded();
    if (!s.opts.torch_alloc_conf.empty()) {
      // The release is not known before `import torch`: the newest grammar accepts every key a
      // release has, so a key of a newer release than the program's is written (PyTorch then
      // rejects it as it would without the shim) rather than refused for every user of it.
      tc::Plan p = tc::plan(env, s.opts.torch_alloc_conf, tc::newest_grammar());
      if (p.action == tc::PlanAction::Write && torch_process) {
        load_finding(
            config_finding("CUMEMGUARD_TORCH_ALLOC_CONF='" + s.opts.torch_alloc_conf +
                           "' not applied: libc10_cuda.so was initialised before the shim (the "
                           "program links libtorch), so PyTorch already read " +
                           std::string(tc::var_name(p.writes.front().var)) +
                           "; set it before the program starts (cumemguard run does)"),
            true);
      } else if (p.action == tc::PlanAction::Write && !environ_write_safe()) {
        // A shim dlopen'ed while the program's threads run: writing the environment now races
        // with their getenv (env_write.h). Said and recorded, not applied.
        load_finding(
            config_finding("CUMEMGUARD_TORCH_ALLOC_CONF='" + s.opts.torch_alloc_conf +
                           "' not applied: the shim was loaded while the program's threads were "
                           "running (dlopen), and setting " +
                           std::string(tc::var_name(p.writes.front().var)) +
                           " then races with their reads of the environment; preload it "
                           "(LD_PRELOAD, or cumemguard run)"),
            true);
      } else if (p.action == tc::PlanAction::Write) {
        for (const tc::Write &w : p.writes) {
          setenv(std::string(tc::var_name(w.var)).c_str(), w.new_value.c_str(), 1);
          config_record(w, true, p.reason);
          note(LogLevel::Info, std::string(tc::var_name(w.var)) + " set to '" + w.new_value +
                                   "' (CUMEMGUARD_TORCH_ALLOC_CONF)");
        }
        env = tc::Env::from_envp(environ);
      } else if (p.action == tc::PlanAction::Refuse) {
        // What was not applied first: the value and the reason may quote the environment at length.
        load_finding(
            config_finding("CUMEMGUARD_TORCH_ALLOC_CONF not applied: " + p.reason + " (value '" +
                           shown(s.opts.torch_alloc_conf) + "')"),
            torch_process);
      }
    }
    // Problems PyTorch itself would hit: an abort at import or an exception at the first
    // allocation. Only errors are printed (every process of a job would repeat a warning), and
    // at load only those every modelled release has (the release is not known yet: a key of 2.12
    // is no error there); the others come with the release, at the first CUDA call. An error
    // takes the hint `config` shows with it ("did you mean expandable_segments?").
    g_load_reported = tc::fails_in_every_release(env);
    if (g_load_reported) {
      const std::vector<tc::Problem> problems = tc::diagnose(env);
      std::string hints;
      for (const tc::Problem &pr : problems)
        if (pr.severity == tc::Severity::Note &&
            (pr.text.find("(did you mean ") != std::string::npos ||
             pr.text.find("(keys are case-sensitive") != std::string::npos))
          hints += "; " + pr.text;
      for (const tc::Problem &pr : problems)
        if (pr.severity == tc::Severity::Error)
          load_finding(config_finding(pr.text + hints), torch_process);
    }
    g_env_at_load = new tc::Env(std::move(env));
  } catch (...) {
    // A policy that cannot be evaluated is not applied; the host goes on untouched.
  }
}

void release_load_abort_handler() {
  g_unsaid_pending.store(false, std::memory_order_release);  // the first CUDA call says them
  if (!g_abort_ours.exchange(false)) return;
  struct sigaction cur {};
  if (sigaction(SIGABRT, nullptr, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) &&
      cur.sa_handler == on_abort_unsaid)
    sigaction(SIGABRT, &g_abort_before, nullptr);
}

void say_load_findings_at_exit() {
  if (!active() && g_unsaid_pending.load(std::memory_order_acquire) && c10_cuda_loaded())
    say_unsaid();
}

void on_first_cuda_call() {
  release_load_abort_handler();
  if (g_load_findings) {
    std::vector<Finding> found = std::move(*g_load_findings);
    g_load_findings->clear();
    for (Finding &f : found) report_finding_without_call(std::move(f), "(first CUDA call)", true);
  }
  if (!g_env_at_load) return;
  try {
    for (const tc::Problem &pr : tc::diagnose_change(*g_env_at_load, tc::Env::from_envp(environ)))
      report_finding_without_call(config_finding(pr.text), "(first CUDA call)", true);
  } catch (...) {
  }
  // A PyTorch program has loaded libtorch by now: judge the environment for its release.
  torch_release_check();
}

const tc::Env *torch_env_at_load() { return g_env_at_load; }

bool torch_errors_reported_at_load() {
  return g_load_reported;
}

}  // namespace cmg::shim
