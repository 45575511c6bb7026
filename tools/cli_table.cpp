// SPDX-License-Identifier: Apache-2.0
// The table of the commands' options, operands, exit statuses and environment (see cli.h). A new
// option of a command goes here and in its parser; check_cli.py fails when one side lacks it.
#include <array>
#include <string>
#include <vector>

#include "cli.h"
#include "cmg_config.h"
#include "options.h"

namespace cmg::tools::cli {
namespace {

using sv = std::string_view;

// --- cumemguard ----------------------------------------------------------------------------------
constexpr sv kTopDescription[] = {
    "Guards and explains CUDA memory management in a program it preloads libcumemguard.so into, "
    "and reads the event logs that leaves.",
};
constexpr Option kTopOptions[] = {
    {"-h, --help", "", Value::None, "", "print this help"},
    {"--version", "", Value::None, "", "print the version"},
};
// The one convention of every command, in cumemguard --help, cumemguard(1) and the README's
// "Exit status" table (gen_cli exits-md writes it; check_cli.py fails when the README's differs,
// or when a command's own table has a code this one lacks).
constexpr ExitStatus kTopExits[] = {
    {"0", "success"},
    {"1",
     "findings: report when the logs hold findings (leaks only with --fail-on-leaks) or a "
     "process crashed, was aborted or was killed (its log has no end record and it is not "
     "running on this host), or a log has records that cannot be read; config when PyTorch would "
     "fail on the environment"},
    {"N",
     "run --error-exitcode N when a process of the run had findings that are not suppressed "
     "(leaks only with --fail-on-leaks), or when no process of the run loaded the shim (a static "
     "or setuid program) or the shim was disabled (CUMEMGUARD_DISABLE): nothing was checked; "
     "unless the program was killed by a signal"},
    {"64",
     "a usage error: an unknown command or option, a bad argument or value; for run and config, "
     "a CUMEMGUARD_* setting (from -e or the environment) that cannot apply; for run, a "
     "suppressions file that cannot be read, an event log name whose %q{VAR} is not set or with "
     "an unknown placeholder, an option given with an -e of the setting it makes, or an -e of a "
     "variable the launcher sets or reads itself"},
    {"66",
     "an input cannot be read: a log for report (a missing file, a directory, a device such as "
     "/dev/null: named on stderr, and the other logs are still read and what was asked for "
     "written from them, as cat goes on past a missing file); the shim for run (CUMEMGUARD_SHIM_PATH names "
     "no file, or a file that is not libcumemguard.so); the interpreter config --python names "
     "(not found or cannot run)"},
    {"71", "run could not start the program (fork failed)"},
    {"73",
     "an output cannot be written: a file report writes (or one that is an event log, which it "
     "does not write over); for run, the event log, the default one in the current directory "
     "too (no such directory, not writable, a FIFO, a "
     "device, a link or a directory at its path, or a non-empty file that is not a cumemguard "
     "log), or no status "
     "directory can be made for --error-exitcode; the program is not started"},
    {"126", "run: PROGRAM is not executable"},
    {"127", "run: PROGRAM is not found"},
    {"other", "run passes the program's own status, or dies of the signal that killed it"},
};
constexpr sv kTopNotes[] = {
    "`cumemguard COMMAND --help` describes each command and its own exit statuses; each takes "
    "--version too.",
    "The documents (what each finding means and how it is proven, the log and JSON formats, the "
    "PyTorch, NCCL and IPC policies): " CMG_DOCDIR ".",
};

// The environment the shim reads, in every page that starts or explains it.
constexpr EnvVar kShimEnv[] = {
    {"CUMEMGUARD_SHIM_PATH",
     "The libcumemguard.so that cumemguard run preloads. Unset, an installed cumemguard uses the "
     "library installed beside it (PREFIX/LIBDIR), and a build tree's uses the one in its shim/; "
     "an installed one never uses a build tree's. Set to a path that is not a file, or to a file "
     "that is not libcumemguard.so (no ELF shared object defining cumemguard_stats_json), the run "
     "stops with status 66."},
    {"CUMEMGUARD_OPTIONS",
     "Many options in one variable, NAME=VALUE entries separated by colons "
     "(CUMEMGUARD_OPTIONS=mode=strict:stacks=16); a value holding a colon is quoted; a separate "
     "CUMEMGUARD_NAME variable wins over an entry."},
    {"CUMEMGUARD_PROFILE",
     "guard (the defaults of a plain LD_PRELOAD) or debug (stacks and a quarantine; what "
     "cumemguard run sets unless told)."},
    {"CUMEMGUARD_*",
     "Every option of the shim is a variable; cumemguard config lists them all with their "
     "values, defaults and sources."},
};

// --- cumemguard run ------------------------------------------------------------------------------
constexpr sv kRunDescription[] = {
    "Runs PROGRAM with libcumemguard.so preloaded (its children inherit it), passes its exit "
    "status through, prints each finding with its stacks and the exit summary, and lists the "
    "event logs of the run. The program gets the debug profile (stacks at every event, a "
    "quarantine of freed memory) unless CUMEMGUARD_PROFILE or a profile entry of "
    "CUMEMGUARD_OPTIONS is set. A sanitizer runtime the program links (-fsanitize=address or "
    "thread) is preloaded in front of the shim, as the sanitizer requires.",
};

// run's options are its parser's table (run_options.def): "-h, --help" from name and alias.
template <std::size_t A, std::size_t N>
constexpr std::array<char, A + N + 1> option_names(const char (&alias)[A], const char (&name)[N]) {
  std::array<char, A + N + 1> out{};
  std::size_t k = 0;
  if (A > 1) {
    for (std::size_t i = 0; i + 1 < A; ++i) out[k++] = alias[i];
    out[k++] = ',';
    out[k++] = ' ';
  }
  for (std::size_t i = 0; i + 1 < N; ++i) out[k++] = name[i];
  return out;
}

#define CMG_RUN_OPTION(id, name, alias, value, help) \
  constexpr auto kRunNames_##id = option_names(alias, name);
#include "run_options.def"
#undef CMG_RUN_OPTION

// What a run option's value is, for completion, from its placeholder.
constexpr Value run_value(sv arg) {
  if (arg.empty()) return Value::None;
  if (arg == "PATH" || arg == "FILE") return Value::File;
  if (arg == "MODE") return Value::Word;
  if (arg == "N") return Value::Number;
  if (arg == "NAME=VALUE") return Value::EnvName;
  return Value::Text;
}

constexpr Option kRunOptions[] = {
#define CMG_RUN_OPTION(id, name, alias, value, help)   \
  {sv(kRunNames_##id.data()), value, run_value(value), \
   sv(value) == "MODE" ? sv("guard report strict") : sv(), help},
#include "run_options.def"
#undef CMG_RUN_OPTION
};
constexpr ExitStatus kRunExits[] = {
    {"0",
     "the program exited 0 (and, with --error-exitcode, no process of the run had findings)"},
    {"N",
     "with --error-exitcode N, when a process of the run had findings, or when nothing was "
     "checked: no process of the run loaded the shim (a static or setuid program, which ld.so "
     "does not preload into) or the shim was disabled (CUMEMGUARD_DISABLE) (unless the program "
     "was killed by a signal: the launcher then dies of the same signal)"},
    {"64",
     "bad options or arguments, or a CUMEMGUARD_* setting (from -e or the environment) that "
     "cannot apply; an unreadable suppressions file; an event log name whose %q{VAR} is not set "
     "or with an unknown placeholder; an option given with an -e of the setting it makes (--log "
     "and -e CUMEMGUARD_LOG=...); an -e of a variable the launcher sets or reads itself "
     "(CUMEMGUARD_RUN_ID, CUMEMGUARD_SHIM_PATH, ...)"},
    {"66",
     "the shim cannot be found or read (CUMEMGUARD_SHIM_PATH names no file), or is not "
     "libcumemguard.so (an ELF shared object of this machine defining cumemguard_stats_json)"},
    {"71", "the program could not be started (fork failed)"},
    {"73",
     "the event log cannot be written, the default one in the current directory too (no such "
     "directory, not writable, a FIFO or a device, a non-empty file that is not a cumemguard "
     "log), or no status "
     "directory can be made for --error-exitcode: the program is not started"},
    {"126", "PROGRAM is not executable"},
    {"127", "PROGRAM is not found"},
    {"other", "the program's own status (or the signal that killed it, raised again)"},
};
constexpr EnvVar kRunEnv[] = {
    kShimEnv[0],
    kShimEnv[1],
    kShimEnv[2],
    kShimEnv[3],
    {"TMPDIR", "Where the run's status directory is made (default /tmp)."},
};
constexpr sv kRunNotes[] = {
    "A process that never calls CUDA writes no log and has no findings. SIGTERM, SIGINT, SIGQUIT, "
    "SIGHUP, SIGUSR1 and SIGUSR2 sent to the launcher are passed on to the program (a terminal's "
    "SIGINT and SIGQUIT already reach it); if the launcher is killed outright (SIGKILL), the "
    "program is killed with it.",
    "An --log FILE that exists is overwritten only when it is a cumemguard event log (or empty): "
    "any other file there stops the run with status 73, as /dev/null does (--no-log gives no "
    "log). A launcher option and an -e of the setting it makes (--mode and -e "
    "CUMEMGUARD_MODE=..., --log and -e CUMEMGUARD_LOG=...) are refused with status 64, neither "
    "winning. With CUMEMGUARD_DISABLE set the run says that the shim checks nothing; when no "
    "process of the run loaded the shim (ld.so ignores LD_PRELOAD for a static or setuid "
    "program) it says so after the program's end.",
};

// --- cumemguard report ---------------------------------------------------------------------------
constexpr sv kReportDescription[] = {
    "Reads cumemguard event logs (one per process or rank) and prints what happened to each "
    "process that did not exit normally, findings grouped by class and stack, leaks by allocation "
    "stack, bytes per device and memory kind, top allocation sites, calls per API and NCCL "
    "communicator lifecycles. A log named twice is read once; - reads one from standard input.",
};
constexpr Option kReportOptions[] = {
    {"--json", "", Value::None, "",
     "one JSON document instead of text (its fields: report-schema.md in the documentation "
     "directory, " CMG_DOCDIR ")"},
    {"-o, --output", "OUT", Value::Output, "*.log*",
     "write the text or JSON report to OUT instead of stdout (- is stdout)"},
    {"--trace", "OUT.json", Value::Output, "!*.json",
     "write a Chrome trace-event file for Perfetto / chrome://tracing (stdout then gets the "
     "report's first line only, unless --json or -o asks for the report; OUT.json - writes it to "
     "stdout, and the first line to stderr)"},
    {"--html", "OUT.html", Value::Output, "!*.html",
     "write one self-contained HTML page: memory over time, findings (stdout as with --trace; - "
     "writes it to stdout)"},
    {"--no-symbolize", "", Value::None, "",
     "print frames as module+offset without reading the modules"},
    {"--run", "ID", Value::Text, "",
     "read only the logs of run ID (the CUMEMGUARD_RUN_ID cumemguard run writes in each log's "
     "header, or its start when one run's id starts so: the launcher's pid), or with all every "
     "log named; without it, logs of more than one run are refused "
     "(status 64, the runs and their logs named)"},
    {"--full-stacks", "", Value::None, "",
     "print every frame of a stack in the text report: the frames below main, and those of the "
     "interpreter below a Python program's outermost frame, which are folded into one line "
     "otherwise (JSON, the trace and the page have them all)"},
    {"--top", "N", Value::Number, "",
     "rows of ranked lists: allocation sites, leak stacks (default 10, 0 = all)"},
    {"--fail-on-leaks", "", Value::None, "",
     "leaks at exit make the exit status 1, like other findings"},
    {"--slow-us", "N", Value::Number, "",
     "calls of at least N microseconds become slices in the trace (default 1000; 0: every call)"},
    {"--gen-suppressions", "", Value::None, "",
     "print a suppression rule (CUMEMGUARD_SUPPRESSIONS) for each finding group instead of the "
     "report"},
    {"--diff", "A B", Value::Log, "",
     "compare two snapshots of what is resident by site instead of the report: what is new, "
     "what grew, what shrank, what is gone (text, --json or --html). A and B are LOG (its last "
     "snapshot), LOG@N (its snapshot N) or LOG@LABEL (its last snapshot so labelled)"},
    {"-h, --help", "", Value::None, "", "print this help"},
    {"--version", "", Value::None, "", "print the version"},
};
constexpr ExitStatus kReportExits[] = {
    {"0",
     "no findings (a log without its end record whose process is still running on this host, "
     "read mid-run, is said to be and counts as none so far); with --gen-suppressions, the "
     "rules were printed"},
    {"1",
     "findings (suppressed ones excepted), or a process crashed, was aborted or ended without "
     "its end record (killed: SIGKILL, out of memory, a time limit), or a log has records that "
     "cannot be read (a line cut off or with a bad field: what it said is not known)"},
    {"64",
     "usage error; logs of more than one run without --run; two outputs on one file or on "
     "stdout (-); --diff naming one snapshot twice"},
    {"66",
     "a log cannot be read, is not a cumemguard log or is of a newer format; with --diff, a "
     "snapshot named is not in its log"},
    {"73", "an output file cannot be written, or is a cumemguard event log (not written over)"},
};
constexpr sv kReportNotes[] = {
    "A run in which every CUDA call failed with one status (no driver) is said to be not checked "
    "(its first line, What happened, the page and the JSON's every_call_failed), with status 0 "
    "as cumemguard run gives it: it has no findings, and the program's own status tells it failed. "
    "The report never writes an output over a cumemguard event log. It holds at most 256 logs "
    "open at once and a bounded line buffer per log, so any number of rank logs can be read "
    "together; a line over 16 MiB is skipped and said.",
};

// --- cumemguard config ---------------------------------------------------------------------------
// The releases of policy/torch_releases.def, space-separated: what --torch-version completes.
constexpr sv kTorchReleaseRows[] = {
#define TORCH_RELEASE(version, ...) sv(version),
#include "torch_releases.def"
#undef TORCH_RELEASE
};
constexpr std::size_t torch_releases_size() {
  std::size_t n = 0;
  for (sv r : kTorchReleaseRows) n += r.size() + 1;
  return n;
}
constexpr auto kTorchReleases = [] {
  std::array<char, torch_releases_size() + 1> out{};
  std::size_t k = 0;
  for (sv r : kTorchReleaseRows) {
    if (k) out[k++] = ' ';
    for (char ch : r) out[k++] = ch;
  }
  return out;
}();
constexpr sv kConfigDescription[] = {
    "Shows how PyTorch will read its allocator variables (PYTORCH_CUDA_ALLOC_CONF and the others) "
    "in this environment, judged for the PyTorch release installed (or named), with that "
    "release's known problems, and every CUMEMGUARD_* option with its effective value and where "
    "it comes from: its own variable, an entry of CUMEMGUARD_OPTIONS, the profile in force "
    "(CUMEMGUARD_PROFILE), cumemguard run (with --run) or the default.",
};
constexpr Option kConfigOwnOptions[] = {
    {"--json", "", Value::None, "",
     "machine-readable output (its fields: config-json.md in the documentation "
     "directory, " CMG_DOCDIR ")"},
    {"--run", "", Value::None, "",
     "evaluate the environment cumemguard run gives the program: the debug profile, the exit "
     "summary and a log in the current directory, where the environment does not set them, and "
     "what run's own options given with it make of it (--log, --no-log, -e and the others, "
     "listed after --python and read as run reads them); a setting run would refuse is refused "
     "(status 64)"},
    {"--env", "NAME=VALUE", Value::EnvName, "",
     "evaluate as if NAME were set to VALUE (nothing is exported); --env NAME: as if NAME were "
     "unset"},
    {"--torch-version", "V", Value::Word, sv(kTorchReleases.data()),
     "judge for PyTorch V (default: the torch that --python would import)"},
    {"--python", "PATH", Value::File, "",
     "the interpreter asked where torch is, without importing it (python3)"},
};
constexpr Option kConfigHelpVersion[] = {
    {"-h, --help", "", Value::None, "", "print this help"},
    {"--version", "", Value::None, "", "print the version"},
};
// run's options but its own --help and --version: config --run takes them (run_args.h), so its
// help, page and completion list them from run's table, never from a copy.
constexpr bool shared_with_run(const Option &o) {
  return o.names != sv(kRunNames_help.data()) && o.names != sv(kRunNames_version.data());
}
constexpr std::size_t kRunShared = [] {
  std::size_t n = 0;
  for (const Option &o : kRunOptions) n += shared_with_run(o);
  return n;
}();
constexpr auto kConfigOptions = [] {
  std::array<Option, std::size(kConfigOwnOptions) + kRunShared + std::size(kConfigHelpVersion)>
      out{};
  std::size_t k = 0;
  for (const Option &o : kConfigOwnOptions) out[k++] = o;
  for (const Option &o : kRunOptions)
    if (shared_with_run(o)) out[k++] = o;
  for (const Option &o : kConfigHelpVersion) out[k++] = o;
  return out;
}();
constexpr ExitStatus kConfigExits[] = {
    {"0", "PyTorch accepts this environment"},
    {"1",
     "PyTorch would fail on it (an exception at the first CUDA allocation, or an abort "
     "during import torch)"},
    {"64",
     "bad arguments (one of run's options without --run, or a value run refuses), or a "
     "CUMEMGUARD_* setting that cannot apply, with or without --run, an -e of a variable the "
     "launcher sets itself included, a suppressions file that cannot be read or an event log "
     "name run refuses (one line each on stderr, labelled as cumemguard run labels it; run "
     "refuses it with 64 too)"},
    {"66", "the interpreter --python names is not found or cannot run"},
    {"73",
     "an event log run could not write (with --run, the default one in the current directory "
     "too), as run refuses it with 73"},
};

constexpr std::array<Command, 4> kCommands = {{
    {"", "guard and explain CUDA memory management in programs it preloads into",
     "COMMAND [ARGS...]", kTopDescription, kTopOptions, Value::None, kTopExits, "", kShimEnv,
     kTopNotes},
    {"run", "run a program with the cumemguard shim preloaded", "[options] [--] PROGRAM [ARGS...]",
     kRunDescription, kRunOptions, Value::Command, kRunExits, "", kRunEnv, kRunNotes},
    {"report",
     "read cumemguard event logs: findings, leaks, bytes over time",
     "[options] LOG... | --diff A B",
     kReportDescription,
     kReportOptions,
     Value::Log,
     kReportExits,
     "The highest that applies wins.",
     {},
     kReportNotes},
    {"config",
     "show the PyTorch allocator configuration and the cumemguard options in force",
     "[--json] [--run [RUN-OPTIONS]] [--env NAME=VALUE | --env NAME]... [--torch-version V] "
     "[--python PATH]",
     kConfigDescription,
     kConfigOptions,
     Value::None,
     kConfigExits,
     "",
     {},
     {}},
}};

}  // namespace

std::span<const Command> commands() {
  return kCommands;
}

const Command &command(std::string_view name) {
  for (const Command &c : kCommands)
    if (c.name == name) return c;
  return kCommands[0];
}

std::string option_hint(const Command &c, std::string_view arg) {
  // A long option typed with its value (--lgo=x.log) is judged by its name.
  if (!arg.starts_with("--")) return "";
  arg = arg.substr(0, arg.find('='));
  std::vector<std::string_view> names;
  for (const Option &o : c.options) {
    std::string_view rest = o.names;  // "-o, --output"
    while (!rest.empty()) {
      const std::size_t comma = rest.find(", ");
      const std::string_view n = rest.substr(0, comma);
      if (n.starts_with("--")) names.push_back(n);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 2);
    }
  }
  const std::size_t i = closest_name(arg, names);
  return i < names.size() ? " (did you mean " + std::string(names[i]) + "?)" : "";
}

}  // namespace cmg::tools::cli
