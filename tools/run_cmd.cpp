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
               "usage: cumemguard run [options] [--] PROGRAM [ARGS...]\n"
               "\n"
               "Runs PROGRAM with libcumemguard.so preloaded (its children inherit it).\n"
               "\n"
               "options:\n"
               "  --log PATH        event log path (%%p pid, %%r rank, %%%% a percent sign); default\n"
               "                    cumemguard.<program>.%%p.log in the current directory\n"
               "  --no-log          write no event log\n"
               "  --mode MODE       guard (default), report or strict\n"
               "  --stacks N        capture N return addresses per event (0 = off, at most 64)\n"
               "  --no-summary      do not print the exit summary\n"
               "  -e NAME=VALUE     set an environment variable for the program (repeatable)\n"
               "  -h, --help        this help\n");
}

std::string dir_of(const std::string &p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

volatile sig_atomic_t g_child = 0;

// The launcher passes termination and user signals on to the program, so `kill <launcher>` (a job
// scheduler's SIGTERM) stops the program rather than orphaning it.
void forward(int sig) {
  if (g_child > 0) kill(g_child, sig);
}

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

// The LD_PRELOAD the program gets: the shim first, so its definitions win, and what was already
// preloaded keeps its order after it; except a sanitizer runtime, which stays in front (ASan and
// TSan abort when their runtime is not the first library: "ASan runtime does not come first"; a
// program that links the runtime itself needs ASAN_OPTIONS=verify_asan_link_order=0 under any
// preload).
namespace {
std::string preload_with(const std::string &shim, const char *old) {
  std::vector<std::string> front, back;
  std::string cur;
  const std::string list = old ? old : "";
  for (std::size_t i = 0; i <= list.size(); ++i) {
    // ld.so separates LD_PRELOAD entries by colons or spaces.
    if (i == list.size() || list[i] == ':' || list[i] == ' ') {
      if (!cur.empty()) {
        const std::size_t slash = cur.rfind('/');
        const std::string base = slash == std::string::npos ? cur : cur.substr(slash + 1);
        const bool runtime = base.starts_with("libasan.") || base.starts_with("libtsan.") ||
                             base.starts_with("libhwasan.") ||
                             base.starts_with("libclang_rt.asan") ||
                             base.starts_with("libclang_rt.hwasan") ||
                             base.starts_with("libclang_rt.tsan");
        (runtime ? front : back).push_back(cur);
      }
      cur.clear();
    } else {
      cur += list[i];
    }
  }
  std::string out;
  for (const auto &e : front) out += e + ":";
  out += shim;
  for (const auto &e : back) out += ":" + e;
  return out;
}
}  // namespace

std::string find_shim() {
  if (const char *e = std::getenv("CUMEMGUARD_SHIM_PATH"); e && *e && exists(e)) return e;
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::vector<std::string> candidates;
  if (n > 0) {
    std::string exe_dir = dir_of(std::string(buf, static_cast<std::size_t>(n)));
    candidates.push_back(exe_dir + "/../shim/" CMG_SHIM_NAME);  // build tree
    // Installed: bindir and libdir share the prefix.
    std::string bindir = CMG_INSTALL_BINDIR, libdir = CMG_INSTALL_LIBDIR;
    std::string prefix_rel = exe_dir + "/..";
    auto slash = bindir.rfind('/');
    std::string prefix = slash == std::string::npos ? "" : bindir.substr(0, slash);
    if (!prefix.empty() && libdir.rfind(prefix, 0) == 0)
      candidates.push_back(prefix_rel + libdir.substr(prefix.size()) + "/" CMG_SHIM_NAME);
  }
  candidates.push_back(std::string(CMG_INSTALL_LIBDIR) + "/" CMG_SHIM_NAME);
  candidates.push_back(std::string(CMG_BUILD_SHIM_DIR) + "/" CMG_SHIM_NAME);
  for (const auto &c : candidates) {
    char real[PATH_MAX];
    if (exists(c) && realpath(c.c_str(), real)) return real;
  }
  return {};
}

int run_main(int argc, char **argv) {
  std::string log, mode, stacks;
  bool no_log = false, no_summary = false;
  std::vector<std::string> env_sets;
  int i = 0;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto need = [&](const char *what) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cumemguard run: %s needs a value\n", what);
        std::exit(64);
      }
      return argv[++i];
    };
    if (a == "--") {
      ++i;
      break;
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (a == "--log") {
      log = need("--log");
    } else if (a.rfind("--log=", 0) == 0) {
      log = a.substr(6);
    } else if (a == "--no-log") {
      no_log = true;
    } else if (a == "--mode") {
      mode = need("--mode");
    } else if (a.rfind("--mode=", 0) == 0) {
      mode = a.substr(7);
    } else if (a == "--stacks") {
      stacks = need("--stacks");
    } else if (a == "--no-summary") {
      no_summary = true;
    } else if (a == "-e") {
      env_sets.push_back(need("-e"));
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
  if (!stacks.empty()) {
    // Checked by the options table the shim reads, so that a bad value stops here instead of
    // turning stacks off in the program with a warning.
    const std::pair<std::string_view, std::string_view> kv[] = {{"CUMEMGUARD_STACKS", stacks}};
    const auto parsed = parse_options(kv);
    if (!parsed.problems.empty()) {
      const std::string &why = parsed.problems.front();  // "...; keeping '0'": not here
      std::fprintf(stderr, "cumemguard run: --stacks: %s\n",
                   why.substr(0, why.find("; keeping")).c_str());
      return 64;
    }
  }
  std::string shim = find_shim();
  if (shim.empty()) {
    std::fprintf(stderr, "cumemguard run: cannot find %s (set CUMEMGUARD_SHIM_PATH)\n",
                 CMG_SHIM_NAME);
    return 70;
  }
  for (const auto &kv : env_sets) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::fprintf(stderr, "cumemguard run: -e expects NAME=VALUE, got '%s'\n", kv.c_str());
      return 64;
    }
    setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  setenv("LD_PRELOAD", preload_with(shim, std::getenv("LD_PRELOAD")).c_str(), 1);
  if (!mode.empty()) setenv("CUMEMGUARD_MODE", mode.c_str(), 1);
  if (!stacks.empty()) setenv("CUMEMGUARD_STACKS", stacks.c_str(), 1);
  if (!no_summary && !std::getenv("CUMEMGUARD_SUMMARY")) setenv("CUMEMGUARD_SUMMARY", "1", 1);
  std::string prog = argv[i];
  std::string base = prog.substr(prog.rfind('/') == std::string::npos ? 0 : prog.rfind('/') + 1);
  if (no_log) {
    unsetenv("CUMEMGUARD_LOG");
  } else if (!log.empty()) {
    setenv("CUMEMGUARD_LOG", absolute(log).c_str(), 1);
  } else if (!std::getenv("CUMEMGUARD_LOG")) {
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
  const char *pattern_env = std::getenv("CUMEMGUARD_LOG");
  std::string pattern = pattern_env ? pattern_env : "";

  // Like system(3): the launcher ignores terminal signals while the program runs (it gets them).
  struct sigaction ign {}, old_int {}, old_quit {};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGINT, &ign, &old_int);
  sigaction(SIGQUIT, &ign, &old_quit);
  pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "cumemguard run: fork: %s\n", std::strerror(errno));
    return 71;
  }
  if (pid == 0) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGQUIT, &old_quit, nullptr);
    execvp(prog.c_str(), argv + i);
    std::fprintf(stderr, "cumemguard run: cannot run %s: %s\n", prog.c_str(), std::strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
  }
  g_child = pid;
  struct sigaction fwd {};
  fwd.sa_handler = forward;
  sigemptyset(&fwd.sa_mask);
  for (int sig : {SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaction(sig, &fwd, nullptr);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child = 0;
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGQUIT, &old_quit, nullptr);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

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
    std::vector<std::string> logs;
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
  return code;
}

}  // namespace cmg::tools
