// SPDX-License-Identifier: Apache-2.0
// `cumemguard run`: runs a program with the shim preloaded, passes its exit status through, and
// says where the logs went and how to read them (heaptrack's launcher habit). What it reports of
// the run (the --error-exitcode status, the list of logs) comes from the status record each
// process of the program keeps in a directory the launcher made (run_files.h), never from the logs.
#include "run_cmd.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "cli.h"
#include "cmg_config.h"
#include "logname.h"
#include "options.h"
#include "run_args.h"
#include "run_checks.h"
#include "run_defaults.h"
#include "run_env_checks.h"
#include "run_files.h"
#include "run_preload.h"
#include "suppressions.h"
#include "torch_conf.h"

extern char **environ;

namespace cmg::tools {
namespace {

// Statuses of the launcher itself (sysexits.h names; README "Exit status").
constexpr int kUsage = 64, kNoInput = 66, kOsErr = 71, kCantCreate = 73;

// The help comes from the commands' table (cli_table.cpp, its run options from run_options.def),
// as the man page and the completion do.
void usage(FILE *f) {
  std::fputs(cli::help_text(cli::command("run")).c_str(), f);
}

std::string dir_of(const std::string &p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

volatile sig_atomic_t g_child = 0;

// CUMEMGUARD_TORCH_ALLOC_CONF is applied here, before exec, as well as by the shim at load: a
// program linked against libtorch initialises libc10_cuda.so before a preloaded library's
// constructor runs, so only the launcher is early enough for it.
// An override that cannot apply (a malformed entry, a value PyTorch's grammar refuses) stops the
// run with `label` and the reason, as any other CUMEMGUARD_* value that cannot apply does: false.
// Planned with the newest grammar, as the shim plans it (the release is not known before `import
// torch`: a key of a newer release is written, and PyTorch judges it).
// `ov`: the override in force (the variable or CUMEMGUARD_OPTIONS' torch_alloc_conf entry).
bool apply_torch_override(const std::string &label, const std::string &ov, bool entry) {
  if (ov.empty()) return true;
  cmg::torchconf::Plan plan;
  try {
    plan = cmg::torchconf::plan(cmg::torchconf::Env::from_envp(environ), ov,
                                cmg::torchconf::newest_grammar());
  } catch (...) {
    return true;  // the shim says what it cannot evaluate; the environment is left as it is
  }
  if (plan.action == cmg::torchconf::PlanAction::Refuse) {
    std::fprintf(stderr, "cumemguard run: %s: %s; the program was not started\n", label.c_str(),
                 torch_override_refusal(ov, plan.reason, entry).c_str());
    return false;
  }
  if (plan.action == cmg::torchconf::PlanAction::Write)
    for (const auto &w : plan.writes)
      setenv(std::string(cmg::torchconf::var_name(w.var)).c_str(), w.new_value.c_str(), 1);
  return true;
}

// How to name this program in the line that says how to read the logs: "cumemguard" when that
// name on PATH is this program, else its own path (a build tree's tools/cumemguard, which a user
// pasting `cumemguard report ...` would not find).
std::string self_command() {
  char self[PATH_MAX];
  if (!realpath("/proc/self/exe", self)) return "cumemguard";
  const char *path = std::getenv("PATH");
  for (std::string_view rest = path ? path : ""; !rest.empty();) {
    const std::size_t colon = rest.find(':');
    const std::string dir(rest.substr(0, colon));
    rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
    char found[PATH_MAX];
    const std::string cand = (dir.empty() ? std::string(".") : dir) + "/cumemguard";
    if (access(cand.c_str(), X_OK) == 0 && realpath(cand.c_str(), found))
      return std::strcmp(found, self) == 0 ? "cumemguard" : std::string(self);
  }
  return self;
}

// A pid whose process ended and was not reaped yet (kill(pid, 0) still succeeds for it).
bool zombie(std::int64_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/stat", static_cast<long long>(pid));
  FILE *f = std::fopen(path, "re");
  if (!f) return true;  // gone between the two looks
  char buf[512];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char *close = std::strrchr(buf, ')');  // the state follows the command's name
  return close && close[1] == ' ' && close[2] == 'Z';
}

bool exists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::string find_shim(std::string *err) {
  // Being told wins, and is not second-guessed: a path that names no file is an error.
  if (const char *e = std::getenv("CUMEMGUARD_SHIM_PATH"); e && *e) {
    // Made absolute: LD_PRELOAD is read by every process of the run, in whatever directory it
    // runs, and a relative name there preloads nothing once a process changes directory.
    if (exists(e)) {
      if (*e == '/') return e;
      char cwd[PATH_MAX];
      return getcwd(cwd, sizeof cwd) ? std::string(cwd) + "/" + e : std::string(e);
    }
    if (err) *err = std::string("CUMEMGUARD_SHIM_PATH=") + e + " is not a file";
    return {};
  }
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::vector<std::string> candidates;
  if (n > 0) {
    const std::string exe_dir = dir_of(std::string(buf, static_cast<std::size_t>(n)));
    const std::string dir_name = exe_dir.substr(exe_dir.rfind('/') + 1);
    if (dir_name == "tools") {
      // A build tree (or a bundle of one, tools/gpu-bundle): the shim beside it in shim/.
      candidates.push_back(exe_dir + "/../shim/" CMG_SHIM_NAME);
    } else {
      // Installed: bindir and libdir share the prefix, so the library is found relative to the
      // program (an install moved or staged under DESTDIR still finds its own), then where the
      // install put it. Never a build tree's.
      std::string bindir = CMG_INSTALL_BINDIR, libdir = CMG_INSTALL_LIBDIR;
      auto slash = bindir.rfind('/');
      std::string prefix = slash == std::string::npos ? "" : bindir.substr(0, slash);
      if (!prefix.empty() && libdir.rfind(prefix, 0) == 0)
        candidates.push_back(exe_dir + "/.." + libdir.substr(prefix.size()) + "/" CMG_SHIM_NAME);
      candidates.push_back(std::string(CMG_INSTALL_LIBDIR) + "/" CMG_SHIM_NAME);
    }
  }
  for (const auto &c : candidates) {
    char real[PATH_MAX];
    if (exists(c) && realpath(c.c_str(), real)) return real;
  }
  if (err) {
    *err = "cannot find " CMG_SHIM_NAME " (looked in";
    for (const auto &c : candidates) *err += " " + c;
    *err += "; set CUMEMGUARD_SHIM_PATH)";
  }
  return {};
}

namespace {

// What the shim would make of these CUMEMGUARD_* settings, checked here so that one that cannot
// apply (an unknown name, a bad value, a malformed CUMEMGUARD_OPTIONS entry) stops the run with a
// line saying so, instead of becoming a warning in the program and the shim's default. A name set
// twice is let through: the shim says which entry it used, and uses it.
bool check_options(const std::vector<std::pair<std::string_view, std::string_view>> &kv,
                   const std::string &label) {
  if (kv.empty()) return true;
  const std::vector<std::string> lines = run_refusals(parse_options(kv));
  for (const std::string &line : lines)
    std::fprintf(stderr, "cumemguard run: %s: %s; the program was not started\n", label.c_str(),
                 line.c_str());
  return lines.empty();
}

// The CUMEMGUARD_* entries of the environment the program starts with.
std::vector<std::pair<std::string_view, std::string_view>> environment_options() {
  std::vector<std::pair<std::string_view, std::string_view>> kv;
  for (char **e = environ; e && *e; ++e) {
    std::string_view s(*e);
    const std::size_t eq = s.find('=');
    if (eq != std::string_view::npos &&
        (has_option_prefix(s) || !misspelt_prefix_meant(s.substr(0, eq)).empty()))
      kv.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }
  return kv;
}

// Signals for the program. A terminal sends SIGINT, SIGQUIT (and SIGHUP at hang-up) to its whole
// foreground process group, the program included (si_code SI_KERNEL): passing those on would
// deliver them twice. One sent to the launcher alone (kill, a scheduler; SI_USER, SI_QUEUE,
// SI_TKILL) is passed on.
void forward_info(int sig, siginfo_t *info, void *) {
  if (g_child <= 0 || (info && info->si_code == SI_KERNEL)) return;
  kill(g_child, sig);
}

// Dies of the program's signal, so the caller (a shell, a scheduler) sees what the program did,
// without a core file of its own: one would replace the program's (core_pattern "core" names the
// same file in the same directory), and a core of the launcher tells nothing. RLIMIT_CORE 0 stops
// a core written to a file; a core_pattern that pipes to a helper (systemd-coredump, apport)
// ignores that limit unless it is 1, so the launcher also makes itself not dumpable, which the
// kernel checks before any core is written.
[[noreturn]] void die_of(int sig) {
  std::fflush(nullptr);
  const struct rlimit none {0, 0};
  (void)setrlimit(RLIMIT_CORE, &none);
  (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  signal(sig, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  raise(sig);
  _exit(128 + sig);  // a signal whose default action is not to end the process
}

// run's options up to PROGRAM (or --), through the reader `cumemguard config --run` shares
// (run_args.h). `prog`: the index of PROGRAM in argv; `done` >= 0: the status to return without
// running anything.
RunArgs parse_args(int argc, char **argv, int &prog, int &done) {
  RunArgs r;
  int i = 0;
  for (; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.size() < 2 || a[0] != '-') break;
    std::string err;
    const RunOptionRead got = read_run_option(argc, argv, i, r, "run", err);
    if (got == RunOptionRead::NotOne) {
      std::fprintf(stderr, "cumemguard run: unknown option '%s'%s (see cumemguard run --help)\n",
                   argv[i], cli::option_hint(cli::command("run"), a).c_str());
      done = kUsage;
      return r;
    }
    if (got == RunOptionRead::Bad) {
      std::fprintf(stderr, "cumemguard run: %s\n", err.c_str());
      done = kUsage;
      return r;
    }
    if (r.help) {
      usage(stdout);
      done = 0;
      return r;
    }
    if (r.version) {
      std::printf("cumemguard run %s\n", CMG_VERSION);
      done = 0;
      return r;
    }
  }
  if (i >= argc) {
    std::fprintf(stderr, "cumemguard run: no program given (see cumemguard run --help)\n");
    done = kUsage;
    return r;
  }
  prog = i;
  return r;
}

}  // namespace

int run_main(int argc, char **argv) {
  int prog_index = -1, done = -1;
  const RunArgs a = parse_args(argc, argv, prog_index, done);
  if (done >= 0) return done;
  const RunChecked checked = check_run_args(a, "the program was not started");
  for (const std::string &line : checked.refusals)
    std::fprintf(stderr, "cumemguard run: %s\n", line.c_str());
  if (!checked.refusals.empty()) return kUsage;
  const int error_exitcode = checked.error_exitcode;
  const auto &sets = checked.sets;
  std::string why;
  std::string shim = find_shim(&why);
  if (shim.empty()) {
    std::fprintf(stderr, "cumemguard run: %s\n", why.c_str());
    return kNoInput;
  }
  if (const std::string p = shim_file_problem(shim); !p.empty()) {
    std::fprintf(stderr, "cumemguard run: %s is not " CMG_SHIM_NAME ": %s; the program was not "
                         "started\n", shown(shim).c_str(), p.c_str());
    return kNoInput;
  }
  for (const auto &[name, value] : sets) setenv(name.c_str(), value.c_str(), 1);
  const std::string prog = argv[prog_index];
  setenv("LD_PRELOAD",
         preload_with(shim, std::getenv("LD_PRELOAD"), program_sanitizer_runtimes(prog)).c_str(),
         1);
  // The settings of the launcher's options, then its defaults where the user set nothing (by a
  // variable or an entry of CUMEMGUARD_OPTIONS): the same list `cumemguard config --run` shows.
  const ParsedOptions user = parse_options(environ);
  char cwd[PATH_MAX];
  for (const RunDefault &d : run_exports(a, user, prog, getcwd(cwd, sizeof cwd) ? cwd : "."))
    setenv(d.name.c_str(), d.value.c_str(), 1);
  // The entry of CUMEMGUARD_OPTIONS as well as the variable: the entry was let through unplanned
  // (torch_alloc_conf=bogus started the program, status 0).
  const TorchOverride torch = torch_override(user, sets);
  if (!apply_torch_override(torch.label, torch.value, torch.entry)) return kUsage;
  // Unique per launch: the pid of the launcher and the start time in ns. A launcher inside another
  // launcher's program (CUMEMGUARD_STATUS_DIR set by it) is part of that run: its logs keep the
  // outer run's id, so that `cumemguard report` over the outer launcher's list reads one run.
  const char *outer_status = std::getenv("CUMEMGUARD_STATUS_DIR");
  const char *outer_run = std::getenv("CUMEMGUARD_RUN_ID");
  if (!(outer_status && *outer_status == '/' && outer_run && *outer_run)) {
    struct timespec now {};
    clock_gettime(CLOCK_REALTIME, &now);
    const std::string run_id = std::to_string(getpid()) + "-" +
                               std::to_string(now.tv_sec * 1000000000LL + now.tv_nsec);
    setenv("CUMEMGUARD_RUN_ID", run_id.c_str(), 1);
  }

  // The whole environment the program starts with, as the shim will read it: the same rule as
  // for -e (what the launcher set itself is valid).
  if (!check_options(environment_options(), "environment")) return kUsage;
  const Options eff = parse_options(environ).options;
  const EnvRefusal refusal =
      program_env_refusal(a, user, eff, [](const char *n) -> const char * { return std::getenv(n); },
                          "the program was not started");
  if (refusal.status) {
    std::fprintf(stderr, "cumemguard run: %s\n", refusal.line.c_str());
    return refusal.status;
  }
  const std::string disabled = disabled_warning(error_exitcode != 0);
  if (!disabled.empty()) std::fprintf(stderr, "cumemguard run: %s\n", disabled.c_str());
  // A launcher inside another launcher's program: what it counts goes up to the outer one too.
  const char *outer = std::getenv("CUMEMGUARD_STATUS_DIR");
  const std::string outer_dir = outer && *outer == '/' ? outer : "";
  std::string status_err;
  const std::string status_dir = make_status_dir(status_err);
  if (status_dir.empty()) {
    if (error_exitcode) {
      std::fprintf(stderr, "cumemguard run: cannot make the run's status directory (%s), which "
                           "--error-exitcode reads the findings from; set TMPDIR\n",
                   status_err.c_str());
      return kCantCreate;
    }
    std::fprintf(stderr, "cumemguard run: warning: cannot make the run's status directory (%s); "
                         "the logs of the run are not listed\n",
                 status_err.c_str());
    unsetenv("CUMEMGUARD_STATUS_DIR");
  } else {
    setenv("CUMEMGUARD_STATUS_DIR", status_dir.c_str(), 1);
  }

  // The launcher passes termination, terminal and user signals on to the program, so `kill
  // <launcher>` (a job scheduler's SIGTERM, a script's SIGINT) stops the program rather than
  // orphaning it, and the launcher itself waits for the program's status. Installed before the
  // fork with the child not yet known (a signal then is kept pending by the mask until it is).
  struct sigaction fwd {}, old[6];
  const int forwarded[6] = {SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2};
  fwd.sa_sigaction = forward_info;
  // No SA_RESTART: waitpid() returns EINTR and the loop below waits again. A sanitizer runtime that
  // runs handlers only when an intercepted call returns (ThreadSanitizer) would otherwise hold the
  // signal until the program exits on its own.
  fwd.sa_flags = SA_SIGINFO;
  sigemptyset(&fwd.sa_mask);
  sigset_t block, unblocked;
  sigemptyset(&block);
  for (int sig : forwarded) sigaddset(&block, sig);
  sigprocmask(SIG_BLOCK, &block, &unblocked);
  for (int k = 0; k < 6; ++k) {
    sigaction(forwarded[k], nullptr, &old[k]);
    // A signal the launcher was started ignoring (nohup, a background job) stays ignored for it
    // and for the program, as it would be without the launcher.
    if (old[k].sa_handler != SIG_IGN) sigaction(forwarded[k], &fwd, nullptr);
  }
  const pid_t launcher = getpid();
  // Written by the child when exec fails (closed by a successful exec): a program that never ran
  // is not one that ran without the shim.
  int exec_err[2] = {-1, -1};
  if (pipe2(exec_err, O_CLOEXEC) != 0) exec_err[0] = exec_err[1] = -1;
  pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "cumemguard run: fork: %s\n", std::strerror(errno));
    if (!status_dir.empty()) remove_status_dir(status_dir);
    return kOsErr;
  }
  if (pid == 0) {
    // A launcher killed outright (SIGKILL from a timeout or subprocess.run(timeout=...)) cannot
    // pass anything on: the program is killed with it rather than left running with parent 1.
    // The parent may have died before the request took effect: then the child goes now.
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != launcher) _exit(128 + SIGKILL);
    for (int k = 0; k < 6; ++k) sigaction(forwarded[k], &old[k], nullptr);
    sigprocmask(SIG_SETMASK, &unblocked, nullptr);
    execvp(prog.c_str(), argv + prog_index);
    const int err = errno;
    if (exec_err[1] >= 0) (void)!::write(exec_err[1], &err, sizeof err);
    errno = err;
    std::fprintf(stderr, "cumemguard run: cannot run %s: %s\n", prog.c_str(), std::strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
  }
  g_child = pid;
  if (exec_err[1] >= 0) ::close(exec_err[1]);
  sigprocmask(SIG_SETMASK, &unblocked, nullptr);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child = 0;
  for (int k = 0; k < 6; ++k) sigaction(forwarded[k], &old[k], nullptr);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

  RunTotals t;
  if (!status_dir.empty()) {
    t = read_status_dir(status_dir);
    remove_status_dir(status_dir);
  }
  if (!outer_dir.empty() && outer_dir != status_dir) pass_up_totals(outer_dir, t);
  if (!t.logs.empty()) {
    std::string all;
    for (const auto &l : t.logs) all += " " + l;
    std::fprintf(stderr, "cumemguard: %zu log%s:%s\ncumemguard: read with: %s report%s\n",
                 t.logs.size(), t.logs.size() == 1 ? "" : "s", all.c_str(),
                 self_command().c_str(), all.c_str());
  }
  // A process of the run without its exit records: its log stops where it was cut, and its leaks
  // were never counted. Said by the launcher, as no process of the run could say it (at most 8
  // lines, then a count).
  for (std::size_t i = 0; i < t.unfinished.size() && i < 8; ++i) {
    const auto &u = t.unfinished[i];
    const bool alive = ::kill(static_cast<pid_t>(u.pid), 0) == 0 && !zombie(u.pid);
    std::fprintf(stderr, "cumemguard: pid %lld %s%s%s\n", static_cast<long long>(u.pid),
                 alive ? "is still running after the program ended: its exit records are not "
                         "written yet"
                       : "ended without its exit records (killed by SIGKILL or the "
                         "out-of-memory killer, an exec of a program that made no CUDA call, or "
                         "the exit_group system call itself): its leaks are not known",
                 u.log.empty() ? "" : "; its log stops there: ", u.log.c_str());
  }
  if (t.unfinished.size() > 8)
    std::fprintf(stderr, "cumemguard: %zu more processes without their exit records\n",
                 t.unfinished.size() - 8);
  if (t.unreadable)
    std::fprintf(stderr, "cumemguard: warning: %zu entr%s of the run's status directory %s not a "
                         "process's status; the counts are those of the other %zu\n",
                 t.unreadable, t.unreadable == 1 ? "y" : "ies", t.unreadable == 1 ? "was" : "were",
                 t.processes);
  int err = 0;
  const bool exec_failed = exec_err[0] >= 0 && ::read(exec_err[0], &err, sizeof err) > 0;
  if (exec_err[0] >= 0) ::close(exec_err[0]);
  std::string unloaded;
  if (!status_dir.empty() && !exec_failed && disabled.empty())
    unloaded = unloaded_warning(t.processes, t.loaded, error_exitcode);
  if (!unloaded.empty()) std::fprintf(stderr, "cumemguard: %s\n", unloaded.c_str());
  if (WIFSIGNALED(status)) die_of(WTERMSIG(status));
  if (!unloaded.empty() && error_exitcode) return error_exitcode;
  // A gate over a run the shim was told not to check: it found nothing because it looked at nothing.
  if (!disabled.empty() && error_exitcode) {
    std::fprintf(stderr, "cumemguard: the shim was disabled in this run; exiting %d "
                         "(--error-exitcode)\n", error_exitcode);
    return error_exitcode;
  }
  // --fail-on-leaks cannot count what was never checked: said, not guessed (a DataLoader's
  // workers end by _exit; failing every such run would make the gate useless).
  if (a.fail_on_leaks && t.leaks_unchecked)
    std::fprintf(stderr, "cumemguard: %zu process%s ended by _exit: %s leaks were not checked and "
                         "are not in --fail-on-leaks' count\n",
                 t.leaks_unchecked, t.leaks_unchecked == 1 ? "" : "es",
                 t.leaks_unchecked == 1 ? "its" : "their");
  // Nor what a crash ended before the exit's check (the crash summary writes counts, not leaks).
  if (a.fail_on_leaks && t.signalled)
    std::fprintf(stderr, "cumemguard: %zu process%s ended by a fatal signal: %s leaks were not "
                         "checked and are not in --fail-on-leaks' count\n",
                 t.signalled, t.signalled == 1 ? "" : "es", t.signalled == 1 ? "its" : "their");
  if (error_exitcode) {
    const std::uint64_t counted = t.findings + (a.fail_on_leaks ? t.leaks : 0);
    if (counted) {
      std::fprintf(stderr, "cumemguard: %llu finding%s%s in this run; exiting %d "
                           "(--error-exitcode)\n",
                   static_cast<unsigned long long>(counted), counted == 1 ? "" : "s",
                   a.fail_on_leaks && t.leaks ? " (leaks at exit included)" : "", error_exitcode);
      return error_exitcode;
    }
  }
  return code;
}

}  // namespace cmg::tools
