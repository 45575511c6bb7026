// SPDX-License-Identifier: Apache-2.0
// What `cumemguard run` checks before it starts the program, so that a green run cannot be one in
// which nothing was checked: the file it preloads is the shim, the event log's name and the file
// already at its path are ones the log can use, and the environment does not disable the shim.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cmg::tools {

// A symbol every libcumemguard.so defines (include/cumemguard.h), and only it: the policy library
// of the Python package (libcumemguard_policy.so) defines cumemguard_version too.
inline constexpr const char *kShimMarker = "cumemguard_stats_json";

// Why `path` is not a shim this launcher may preload, or empty: it must be an ELF shared object of
// this machine's class and byte order whose dynamic symbol table defines kShimMarker. ld.so only
// says "cannot be preloaded ... ignored" for a file that is not ELF, and preloads any other shared
// object without a word: either way the program would run unchecked. Read with libelf; the file
// is never loaded.
std::string shim_file_problem(const std::string &path);

// The first placeholder of an event log name that the shim does not know ("%z", a malformed
// "%q{"), as its expansion reports it, or empty.
std::string log_name_problem(const std::string &pattern);

// Why the file already at an event log's path (no placeholders) must not be replaced, or empty:
// a non-empty regular file that is not a cumemguard event log (its first line is no log header).
// A log is overwritten as valgrind overwrites its --log-file; someone's text file is not.
std::string log_overwrite_problem(const std::string &path);

// The line saying that the shim will be disabled (CUMEMGUARD_DISABLE, or the entry disable of
// CUMEMGUARD_OPTIONS, in the environment the program starts with), so nothing is checked; or
// empty. `gate`: --error-exitcode was given, and checks nothing either.
std::string disabled_warning(bool gate);

// The line saying that no process of the run loaded the shim (the status directory holds neither
// a record nor a load mark: ld.so ignores LD_PRELOAD for a static or setuid program), so nothing
// was checked; with --error-exitcode (`gate`, its status) that is a failed check, and the line
// says the status it exits with. Empty when some process loaded it.
std::string unloaded_warning(std::size_t records, std::size_t loaded, int gate);

}  // namespace cmg::tools
