// SPDX-License-Identifier: Apache-2.0
// Which torch the evaluated environment's interpreter would import, without importing it: the
// interpreter runs importlib.util.find_spec("torch") (a top-level find_spec locates the package and
// executes none of it, so this costs one interpreter start, not torch's import), the version comes
// from the files (policy/torch_version). The interpreter gets the evaluated environment, so
// --env PYTHONPATH=… or a VIRTUAL_ENV's PATH change the answer as they would for the program.
#include "config_torch_version.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>

#include "regular_file.h"

namespace cmg {
namespace {

namespace tc = torchconf;

constexpr const char *kFindSpec =
    "import importlib.util, sys\n"
    "try:\n"
    "    s = importlib.util.find_spec('torch')\n"
    "except Exception:\n"
    "    s = None\n"
    "locs = list(s.submodule_search_locations or []) if s else []\n"
    "sys.stdout.write(locs[0] if locs else '')\n";
constexpr int kTimeoutMs = 20000;

bool executable(const std::string &p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
}

// PATH of the evaluated environment, not of this process (execvp would use ours).
std::optional<std::string> resolve(
    const std::string &name,
    const std::function<std::optional<std::string>(std::string_view)> &getenv) {
  if (name.find('/') != std::string::npos)
    return executable(name) ? std::optional(name) : std::nullopt;
  const std::optional<std::string> path = getenv("PATH");
  if (!path) return std::nullopt;
  std::string_view rest = *path;
  while (true) {
    const std::size_t colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    if (dir.empty()) dir = ".";
    const std::string cand = dir + "/" + name;
    if (executable(cand)) return cand;
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return std::nullopt;
}

// Regular files only, opened without blocking: a FIFO planted as torch/version.py would stop
// `cumemguard config` in open(2) (regular_file.h).
std::optional<std::string> read_small(const std::string &p) {
  return read_regular(p, 1u << 20);
}

std::vector<std::string> list_dir(const std::string &d) {
  std::vector<std::string> out;
  if (DIR *dp = opendir(d.c_str())) {
    while (dirent *e = readdir(dp)) out.emplace_back(e->d_name);
    closedir(dp);
  }
  return out;
}

}  // namespace

std::optional<std::string> torch_package_dir(
    const std::string &python,
    const std::function<std::optional<std::string>(std::string_view)> &getenv,
    const std::vector<std::string> &envp, std::string &why, bool *interpreter_failed) {
  // Every way the interpreter itself fails says so; only "no torch" is an answer from it.
  auto failed = [&](std::string text) -> std::optional<std::string> {
    why = std::move(text);
    if (interpreter_failed) *interpreter_failed = true;
    return std::nullopt;
  };
  const std::optional<std::string> exe = resolve(python, getenv);
  struct stat st {};
  if (!exe && python.find('/') != std::string::npos && stat(python.c_str(), &st) == 0)
    return failed(python + " is not an executable file");
  if (!exe)
    return failed(python + " not found" +
                  (python.find('/') == std::string::npos ? " on PATH" : ""));
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return failed(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char *> argv{const_cast<char *>(exe->c_str()), const_cast<char *>("-c"),
                           const_cast<char *>(kFindSpec), nullptr};
  std::vector<char *> env;
  for (const std::string &e : envp) env.push_back(const_cast<char *>(e.c_str()));
  env.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, exe->c_str(), &fa, nullptr, argv.data(), env.data());
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    return failed("cannot run " + *exe + ": " + std::strerror(rc));
  }
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int n = poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      timed_out = n == 0;
      break;
    }
    char buf[4096];
    const ssize_t got = read(out[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (text.size() < 65536) text.append(buf, static_cast<std::size_t>(got));
  }
  close(out[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    return failed(*exe + " did not answer within " + std::to_string(kTimeoutMs / 1000) + " s");
  if (WIFSIGNALED(status))
    return failed(*exe + " was killed by signal " + std::to_string(WTERMSIG(status)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return failed(*exe + " exited with status " + std::to_string(WEXITSTATUS(status)));
  if (text.empty()) {
    why = "no torch package for " + *exe;
    return std::nullopt;
  }
  return text;
}

TorchChoice choose_torch_version(
    const std::optional<tc::TorchVersion> &requested, const std::string &python,
    const std::function<std::optional<std::string>(std::string_view)> &getenv,
    const std::vector<std::string> &envp) {
  if (requested) return {*requested, "--torch-version"};
  std::string why;
  bool interpreter_failed = false;
  if (std::optional<std::string> dir =
          torch_package_dir(python, getenv, envp, why, &interpreter_failed)) {
    const tc::FileAccess fs{read_small, list_dir};
    if (std::optional<tc::FoundVersion> f = tc::version_of_package(*dir, fs))
      return {f->version, f->source + " (" + python + ")"};
    why = "no version.py or dist-info for " + *dir;
  }
  return {tc::grammar_version(), "default: " + why, interpreter_failed ? why : std::string()};
}

nlohmann::ordered_json version_json(const tc::Judgement &j) {
  return {{"judged", j.version.text},
          {"release", j.version.release()},
          {"source", j.source},
          {"exact", j.exact},
          {"summary", j.summary()}};
}

nlohmann::ordered_json known_problems_json(const tc::Judgement &j) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const tc::KnownProblem &k : j.known)
    a.push_back(
        {{"id", std::string(k.rule->id)},
         {"severity", std::string(tc::severity_name(k.rule->severity))},
         {"message", k.text},
         {"bug", k.rule->bug.empty() ? nlohmann::ordered_json(nullptr)
                                     : nlohmann::ordered_json(std::string(k.rule->bug))},
         {"fixed_in", k.rule->until.empty() ? nlohmann::ordered_json(nullptr)
                                            : nlohmann::ordered_json(std::string(k.rule->until))},
         {"at_run_time", k.rule->at_run_time}});
  return a;
}

nlohmann::ordered_json key_value(const tc::Settings &s, tc::Key k) {
  using tc::Key;
  using json = nlohmann::ordered_json;
  switch (k) {
    case Key::LargeSegmentSizeMb:
      return s.large_segment_size;
    case Key::MaxSplitSizeMb:
      return tc::snapshot_max_split_size(s);
    case Key::MaxNonSplitRoundingMb:
      return s.max_non_split_rounding_size;
    case Key::GarbageCollectionThreshold:
      return s.garbage_collection_threshold;
    case Key::RoundupPower2Divisions:
      return s.roundup_power2_divisions;
    case Key::ExpandableSegments:
      return s.expandable_segments;
    case Key::PinnedUseBackgroundThreads:
      return s.pinned_use_background_threads;
    case Key::Backend:
      return std::string(tc::backend_name(s.backend));
    case Key::ReleaseLockOnCudamalloc:
      return s.release_lock_on_cudamalloc;
    case Key::PinnedUseCudaHostRegister:
      return s.pinned_use_cuda_host_register;
    case Key::PinnedNumRegisterThreads:
      return s.pinned_num_register_threads;
    case Key::PinnedReserveSegmentSizeMb:
      return s.pinned_reserve_segment_size_mb;
    case Key::GraphCaptureRecordStreamReuse:
      return s.graph_capture_record_stream_reuse;
    case Key::PerProcessMemoryFraction:
      return s.per_process_memory_fraction;
    case Key::ThrowOnCudamallocOom:
      return s.throw_on_cudamalloc_oom;
    case Key::PinnedFreeCatchAll:
      return s.pinned_free_catch_all;
    case Key::ExpandableSegmentsReserve:
      return s.expandable_segments_reserve.empty() ? json(nullptr)
                                                   : json(s.expandable_segments_reserve);
    case Key::ExpandableSegmentsReserveByClass:
      return s.expandable_segments_reserve_by_class.empty()
                 ? json(nullptr)
                 : json(s.expandable_segments_reserve_by_class);
    case Key::RoundupBypassThresholdMb:
      return s.roundup_bypass_threshold;
  }
  return nullptr;
}

// TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC as PyTorch reads it (c10::utils::check_env, once per process).
std::string ipc_meaning(const tc::Env &env) {
  if (!env.expandable_ipc)
    return "unset: on (the default of public builds), expandable-segment tensors can be shared "
           "between processes";
  if (*env.expandable_ipc == "1") return "on: expandable-segment tensors can be shared";
  if (*env.expandable_ipc == "0")
    return "off: expandable segments are made without a shareable handle type, so their tensors "
           "cannot be shared between processes";
  return "not 0 or 1: PyTorch warns \"Ignoring invalid value for boolean flag\" and keeps the "
         "default (on)";
}

nlohmann::ordered_json ipc_json(const tc::Env &env) {
  return nlohmann::ordered_json{{"variable", std::string(tc::kExpandableIpcVar)},
          {"value", env.expandable_ipc ? nlohmann::ordered_json(*env.expandable_ipc)
                                            : nlohmann::ordered_json(nullptr)},
          {"meaning", ipc_meaning(env)}};
}

void print_known_problems(std::ostream &out, const tc::Judgement &j) {
  out << "\n  known problems of torch " << j.version.text << ":";
  if (j.known.empty()) {
    out << " none\n";
    return;
  }
  out << '\n';
  for (const tc::KnownProblem &k : j.known)
    out << "    " << tc::severity_name(k.rule->severity) << ": " << k.text << '\n';
}

}  // namespace cmg
