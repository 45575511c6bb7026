// SPDX-License-Identifier: Apache-2.0
// `cumemguard run`: runs a program with the shim preloaded, passes its exit status through, and
// says where the logs went and how to read them (heaptrack's launcher habit).
#include "run_cmd.h"

#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cmg_config.h"
#include "options.h"
#include "run_preload.h"
#include "torch_conf.h"

extern char **environ;

namespace cmg::tools {
namespace {

// True when the log's header line carries this run's CUMEMGUARD_RUN_ID: the pattern's glob also
// matches logs of earlier or concurrent runs in the same directory, which are not ours to list.
bool log_of_run(const char *path, const std::string &run_id) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return false;
  auto h = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!h.is_object()) return false;
  auto o = h.find("options");
  if (o == h.end() || !o->is_object()) return false;
  auto id = o->find("CUMEMGUARD_RUN_ID");
  return id != o->end() && id->is_string() && id->get<std::string>() == run_id;
}

void usage(FILE *f) {
  std::fprintf(f,
               "Usage: cumemguard run [options] [--] PROGRAM [ARGS...]\n"
               "\n"
               "Runs PROGRAM with libcumemguard.so preloaded (its children inherit it), passes its\n"
               "exit status through, prints the exit summary and lists the event logs of the run.\n"
               "The program gets the debug profile (stacks at every event, a quarantine of freed\n"
               "memory) unless CUMEMGUARD_PROFILE or a profile entry of CUMEMGUARD_OPTIONS is set.\n"
               "A sanitizer runtime the program links (-fsanitize=address or thread) is preloaded\n"
               "in front of the shim, as the sanitizer requires.\n"
               "\n"
               "Options:\n"
               "  --log PATH        event log path (%%p pid, %%r rank, %%%% a percent sign); default\n"
               "                    cumemguard.<program>.%%p.log in the current directory\n"
               "  --no-log          write no event log\n"
               "  --mode MODE       guard (default), report or strict\n"
               "  --stacks N        capture N return addresses per event (0 = off, at most 64)\n"
               "  --no-summary      do not print the exit summary\n"
               "  --error-exitcode N\n"
               "                    exit N when the run had findings (read from this run's logs;\n"
               "                    suppressed findings do not count), as valgrind does\n"
               "  --fail-on-leaks   with --error-exitcode, count leaks at exit as findings too\n"
               "  -e NAME=VALUE     set an environment variable for the program (repeatable); a\n"
               "                    CUMEMGUARD_* value is checked against the options table first\n"
               "  -h, --help        this help\n"
               "  --version         print the version\n"
               "\n"
               "Exit status:\n"
               "  N    with --error-exitcode N, when the run's logs hold findings (unless the\n"
               "       program was killed by a signal: the launcher then dies of the same signal)\n"
               "  64   bad options or arguments\n"
               "  66   the shim cannot be found or read (CUMEMGUARD_SHIM_PATH names no file)\n"
               "  126  PROGRAM is not executable; 127 PROGRAM not found\n"
               "  otherwise the program's own status (or the signal that killed it, raised again)\n"
               "\n"
               "A process that never calls CUDA writes no log and has no findings. SIGTERM, SIGINT,\n"
               "SIGQUIT, SIGHUP, SIGUSR1 and SIGUSR2 sent to the launcher are passed on to the\n"
               "program (a terminal's SIGINT and SIGQUIT already reach it).\n"
               "\n"
               "Environment:\n"
               "  CUMEMGUARD_SHIM_PATH  the libcumemguard.so to preload instead of the one installed\n"
               "                        beside this program\n");
}

std::string dir_of(const std::string &p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

volatile sig_atomic_t g_child = 0;


std::string absolute(const std::string &p) {
  if (p.empty() || p[0] == '/') return p;
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof cwd)) return p;
  return std::string(cwd) + "/" + p;
}

// CUMEMGUARD_TORCH_ALLOC_CONF is applied here, before exec, as well as by the shim at load: a
// program linked against libtorch initialises libc10_cuda.so before a preloaded library's
// constructor runs, so only the launcher is early enough for it.
void apply_torch_override() {
  const char *ov = std::getenv("CUMEMGUARD_TORCH_ALLOC_CONF");
  if (!ov || !*ov) return;
  try {
    auto env = cmg::torchconf::Env::from_envp(environ);
    auto plan = cmg::torchconf::plan(env, ov);
    if (plan.action != cmg::torchconf::PlanAction::Write) return;
    for (const auto &w : plan.writes)
      setenv(std::string(cmg::torchconf::var_name(w.var)).c_str(), w.new_value.c_str(), 1);
  } catch (...) {
    // The shim reports what it cannot apply; the launcher leaves the environment as it is.
  }
}

bool exists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::string find_shim(std::string *err) {
  // Being told wins, and is not second-guessed: a path that names no file is an error.
  if (const char *e = std::getenv("CUMEMGUARD_SHIM_PATH"); e && *e) {
    if (exists(e)) return e;
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

// Findings in this run's logs, as the exit status counts them: `finding` records that are not
// suppressed (leaks are `leak` records, counted only when asked). Lines are checked by their
// opening bytes (the writer puts "k" first) before any is parsed: a log is mostly call records.
struct LogCounts {
  std::uint64_t findings = 0, leaks = 0;
};

LogCounts count_findings(const std::vector<std::string> &logs) {
  LogCounts c;
  for (const auto &l : logs) {
    std::ifstream in(l);
    std::string line;
    while (std::getline(in, line)) {
      if (line.starts_with(R"({"k":"leak")")) {
        ++c.leaks;
      } else if (line.starts_with(R"({"k":"finding")")) {
        auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_object() && !j.contains("suppressed")) ++c.findings;
      }
    }
  }
  return c;
}

// `--log --`: an option's value is never the end of the options (a log named "--" is a mistake).
bool take_value(int argc, char **argv, int &i, const char *what, std::string &out) {
  if (i + 1 >= argc || std::strcmp(argv[i + 1], "--") == 0) {
    std::fprintf(stderr, "cumemguard run: %s needs a value (see cumemguard run --help)\n", what);
    return false;
  }
  out = argv[++i];
  return true;
}

// What a CUMEMGUARD_* setting given to the launcher would make the shim say, checked here so that
// a value that cannot apply stops the run instead of becoming a warning in the program.
bool check_options(const std::vector<std::pair<std::string, std::string>> &sets,
                   const char *label) {
  std::vector<std::pair<std::string_view, std::string_view>> kv;
  for (const auto &[n, v] : sets)
    if (n.starts_with(kOptionPrefix)) kv.emplace_back(n, v);
  if (kv.empty()) return true;
  const auto parsed = parse_options(kv);
  for (const std::string &why : parsed.problems) {
    // "...; keeping '0'" describes the shim's fallback, not what happens here.
    std::fprintf(stderr, "cumemguard run: %s: %s\n", label,
                 why.substr(0, why.rfind("; keeping")).c_str());
    return false;
  }
  return true;
}

// Signals for the program. A terminal sends SIGINT, SIGQUIT (and SIGHUP at hang-up) to its whole
// foreground process group, the program included (si_code SI_KERNEL): passing those on would
// deliver them twice. One sent to the launcher alone (kill, a scheduler; SI_USER, SI_QUEUE,
// SI_TKILL) is passed on.
void forward_info(int sig, siginfo_t *info, void *) {
  if (g_child <= 0 || (info && info->si_code == SI_KERNEL)) return;
  kill(g_child, sig);
}

}  // namespace

int run_main(int argc, char **argv) {
  std::string log, mode, stacks, exitcode_arg;
  bool no_log = false, no_summary = false, fail_on_leaks = false;
  std::vector<std::string> env_sets;
  int i = 0;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (a == "--version") {
      std::printf("cumemguard run %s\n", CMG_VERSION);
      return 0;
    } else if (a == "--log") {
      if (!take_value(argc, argv, i, "--log", log)) return 64;
    } else if (a.rfind("--log=", 0) == 0) {
      log = a.substr(6);
    } else if (a == "--no-log") {
      no_log = true;
    } else if (a == "--mode") {
      if (!take_value(argc, argv, i, "--mode", mode)) return 64;
    } else if (a.rfind("--mode=", 0) == 0) {
      mode = a.substr(7);
    } else if (a == "--stacks") {
      if (!take_value(argc, argv, i, "--stacks", stacks)) return 64;
    } else if (a.rfind("--stacks=", 0) == 0) {
      stacks = a.substr(9);
    } else if (a == "--error-exitcode") {
      if (!take_value(argc, argv, i, "--error-exitcode", exitcode_arg)) return 64;
    } else if (a.rfind("--error-exitcode=", 0) == 0) {
      exitcode_arg = a.substr(17);
    } else if (a == "--fail-on-leaks") {
      fail_on_leaks = true;
    } else if (a == "--no-summary") {
      no_summary = true;
    } else if (a == "-e") {
      std::string v;
      if (!take_value(argc, argv, i, "-e", v)) return 64;
      env_sets.push_back(v);
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "cumemguard run: unknown option '%s' (see cumemguard run --help)\n",
                   a.c_str());
      return 64;
    } else {
      break;
    }
  }
  if (i >= argc) {
    std::fprintf(stderr, "cumemguard run: no program given (see cumemguard run --help)\n");
    return 64;
  }
  if (!mode.empty() && mode != "guard" && mode != "report" && mode != "strict") {
    std::fprintf(stderr, "cumemguard run: --mode must be guard, report or strict, not '%s'\n",
                 mode.c_str());
    return 64;
  }
  int error_exitcode = 0;
  if (!exitcode_arg.empty()) {
    char *end = nullptr;
    long v = std::strtol(exitcode_arg.c_str(), &end, 10);
    if (!end || *end || v < 0 || v > 255) {
      std::fprintf(stderr, "cumemguard run: --error-exitcode must be 0 to 255, not '%s'\n",
                   exitcode_arg.c_str());
      return 64;
    }
    error_exitcode = static_cast<int>(v);
  }
  if (fail_on_leaks && !error_exitcode) {
    std::fprintf(stderr, "cumemguard run: --fail-on-leaks needs --error-exitcode N\n");
    return 64;
  }
  if (error_exitcode && no_log) {
    // The findings are read from the logs: without them the status could only say "none".
    std::fprintf(stderr, "cumemguard run: --error-exitcode counts the findings in the event log; "
                         "it cannot be used with --no-log\n");
    return 64;
  }
  // Checked by the options table the shim reads, so that a bad value stops here instead of
  // turning into a warning in the program (and the shim's default).
  if (!stacks.empty() && !check_options({{"CUMEMGUARD_STACKS", stacks}}, "--stacks")) return 64;
  std::vector<std::pair<std::string, std::string>> sets;
  for (const auto &kv : env_sets) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::fprintf(stderr, "cumemguard run: -e expects NAME=VALUE, got '%s'\n", kv.c_str());
      return 64;
    }
    sets.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  for (const auto &kv : sets)
    if (!check_options({kv}, ("-e " + kv.first + "=" + shown(kv.second)).c_str())) return 64;
  std::string why;
  std::string shim = find_shim(&why);
  if (shim.empty()) {
    std::fprintf(stderr, "cumemguard run: %s\n", why.c_str());
    return 66;
  }
  for (const auto &[name, value] : sets) setenv(name.c_str(), value.c_str(), 1);
  std::string prog = argv[i];
  setenv("LD_PRELOAD",
         preload_with(shim, std::getenv("LD_PRELOAD"), program_sanitizer_runtimes(prog)).c_str(),
         1);
  if (!mode.empty()) setenv("CUMEMGUARD_MODE", mode.c_str(), 1);
  if (!stacks.empty()) setenv("CUMEMGUARD_STACKS", stacks.c_str(), 1);
  // What the user set, by a variable or an entry of CUMEMGUARD_OPTIONS, is left as it is.
  const ParsedOptions user = parse_options(environ);
  auto set_by_user = [&](std::string_view name) {
    for (const auto &v : user.values)
      if (v.spec->name == name)
        return v.source == OptionSource::Environment || v.source == OptionSource::Options;
    return false;
  };
  if (!no_summary && !set_by_user("SUMMARY")) setenv("CUMEMGUARD_SUMMARY", "1", 1);
  // The debug profile unless the user chose one.
  if (user.profile_source == OptionSource::Default) setenv("CUMEMGUARD_PROFILE", "debug", 1);
  std::string base = prog.substr(prog.rfind('/') == std::string::npos ? 0 : prog.rfind('/') + 1);
  if (no_log) {
    setenv("CUMEMGUARD_LOG", "", 1);  // empty: no log, and it wins over a CUMEMGUARD_OPTIONS entry
  } else if (!log.empty()) {
    setenv("CUMEMGUARD_LOG", absolute(log).c_str(), 1);
  } else if (!set_by_user("LOG")) {
    // Absolute, so a program that changes directory still writes where the launcher looks.
    log = absolute("cumemguard." + base + ".%p.log");
    setenv("CUMEMGUARD_LOG", log.c_str(), 1);
  }
  apply_torch_override();
  // Unique per launch: the pid of the launcher and the start time in ns.
  struct timespec now {};
  clock_gettime(CLOCK_REALTIME, &now);
  const std::string run_id = std::to_string(getpid()) + "-" +
                             std::to_string(now.tv_sec * 1000000000LL + now.tv_nsec);
  setenv("CUMEMGUARD_RUN_ID", run_id.c_str(), 1);
  // The log pattern the program will use, however it was given.
  const std::string pattern = parse_options(environ).options.log;

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
  pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "cumemguard run: fork: %s\n", std::strerror(errno));
    return 71;
  }
  if (pid == 0) {
    for (int k = 0; k < 6; ++k) sigaction(forwarded[k], &old[k], nullptr);
    sigprocmask(SIG_SETMASK, &unblocked, nullptr);
    execvp(prog.c_str(), argv + i);
    std::fprintf(stderr, "cumemguard run: cannot run %s: %s\n", prog.c_str(), std::strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
  }
  g_child = pid;
  sigprocmask(SIG_SETMASK, &unblocked, nullptr);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child = 0;
  for (int k = 0; k < 6; ++k) sigaction(forwarded[k], &old[k], nullptr);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

  std::vector<std::string> logs;
  if (!pattern.empty()) {
    std::string g;
    for (std::size_t k = 0; k < pattern.size(); ++k) {
      if (pattern[k] == '%' && k + 1 < pattern.size() &&
          (pattern[k + 1] == 'p' || pattern[k + 1] == 'r')) {
        g += '*';
        ++k;
      } else if (pattern[k] == '%' && k + 1 < pattern.size() && pattern[k + 1] == '%') {
        g += '%';
        ++k;
      } else {
        g += pattern[k];
      }
    }
    glob_t gl{};
    if (glob(g.c_str(), 0, nullptr, &gl) == 0) {
      for (std::size_t k = 0; k < gl.gl_pathc; ++k) {
        if (log_of_run(gl.gl_pathv[k], run_id)) logs.emplace_back(gl.gl_pathv[k]);
      }
    }
    globfree(&gl);
    if (!logs.empty()) {
      std::string all;
      for (const auto &l : logs) all += " " + l;
      std::fprintf(stderr, "cumemguard: %zu log%s:%s\ncumemguard: read with: cumemguard report%s\n",
                   logs.size(), logs.size() == 1 ? "" : "s", all.c_str(), all.c_str());
    }
  }
  if (WIFSIGNALED(status)) {
    // Die of the same signal, so the caller (a shell, a scheduler) sees what the program did.
    int sig = WTERMSIG(status);
    std::fflush(nullptr);
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, nullptr);
    raise(sig);
  }
  if (error_exitcode) {
    const LogCounts n = count_findings(logs);
    const std::uint64_t counted = n.findings + (fail_on_leaks ? n.leaks : 0);
    if (counted) {
      std::fprintf(stderr, "cumemguard: %llu finding%s%s in this run; exiting %d "
                           "(--error-exitcode)\n",
                   static_cast<unsigned long long>(counted), counted == 1 ? "" : "s",
                   fail_on_leaks && n.leaks ? " (leaks at exit included)" : "", error_exitcode);
      return error_exitcode;
    }
  }
  return code;
}

}  // namespace cmg::tools
