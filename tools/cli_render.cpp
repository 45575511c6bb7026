// SPDX-License-Identifier: Apache-2.0
// --help text, man pages and the bash completion, each made from the table (see cli.h).
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cli.h"
#include "cmg_config.h"
#include "options.h"

namespace cmg::tools::cli {
namespace {

constexpr std::size_t kWidth = 79;      // --help fits an 80-column terminal
constexpr std::size_t kOptionCol = 22;  // where an option's help starts

std::vector<std::string_view> words_of(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    std::size_t j = i;
    while (j < s.size() && s[j] != ' ') ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

// `text` filled to kWidth; the first line continues `out`'s last line (already at column `col`),
// the others start at column `indent`.
void fill(std::string &out, std::size_t col, std::size_t indent, std::string_view text) {
  bool first = true;
  for (std::string_view w : words_of(text)) {
    if (!first && col + 1 + w.size() > kWidth) {
      out += '\n';
      out.append(indent, ' ');
      col = indent;
    } else if (!first) {
      out += ' ';
      ++col;
    }
    out += w;
    col += w.size();
    first = false;
  }
  out += '\n';
}

std::string full_name(const Command &c) {
  return c.name.empty() ? std::string("cumemguard") : "cumemguard " + std::string(c.name);
}

std::string option_label(const Option &o) {
  std::string s(o.names);
  if (!o.arg.empty()) s += " " + std::string(o.arg);
  return s;
}

// "-o, --output" -> {"-o", "--output"}
std::vector<std::string> option_names(const Option &o) {
  std::vector<std::string> out;
  std::string_view n = o.names;
  while (!n.empty()) {
    const std::size_t comma = n.find(',');
    std::string_view one = n.substr(0, comma);
    while (!one.empty() && one.front() == ' ') one.remove_prefix(1);
    out.emplace_back(one);
    n = comma == std::string_view::npos ? std::string_view() : n.substr(comma + 1);
  }
  return out;
}

// Text for roff: backslashes and hyphens escaped, nothing taken for a request.
std::string roff(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\e";
    else if (c == '-')
      out += "\\-";
    else
      out += c;
  }
  if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out.insert(0, "\\&");
  return out;
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (char &c : out)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return out;
}

// The paragraph with the installed documentation directory replaced by `dir` where it names it.
std::string with_doc_dir(std::string_view text, const std::string &dir) {
  std::string out(text);
  const std::string_view installed = CMG_DOCDIR;
  if (dir == installed) return out;
  for (std::size_t at = out.find(installed); at != std::string::npos;
       at = out.find(installed, at + dir.size()))
    out.replace(at, installed.size(), dir);
  return out;
}

}  // namespace

std::string doc_dir() {
  // This program in the build tree's tools/ (realpath: a symlink to it counts): the documents are
  // not installed yet, and the source tree's docs/ is the same tree the install copies.
  char self[PATH_MAX], tools[PATH_MAX];
  struct stat st {};
  if (realpath("/proc/self/exe", self) && realpath(CMG_BUILD_TOOLS_DIR, tools)) {
    std::string_view s = self;
    const std::size_t slash = s.rfind('/');
    if (slash != std::string_view::npos && s.substr(0, slash) == tools &&
        ::stat(CMG_SOURCE_DOCDIR, &st) == 0 && S_ISDIR(st.st_mode))
      return CMG_SOURCE_DOCDIR;
  }
  return CMG_DOCDIR;
}

std::string exit_table_markdown() {
  std::string out = "| status | meaning |\n|---|---|\n";
  for (const ExitStatus &e : command("").exits)
    out += "| `" + std::string(e.code) + "` | " + std::string(e.meaning) + " |\n";
  return out;
}

std::string page_name(const Command &c) {
  return c.name.empty() ? std::string("cumemguard") : "cumemguard-" + std::string(c.name);
}

std::string help_text(const Command &c) {
  const std::string docs = doc_dir();
  std::string out = "Usage: " + full_name(c) + " ";
  fill(out, out.size(), 7 + full_name(c).size() + 1, c.synopsis);
  for (std::string_view p : c.description) {
    out += '\n';
    fill(out, 0, 0, p);
  }
  if (c.name.empty()) {
    out += "\nCommands:\n";
    for (const Command &sub : commands()) {
      if (sub.name.empty()) continue;
      std::string row = "  " + std::string(sub.name);
      row.append(row.size() < 12 ? 12 - row.size() : 1, ' ');
      out += row;
      fill(out, row.size(), 12, sub.summary);
    }
    out += "  version   print the version\n";
  }
  out += "\nOptions:\n";
  for (const Option &o : c.options) {
    std::string label = "  " + option_label(o);
    if (label.size() + 2 > kOptionCol) {
      out += label + "\n";
      label.clear();
    }
    label.append(kOptionCol - label.size(), ' ');
    out += label;
    fill(out, kOptionCol, kOptionCol, with_doc_dir(o.help, docs));
  }
  if (!c.exits.empty()) {
    out += c.name.empty() ? "\nExit status (every command):\n" : "\nExit status:\n";
    std::size_t w = 0;
    for (const ExitStatus &e : c.exits) w = std::max(w, e.code.size());
    for (const ExitStatus &e : c.exits) {
      std::string row = "  " + std::string(e.code);
      row.append(2 + w + 2 - row.size(), ' ');
      out += row;
      fill(out, row.size(), row.size(), e.meaning);
    }
    if (!c.exits_note.empty()) fill(out, 0, 0, c.exits_note);
  }
  for (std::string_view p : c.notes) {
    out += '\n';
    fill(out, 0, 0, with_doc_dir(p, docs));
  }
  if (!c.environment.empty()) {
    out += "\nEnvironment:\n";
    for (const EnvVar &e : c.environment) {
      out += "  " + std::string(e.name) + "\n      ";
      fill(out, 6, 6, e.meaning);
    }
  }
  return out;
}

std::string man_page(const Command &c, std::string_view version) {
  const std::string page = page_name(c);
  std::string out;
  out += ".\\\" SPDX-License-Identifier: Apache-2.0\n";
  out += ".\\\" Made by tools/gen_cli from tools/cli_table.cpp, the table --help is made from.\n";
  out += ".TH " + roff(upper(page)) + " 1 \"\" \"cumemguard " + roff(version) +
         "\" \"User Commands\"\n";
  out += ".nh\n";  // paths and option names are not hyphenated
  out += ".SH NAME\n" + roff(page) + " \\- " + roff(c.summary) + "\n";
  out += ".SH SYNOPSIS\n.B " + roff(full_name(c)) + "\n" + roff(c.synopsis) + "\n";
  out += ".SH DESCRIPTION\n";
  for (std::size_t i = 0; i < c.description.size(); ++i)
    out += (i ? ".PP\n" : "") + roff(c.description[i]) + "\n";
  if (c.name.empty()) {
    out += ".SH COMMANDS\n";
    for (const Command &sub : commands()) {
      if (sub.name.empty()) continue;
      out += ".TP\n.B " + roff(full_name(sub)) + " " + roff(sub.synopsis) + "\n" +
             roff(sub.summary) + "; see\n.BR " + roff(page_name(sub)) + " (1).\n";
    }
    out += ".TP\n.B cumemguard version\nprint the version\n";
  }
  out += ".SH OPTIONS\n";
  for (const Option &o : c.options) {
    out += ".TP\n";
    const std::vector<std::string> names = option_names(o);
    for (std::size_t i = 0; i < names.size(); ++i)
      out += (i ? ", " : "") + std::string("\\fB") + roff(names[i]) + "\\fR";
    if (!o.arg.empty()) out += " \\fI" + roff(o.arg) + "\\fR";
    out += "\n" + roff(o.help) + "\n";
  }
  if (!c.exits.empty()) {
    out += ".SH \"EXIT STATUS\"\n";
    for (const ExitStatus &e : c.exits)
      out += ".TP\n.B " + roff(e.code) + "\n" + roff(e.meaning) + "\n";
    if (!c.exits_note.empty()) out += ".PP\n" + roff(c.exits_note) + "\n";
  }
  if (!c.environment.empty()) {
    out += ".SH ENVIRONMENT\n";
    for (const EnvVar &e : c.environment)
      out += ".TP\n.B " + roff(e.name) + "\n" + roff(e.meaning) + "\n";
  }
  if (!c.notes.empty()) {
    out += ".SH NOTES\n";
    for (std::size_t i = 0; i < c.notes.size(); ++i)
      out += (i ? ".PP\n" : "") + roff(c.notes[i]) + "\n";
  }
  out += ".SH \"SEE ALSO\"\n";
  for (const Command &other : commands())
    if (other.name != c.name) out += ".BR " + roff(page_name(other)) + " (1),\n";
  out += ".BR ld.so (8)\n";
  return out;
}

// " CUMEMGUARD_OPTIONS= CUMEMGUARD_PROFILE= ...": every option a user sets, from the options table
// (the launcher's internal variables left out), for -e and --env.
static std::string option_words() {
  std::string out = " " + std::string(kOptionsVariable) + "=";
  for (const OptionSpec &sp : option_specs())
    if (!sp.internal) out += " " + std::string(kOptionPrefix) + std::string(sp.name) + "=";
  return out;
}

std::string bash_completion() {
  std::string out =
      "# SPDX-License-Identifier: Apache-2.0\n"
      "# bash completion for cumemguard, made by tools/gen_cli from tools/cli_table.cpp (the "
      "table\n"
      "# --help is made from): subcommands, their options and the values they take, option names\n"
      "# for -e and --env (from the options table, policy/options.def, the build's own).\n"
      "_cumemguard_option_names() {\n"
      "  printf '%s\\n'" + option_words() + "\n"
      "  printf '%s\\n' PYTORCH_CUDA_ALLOC_CONF= PYTORCH_ALLOC_CONF= PYTORCH_HIP_ALLOC_CONF=\n"
      "}\n"
      "\n"
      "_cumemguard() {\n"
      "  local cur prev cmd i\n"
      "  COMPREPLY=()\n"
      "  cur=${COMP_WORDS[COMP_CWORD]}\n"
      "  prev=${COMP_WORDS[COMP_CWORD-1]}\n"
      "  cmd=\n"
      "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
      "    case ${COMP_WORDS[i]} in\n"
      "      ";
  std::string subs, top_options;
  for (const Command &c : commands())
    if (!c.name.empty()) subs += std::string(c.name) + "|";
  out += subs + "version|help) cmd=${COMP_WORDS[i]}; break ;;\n    esac\n  done\n";
  for (const Option &o : command("").options)
    for (const std::string &n : option_names(o)) top_options += " " + n;
  std::string sub_words;
  for (const Command &c : commands())
    if (!c.name.empty()) sub_words += std::string(c.name) + " ";
  out += "  if [ -z \"$cmd\" ]; then\n    COMPREPLY=($(compgen -W \"" + sub_words + "version help" +
         top_options + "\" -- \"$cur\"))\n    return\n  fi\n  case $cmd in\n";
  for (const Command &c : commands()) {
    if (c.name.empty()) continue;
    std::string all, with_arg;
    for (const Option &o : c.options)
      for (const std::string &n : option_names(o)) {
        all += (all.empty() ? "" : " ") + n;
        if (!o.arg.empty()) with_arg += (with_arg.empty() ? "" : "|") + n;
      }
    if (c.operands == Value::Command) all += " --";  // the end of the options
    out += "    " + std::string(c.name) + ")\n";
    if (c.operands == Value::Command) {
      out +=
          "      # After the program (or --), complete as for the program itself.\n"
          "      for ((i = i + 1; i < COMP_CWORD; i++)); do\n"
          "        case ${COMP_WORDS[i]} in\n"
          "          --) COMPREPLY=($(compgen -c -- \"$cur\")); return ;;\n";
      if (!with_arg.empty()) out += "          " + with_arg + ") ((i++)) ;;\n";
      out +=
          "          -*) ;;\n"
          "          *) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
          "        esac\n"
          "      done\n";
    }
    out += "      case $prev in\n";
    for (const Option &o : c.options) {
      if (o.arg.empty()) continue;
      std::string names;
      for (const std::string &n : option_names(o)) names += (names.empty() ? "" : "|") + n;
      out += "        " + names + ") ";
      switch (o.value) {
        case Value::File:
          out += "COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n";
          break;
        case Value::Log:
          out +=
              "COMPREPLY=($(compgen -f -X '!*.log*' -- \"$cur\") $(compgen -d -- \"$cur\")); "
              "return ;;\n";
          break;
        case Value::Output:
          // The output slot is where a glob of logs goes by mistake: offer what it writes.
          out += "COMPREPLY=($(compgen -f -X '" + std::string(o.choices) + "' -- \"$cur\")" +
                 (o.choices.starts_with('!') ? " $(compgen -d -- \"$cur\")" : "") +
                 "); return ;;\n";
          break;
        case Value::Word:
          out += "COMPREPLY=($(compgen -W \"" + std::string(o.choices) +
                 "\" -- \"$cur\")); "
                 "return ;;\n";
          break;
        case Value::EnvName:
          out +=
              "compopt -o nospace 2>/dev/null\n"
              "          COMPREPLY=($(compgen -W \"$(_cumemguard_option_names "
              "\"${COMP_WORDS[0]}\")\" -- \"$cur\"))\n"
              "          return ;;\n";
          break;
        case Value::Command:
          out += "COMPREPLY=($(compgen -c -- \"$cur\")); return ;;\n";
          break;
        default:
          out += "return ;;\n";
          break;
      }
    }
    out += "      esac\n";
    const std::string options_reply = "COMPREPLY=($(compgen -W \"" + all + "\" -- \"$cur\"))";
    if (c.operands == Value::None) {
      out += "      " + options_reply + "\n";
    } else {
      out += "      if [[ $cur == -* ]]; then\n        " + options_reply + "\n      else\n";
      if (c.operands == Value::Command)
        out += "        COMPREPLY=($(compgen -c -- \"$cur\"))\n";
      else
        out +=
            "        COMPREPLY=($(compgen -f -X '!*.log*' -- \"$cur\") $(compgen -d -- "
            "\"$cur\"))\n";
      out += "      fi\n";
    }
    out += "      ;;\n";
  }
  out += "  esac\n}\ncomplete -F _cumemguard cumemguard\n";
  return out;
}

}  // namespace cmg::tools::cli
