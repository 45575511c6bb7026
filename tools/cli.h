// SPDX-License-Identifier: Apache-2.0
// The commands' options, operands and exit statuses in one table (cli_table.cpp), from which
// `--help`, the man pages and the bash completion are all made (cli_render.cpp; the build runs
// tools/gen_cli for the last two), so that none of them can lack an option another has. The
// parsers stay in their commands; tests/integration/check_cli.py fails when a parser accepts an
// option this table does not list, or the other way round.
#pragma once

#include <cstdio>
#include <span>
#include <string>
#include <string_view>

namespace cmg::tools::cli {

// What an option's value (or an operand) is, for completion.
enum class Value {
  None,     // a flag
  File,     // a path to an existing or new file
  Log,      // a cumemguard event log (*.log*)
  Output,   // a file to write: `choices` is the compgen -X filter (never offers event logs)
  Number,   // nothing to complete
  Word,     // one of `choices`
  EnvName,  // NAME=VALUE with NAME a CUMEMGUARD_* option (or a PyTorch variable)
  Command,  // a program and its arguments
  Text,     // free text: nothing to complete
};

struct Option {
  std::string_view names;  // "-o, --output": the short form first
  std::string_view arg;    // "OUT", or empty for a flag
  Value value = Value::None;
  std::string_view choices;  // for Value::Word: "guard report strict"
  std::string_view help;     // one paragraph; wrapped by the renderers
};

struct ExitStatus {
  std::string_view code;  // "0", "64", "N"
  std::string_view meaning;
};

struct EnvVar {
  std::string_view name;
  std::string_view meaning;
};

struct Command {
  std::string_view name;      // "run"; "" for `cumemguard` itself
  std::string_view summary;   // the man page's NAME line and the command list's
  std::string_view synopsis;  // after the command's name: "[options] [--] PROGRAM [ARGS...]"
  std::span<const std::string_view> description;  // paragraphs
  std::span<const Option> options;
  Value operands = Value::None;
  std::span<const ExitStatus> exits;
  std::string_view exits_note;  // a line after the statuses ("The highest that applies wins.")
  std::span<const EnvVar> environment;
  std::span<const std::string_view> notes;  // paragraphs after the options (help) / NOTES (man)
};

std::span<const Command> commands();  // `cumemguard` first, then run, report, config
const Command &command(std::string_view name);

// " (did you mean --log?)" for an unknown option `arg` close to one of the command's, or "".
std::string option_hint(const Command &c, std::string_view arg);

// Where the documents --help names are: CMG_DOCDIR (PREFIX/share/doc/cumemguard), or the source
// tree's docs/ when this program is the build tree's tools/cumemguard (nothing is installed yet).
// The man pages always name the installed directory.
std::string doc_dir();
// `COMMAND --help`, naming doc_dir() for the documents it cites.
std::string help_text(const Command &c);
// The man page (roff), NAME, SYNOPSIS, DESCRIPTION, OPTIONS, EXIT STATUS, ENVIRONMENT, NOTES,
// SEE ALSO; `version` goes in the title line.
std::string man_page(const Command &c, std::string_view version);
// "cumemguard-run": the page's name.
std::string page_name(const Command &c);
// The bash completion script for every command.
std::string bash_completion();
// The exit statuses of `cumemguard` itself (every command's convention) as the README's markdown
// table, header included.
std::string exit_table_markdown();

}  // namespace cmg::tools::cli
