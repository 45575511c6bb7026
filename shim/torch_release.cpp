// SPDX-License-Identifier: Apache-2.0
// Which PyTorch release the host loaded, and its known problems for the environment it read. A
// wheel's libraries are unversioned (torch/lib/libc10_cuda.so), so the version comes from the
// package beside them (torch/version.py, or the dist-info): a few small reads, done lazily at the
// first CUDA call (libtorch is loaded by then in a PyTorch program) or at the first allocation of
// PyTorch's allocator, never on the call path after that.
#include <dirent.h>
#include <link.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <string>
#include <vector>

#include "diag.h"
#include "regular_file.h"
#include "state.h"
#include "torch_host.h"
#include "torch_rules.h"

namespace cmg::shim {
namespace {

namespace tc = cmg::torchconf;

// A FIFO planted as version.py or METADATA must not stop the host in open(2) at its first CUDA
// call: regular files only (regular_file.h).
std::optional<std::string> read_small(const std::string &path) {
  return read_regular(path, 64u << 10);
}

std::vector<std::string> list_dir(const std::string &dir) {
  std::vector<std::string> out;
  if (DIR *d = opendir(dir.c_str())) {
    while (dirent *e = readdir(d)) out.emplace_back(e->d_name);
    closedir(d);
  }
  return out;
}

std::vector<std::string> loaded_torch_libraries() {
  std::vector<std::string> libs;
  dl_iterate_phdr(
      [](dl_phdr_info *info, size_t, void *data) -> int {
        if (info->dlpi_name && tc::is_torch_library(info->dlpi_name))
          static_cast<std::vector<std::string> *>(data)->emplace_back(info->dlpi_name);
        return 0;
      },
      &libs);
  return libs;
}

std::mutex g_mu;  // held across fork(), like torch_path.cpp's: nothing else is locked under it
std::once_flag g_atfork;
std::optional<tc::FoundVersion> *g_found = nullptr;  // leaked on purpose, like the state
std::atomic<bool> g_reported{false};

}  // namespace

std::optional<tc::FoundVersion> torch_loaded_version() {
  std::call_once(g_atfork, [] {
    pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); }, [] { g_mu.unlock(); });
  });
  std::lock_guard lk(g_mu);
  if (g_found && *g_found) return *g_found;
  try {
    const tc::FileAccess fs{read_small, list_dir};
    for (const std::string &lib : loaded_torch_libraries()) {
      if (std::optional<tc::FoundVersion> f = tc::version_of_library(lib, fs)) {
        if (!g_found) g_found = new std::optional<tc::FoundVersion>();
        *g_found = f;
        return f;
      }
    }
  } catch (...) {
  }
  return std::nullopt;
}

void torch_release_check() {
  if (g_reported.load(std::memory_order_acquire) || disabled()) return;
  const tc::Env *env = torch_env_at_load();
  if (!env) return;
  const std::optional<tc::FoundVersion> found = torch_loaded_version();
  if (!found || g_reported.exchange(true)) return;
  try {
    note(LogLevel::Info,
         "PyTorch " + found->version.text + " is loaded (version from " + found->source + ")");
    const tc::Judgement j = tc::judge(*env, found->version, found->source);
    // An error of this release alone (a key it does not have, or one it added): not reported at
    // load, where the release was not known.
    if (!torch_errors_reported_at_load())
      for (const tc::Problem &pr : tc::diagnose(*env, j.outcome))
        if (pr.severity == tc::Severity::Error) {
          Finding f;
          f.cls = FindingClass::Config;
          f.msg = "torch " + found->version.text + " (" + found->source + "): " + pr.text;
          f.state_json = "{\"torch_version\":\"" + json_escape(found->version.text) +
                         "\",\"version_source\":\"" + json_escape(found->source) +
                         "\",\"rule\":\"release-error\"}";
          report_finding_without_call(std::move(f), "(PyTorch loaded)", true);
        }
    for (const tc::KnownProblem &k : j.known) {
      if (!k.rule->at_run_time) continue;
      Finding f;
      f.cls = FindingClass::Config;
      f.msg = "torch " + found->version.text + " (" + found->source + "): " + k.text;
      f.state_json = "{\"torch_version\":\"" + json_escape(found->version.text) +
                     "\",\"version_source\":\"" + json_escape(found->source) + "\",\"rule\":\"" +
                     json_escape(k.rule->id) + "\",\"bug\":\"" + json_escape(k.rule->bug) + "\"}";
      report_finding_without_call(std::move(f), "(PyTorch loaded)", true);
    }
  } catch (...) {
    // A rule that cannot be evaluated is not reported; the host goes on untouched.
  }
}

}  // namespace cmg::shim
