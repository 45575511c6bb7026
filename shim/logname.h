// SPDX-License-Identifier: Apache-2.0
// Log file names: the placeholders of CUMEMGUARD_LOG (docs/log-format.md, "Log names") and the
// rank variables behind %r and %l. Pure: the unit tests call it with their own environment.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cmg::shim {

struct LogNameInputs {
  long pid = 0;
  int rank = -1;        // %r; -1: "na"
  int local_rank = -1;  // %l; -1: "na"
  std::string host;     // %h
  std::string program;  // %e: the file this process exec'd, without its directory
  const char *(*getenv)(const char *) = nullptr;  // %q{VAR}
};

struct LogName {
  std::string path;
  // One line per placeholder kept as written (unknown, or a malformed %q{...}), each named once.
  std::vector<std::string> problems;
  // The variables of %q{VAR} that are not set (each once): valgrind refuses such a --log-file;
  // `cumemguard run` refuses it too, and the shim, which never stops a program, says so.
  std::vector<std::string> unset;
  // The placeholders kept as written, each once, as "'%z' is not a placeholder": `cumemguard run`
  // refuses such a name before the program starts.
  std::vector<std::string> unknown;
};

// %p pid, %r rank, %l local rank, %h host name, %e program, %q{VAR} the value of VAR (empty when
// unset, with a problem line), %% a percent sign. Anything else after '%' is kept as written, with a problem line.
// Substituted values never add a directory: '/' and control characters in them become '_'.
LogName expand_log_name(std::string_view pattern, const LogNameInputs &in);

// The rank of this process among all processes of the job: RANK (torchrun, Ray-based launchers),
// then OMPI_COMM_WORLD_RANK (Open MPI), PMI_RANK (MPICH, Intel MPI), SLURM_PROCID (srun). Slurm's
// comes last: under torchrun in an sbatch job it names the launcher's task, which all workers of
// a node share. -1 when none is set to a number.
int rank_from_env();
// The rank on this node: LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID.
int local_rank_from_env();

// The inputs of this process (getenv, gethostname, the exec'd file from AT_EXECFN).
LogNameInputs log_name_inputs(long pid, int rank);

// The names a process tries for its log, in order, when the one before is another process's
// (EventLog::open says `taken`): k = 0 the expanded path itself, 1 PATH.<pid>, k >= 2
// PATH.<pid>.<k-1> (an image exec'd by a process that had PATH.<pid>, which keeps the pid).
inline constexpr int kLogNameCandidates = 8;
std::string log_name_candidate(const std::string &path, long pid, int k);

// Compatibility: the expansion with this process's inputs, problems dropped.
std::string expand_log_path(std::string_view pattern, long pid, int rank);

}  // namespace cmg::shim
