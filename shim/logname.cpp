// SPDX-License-Identifier: Apache-2.0
// Log file names (see logname.h).
#include "logname.h"

#include <sys/auxv.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "options.h"

namespace cmg::shim {
namespace {

// A substituted value is one file-name component: it never adds a directory or a control byte.
// Returns whether a byte had to be replaced.
bool append_component(std::string &out, std::vector<bool> &from_value, std::string_view v) {
  bool changed = false;
  for (char c : v) {
    const auto u = static_cast<unsigned char>(c);
    const bool bad = c == '/' || u < 0x20 || u == 0x7f;
    out += bad ? '_' : c;
    changed = changed || bad;
  }
  from_value.resize(out.size(), true);
  return changed;
}

int number_from(const char *s) {
  if (!s || !*s) return -1;
  char *end = nullptr;
  const long r = std::strtol(s, &end, 10);
  return end && *end == '\0' && r >= 0 && r < (1L << 30) ? static_cast<int>(r) : -1;
}

int first_number(std::initializer_list<const char *> vars) {
  for (const char *v : vars)
    if (int r = number_from(std::getenv(v)); r >= 0) return r;
  return -1;
}

const char *plain_getenv(const char *name) { return std::getenv(name); }

}  // namespace

LogName expand_log_name(std::string_view pattern, const LogNameInputs &in) {
  LogName out;
  auto say_once = [&](std::string line) {
    for (const auto &p : out.problems)
      if (p == line) return;
    out.problems.push_back(std::move(line));
  };
  auto problem = [&](std::string_view what, std::string_view why) {
    const std::string said = "'" + std::string(what) + "' " + std::string(why);
    if (std::find(out.unknown.begin(), out.unknown.end(), said) == out.unknown.end())
      out.unknown.push_back(said);
    say_once("CUMEMGUARD_LOG: '" + std::string(what) + "' " + std::string(why) +
             "; kept as written (placeholders: %p %r %l %h %e %q{VAR} %%)");
  };
  std::vector<bool> from_value;  // per byte of out.path: it came from a substituted value
  auto value = [&](std::string_view placeholder, std::string_view v) {
    if (append_component(out.path, from_value, v))
      say_once("CUMEMGUARD_LOG: the value of " + std::string(placeholder) + " ('" + shown(v) +
               "') holds '/' or control characters; written with '_' for them (a value is one "
               "file-name component, never a directory)");
  };
  auto rank_text = [](int r) { return r >= 0 ? std::to_string(r) : std::string("na"); };
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    from_value.resize(out.path.size(), false);
    const char c = pattern[i];
    if (c != '%') {
      out.path += c;
      continue;
    }
    if (i + 1 == pattern.size()) {
      out.path += '%';
      problem("%", "at the end is not a placeholder");
      continue;
    }
    const char n = pattern[++i];
    switch (n) {
      case 'p': out.path += std::to_string(in.pid); continue;
      case 'r': out.path += rank_text(in.rank); continue;
      case 'l': out.path += rank_text(in.local_rank); continue;
      case 'h':
        value("%h", in.host);
        continue;
      case 'e':
        value("%e", in.program);
        continue;
      case '%': out.path += '%'; continue;
      default: break;
    }
    const std::size_t close = n == 'q' && i + 1 < pattern.size() && pattern[i + 1] == '{'
                                  ? pattern.find('}', i + 2)
                                  : std::string_view::npos;
    if (close != std::string_view::npos && close > i + 2) {
      const std::string var(pattern.substr(i + 2, close - i - 2));
      const char *v = in.getenv ? in.getenv(var.c_str()) : nullptr;
      if (!v && std::find(out.unset.begin(), out.unset.end(), var) == out.unset.end()) {
        out.unset.push_back(var);
        say_once("CUMEMGUARD_LOG: %q{" + var + "}: the environment variable " + var +
                 " is not set; written as nothing (set it, or leave %q{" + var + "} out)");
      }
      value("%q{" + var + "}", v ? v : "");
      i = close;
      continue;
    }
    out.path += '%';
    out.path += n;
    problem(std::string("%") + n,
            n == 'q' ? "needs a variable name in braces, as in %q{SLURM_JOB_ID}"
                     : "is not a placeholder");
  }
  from_value.resize(out.path.size(), false);
  // JOB=.. in /logs/%q{JOB}/x.log would climb out of /logs: a component that is "." or ".." and
  // owes a byte to a value gets '_' for its dots.
  for (std::size_t start = 0; start <= out.path.size();) {
    std::size_t end = out.path.find('/', start);
    if (end == std::string::npos) end = out.path.size();
    const std::string_view comp(out.path.data() + start, end - start);
    bool valued = false;
    for (std::size_t k = start; k < end; ++k) valued = valued || from_value[k];
    if (valued && (comp == "." || comp == "..")) {
      say_once("CUMEMGUARD_LOG: a placeholder's value makes the path component '" +
               std::string(comp) + "'; written as '" + std::string(comp.size(), '_') +
               "' (a value never names a directory)");
      for (std::size_t k = start; k < end; ++k) out.path[k] = '_';
    }
    start = end + 1;
  }
  return out;
}

int rank_from_env() {
  return first_number({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"});
}

int local_rank_from_env() {
  return first_number(
      {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"});
}

LogNameInputs log_name_inputs(long pid, int rank) {
  LogNameInputs in;
  in.pid = pid;
  in.rank = rank;
  in.local_rank = local_rank_from_env();
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) == 0) in.host = host;
  // The path given to execve(): a child that exec'd `python3` is named after python3, not after
  // the shell that started it; a script is named after the script, as the user called it.
  const char *exe = reinterpret_cast<const char *>(getauxval(AT_EXECFN));
  std::string_view e = exe ? exe : "";
  if (e.empty()) e = "unknown";
  in.program = std::string(e.substr(e.rfind('/') == std::string_view::npos ? 0 : e.rfind('/') + 1));
  in.getenv = plain_getenv;
  return in;
}

std::string log_name_candidate(const std::string &path, long pid, int k) {
  if (k <= 0) return path;
  return path + "." + std::to_string(pid) + (k > 1 ? "." + std::to_string(k - 1) : std::string());
}

std::string expand_log_path(std::string_view pattern, long pid, int rank) {
  return expand_log_name(pattern, log_name_inputs(pid, rank)).path;
}

}  // namespace cmg::shim
