// SPDX-License-Identifier: Apache-2.0
// The program environment's checks before run starts it (see run_env_checks.h).
#include "run_env_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "logname.h"
#include "run_checks.h"
#include "run_defaults.h"
#include "run_files.h"
#include "suppressions.h"

namespace cmg::tools {
namespace {

constexpr int kUsage = 64, kCantCreate = 73;

// Why the suppressions file the shim will read cannot be, or empty: the shim's own rules (a
// regular file of at most 1 MiB, opened without blocking), so that the run stops here instead of
// going on with one warning and no suppressions.
std::string suppressions_problem(const std::string &path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return std::strerror(errno);
  struct stat st;
  std::string why;
  if (::fstat(fd, &st) != 0)
    why = std::strerror(errno);
  else if (!S_ISREG(st.st_mode))
    why = "not a regular file";
  else if (static_cast<std::uint64_t>(st.st_size) > kMaxSuppressionsBytes)
    why = "larger than 1 MiB";
  ::close(fd);
  return why;
}

}  // namespace

EnvRefusal program_env_refusal(const RunArgs &a, const ParsedOptions &user, const Options &eff,
                               const char *(*getenv)(const char *),
                               std::string_view not_started) {
  const std::string tail(not_started);
  if (!eff.suppressions.empty()) {
    if (const std::string p = suppressions_problem(eff.suppressions); !p.empty())
      return {kUsage, std::string(a.suppressions.empty() ? "CUMEMGUARD_SUPPRESSIONS="
                                                         : "--suppressions ") +
                          shown(eff.suppressions) + ": cannot read: " + p + "; " + tail};
  }
  // valgrind's --log-file habit: a log the user named (--log, or CUMEMGUARD_LOG in any form) that
  // cannot be written stops the run before it starts, rather than a run whose findings reach no
  // file. The default log in the current directory gets the same check: the help and the exit
  // table promise 73 for any log that cannot be created, and a run in a directory the user cannot
  // write (a read-only checkout, /proc as root) used to start logless and exit 0.
  if (eff.log.empty()) return {};
  const bool named_log = !a.log.empty() || set_by_user(user, "LOG");
  if (!named_log) {
    // The problem names the directory: "directory /proc: cannot create a file there (...)".
    if (const std::string p = log_target_problem(eff.log); !p.empty())
      return {kCantCreate, "cannot write the default event log (the current directory's): " + p +
                               "; " + tail + " (give --log a writable place, or --no-log)"};
    return {};
  }
  // valgrind stops at a --log-file whose %q{VAR} names a variable that is not set ("environment
  // variable VAR is not set"); so does run, in the program's environment (-e included), where the
  // shim alone could only say so and write the name without it.
  cmg::shim::LogNameInputs in;
  in.getenv = getenv;
  if (const auto unset = cmg::shim::expand_log_name(eff.log, in).unset; !unset.empty())
    return {kUsage, "the event log " + shown(eff.log) + ": %q{" + unset[0] +
                        "}: the environment variable " + unset[0] + " is not set; " + tail +
                        " (set it, with -e " + unset[0] + "=VALUE if need be)"};
  if (const std::string p = log_name_problem(eff.log); !p.empty())
    return {kUsage, "the event log " + shown(eff.log) + ": " + p +
                        " (placeholders: %p %r %l %h %e %q{VAR} %%); " + tail};
  if (const std::string p = log_target_problem(eff.log); !p.empty())
    return {kCantCreate, "cannot write the event log " + shown(eff.log) + ": " + p + "; " + tail +
                             " (give --log a writable place, or --no-log)"};
  return {};
}

}  // namespace cmg::tools
