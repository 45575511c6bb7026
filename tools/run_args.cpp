// SPDX-License-Identifier: Apache-2.0
// run's options read, checked and exported (see run_args.h).
#include "run_args.h"

#include <cstdlib>
#include <cstring>

namespace cmg::tools {
namespace {

enum class Opt {
#define CMG_RUN_OPTION(id, name, alias, value, help) id,
#include "run_options.def"
#undef CMG_RUN_OPTION
};

struct RunOption {
  Opt id;
  std::string_view name, alias, value;
};

constexpr RunOption kRunOptions[] = {
#define CMG_RUN_OPTION(id, name, alias, value, help) {Opt::id, name, alias, value},
#include "run_options.def"
#undef CMG_RUN_OPTION
};

struct OptionName {
  std::string_view id, name;
};
constexpr OptionName kNames[] = {
#define CMG_RUN_OPTION(id, name, alias, value, help) {#id, name},
#include "run_options.def"
};
constexpr OptionName kSets[] = {
#define CMG_RUN_OPTION_SETS(id, name) {#id, name},
#include "run_options.def"
};

// The -e that sets shim option `var`, as given, or empty.
std::string setting_of(std::string_view var,
                       const std::vector<std::pair<std::string, std::string>> &sets) {
  for (const auto &[name, value] : sets) {
    if (name.starts_with(kOptionPrefix) &&
        std::string_view(name).substr(kOptionPrefix.size()) == var)
      return name + "=" + value;
    if (name != kOptionsVariable) continue;
    const std::pair<std::string_view, std::string_view> kv[] = {{name, value}};
    for (const OptionValue &v : parse_options(kv).values)
      if (v.source == OptionSource::Options && v.spec->name == var) return name + "=" + value;
  }
  return {};
}

// The variable the launcher finds the shim by: read in the launcher's own environment.
constexpr std::string_view kShimPathVariable = "CUMEMGUARD_SHIM_PATH";

// Why `-e NAME=VALUE` cannot give the program a launcher variable, or empty. The launcher sets the
// others after the -e values (or keeps an outer launcher's), so the user's value was dropped
// without a word, or (CUMEMGUARD_STATUS_DIR with CUMEMGUARD_RUN_ID) taken for an outer run's.
std::string launcher_variable_problem(const std::string &name, const std::string &value) {
  if (!launcher_variable(name)) return {};
  if (name == kShimPathVariable)
    return "the launcher reads " + name + " in its own environment, not in the program's: set it " +
           "before the command (" + name + "=" + shown(value) + " cumemguard run ...)";
  return name + " is set by the launcher and the shim themselves; -e cannot give it to the program";
}

std::string absolute_in(const std::string &p, const std::string &cwd) {
  return p.empty() || p[0] == '/' ? p : cwd + "/" + p;
}

}  // namespace

RunOptionRead read_run_option(int argc, char **argv, int &i, RunArgs &r, std::string_view command,
                              std::string &err) {
  const std::string_view a = argv[i] ? argv[i] : "";
  const RunOption *o = nullptr;
  std::string value;
  bool inline_value = false;
  for (const RunOption &c : kRunOptions) {
    if (a == c.name || (!c.alias.empty() && a == c.alias)) {
      o = &c;
      break;
    }
    if (!c.value.empty() && c.name.starts_with("--") && a.starts_with(c.name) &&
        a.size() > c.name.size() && a[c.name.size()] == '=') {
      o = &c;
      value = a.substr(c.name.size() + 1);
      inline_value = true;
      break;
    }
    // A short option's value attached, as getopt takes it: -eNAME=VALUE (it was "unknown").
    if (!c.value.empty() && c.name.size() == 2 && c.name[1] != '-' && a.size() > 2 &&
        a.starts_with(c.name)) {
      o = &c;
      value = a.substr(2);
      inline_value = true;
      break;
    }
  }
  if (!o) return RunOptionRead::NotOne;
  if (!o->value.empty() && !inline_value) {
    // `--log --`: an option's value is never the end of the options (a log named "--" is a
    // mistake).
    if (i + 1 >= argc || !argv[i + 1] || std::strcmp(argv[i + 1], "--") == 0) {
      err = std::string(o->name) + " needs a value (see cumemguard " + std::string(command) +
            " --help)";
      return RunOptionRead::Bad;
    }
    value = argv[++i];
  }
  r.given.push_back(o->name);
  switch (o->id) {
    case Opt::log:
      if (value.empty()) {
        // Not the default log, which an empty path used to give: an empty CUMEMGUARD_LOG means
        // no log, so the user asked for one of the two without saying which.
        err = "--log needs a path (use --no-log for no log)";
        return RunOptionRead::Bad;
      }
      r.log = value;
      break;
    case Opt::no_log:
      r.no_log = true;
      break;
    case Opt::mode:
      r.mode = value;
      break;
    case Opt::stacks:
      r.stacks = value;
      break;
    case Opt::suppressions:
      if (!r.suppressions.empty()) {
        // The shim reads one file (CUMEMGUARD_SUPPRESSIONS); a second would be dropped.
        err = "--suppressions takes one file; given twice ('" + r.suppressions + "', then '" +
              value + "')";
        return RunOptionRead::Bad;
      }
      r.suppressions = value;
      break;
    case Opt::brief:
      r.brief = true;
      break;
    case Opt::no_summary:
      r.no_summary = true;
      break;
    case Opt::error_exitcode:
      r.exitcode = value;
      break;
    case Opt::fail_on_leaks:
      r.fail_on_leaks = true;
      break;
    case Opt::env:
      r.env_sets.push_back(value);
      break;
    case Opt::help:
      r.help = true;
      break;
    case Opt::version:
      r.version = true;
      break;
  }
  return RunOptionRead::Taken;
}

bool launcher_variable(std::string_view name) {
  if (!name.starts_with(kOptionPrefix)) return false;
  for (const OptionSpec &sp : option_specs())
    if (sp.internal && name.substr(kOptionPrefix.size()) == sp.name) return true;
  return false;
}

RunChecked check_run_args(const RunArgs &a, std::string_view not_started) {
  RunChecked c;
  auto refuse = [&](std::string line) {
    c.refusals.push_back(std::move(line));
    return c;
  };
  if (!a.mode.empty() && a.mode != "guard" && a.mode != "report" && a.mode != "strict")
    return refuse("--mode must be guard, report or strict, not '" + shown(a.mode) + "'" +
                  choice_hint("guard|report|strict", a.mode));
  // Either order: one of the two would be dropped without a word.
  if (a.no_log && !a.log.empty()) return refuse("--log and --no-log conflict (give one)");
  if (!a.exitcode.empty()) {
    char *end = nullptr;
    const long v = std::strtol(a.exitcode.c_str(), &end, 10);
    if (!end || *end || v < 0 || v > 255)
      return refuse("--error-exitcode must be 0 to 255, not '" + a.exitcode + "'");
    c.error_exitcode = static_cast<int>(v);
  }
  if (a.fail_on_leaks && !c.error_exitcode)
    return refuse("--fail-on-leaks needs --error-exitcode N");
  // What the shim would make of a CUMEMGUARD_* setting, checked here so that one that cannot apply
  // (an unknown name, a bad value, a malformed CUMEMGUARD_OPTIONS entry) stops the run with a
  // line saying so, instead of becoming a warning in the program and the shim's default.
  auto check_options = [&](std::string_view name, std::string_view value,
                           const std::string &label) {
    const std::pair<std::string_view, std::string_view> kv[] = {{name, value}};
    for (const std::string &line : run_refusals(parse_options(kv)))
      c.refusals.push_back(label + ": " + line + "; " + std::string(not_started));
    return c.refusals.empty();
  };
  if (!a.stacks.empty() && !check_options("CUMEMGUARD_STACKS", a.stacks, "--stacks")) return c;
  for (const std::string &kv : a.env_sets) {
    const std::size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return refuse("-e expects NAME=VALUE, got '" + kv + "'");
    c.sets.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  for (const auto &[name, value] : c.sets) {
    const std::string label = "-e " + name + "=" + shown(value);
    if (const std::string p = launcher_variable_problem(name, value); !p.empty())
      return refuse(label + ": " + p + "; " + std::string(not_started));
    if ((has_option_prefix(name) || !misspelt_prefix_meant(name).empty()) &&
        !check_options(name, value, label))
      return c;
  }
  if (const std::string p = option_env_conflict(a.given, c.sets); !p.empty())
    return refuse(p + " (" + std::string(not_started) + ")");
  return c;
}

std::vector<RunDefault> run_exports(const RunArgs &a, const ParsedOptions &user,
                                    const std::string &program, const std::string &cwd) {
  const std::string prefix(kOptionPrefix);
  std::vector<RunDefault> out;
  if (!a.mode.empty()) out.push_back({prefix + "MODE", a.mode, "--mode"});
  if (!a.stacks.empty()) out.push_back({prefix + "STACKS", a.stacks, "--stacks"});
  if (!a.suppressions.empty())
    out.push_back({prefix + "SUPPRESSIONS", absolute_in(a.suppressions, cwd), "--suppressions"});
  if (a.brief) out.push_back({prefix + "WARN_FRAMES", "0", "--brief"});
  // What the user set, by a variable or an entry of CUMEMGUARD_OPTIONS, is left as it is; the
  // rest gets the launcher's defaults.
  for (RunDefault &d : run_defaults(user, program, cwd)) {
    if (d.name == prefix + "SUMMARY" && a.no_summary) continue;
    if (d.name == prefix + "LOG" && (a.no_log || !a.log.empty())) continue;
    out.push_back(std::move(d));
  }
  // Empty: no log, and it wins over a CUMEMGUARD_OPTIONS entry.
  if (a.no_log)
    out.push_back({prefix + "LOG", "", "--no-log"});
  else if (!a.log.empty())
    out.push_back({prefix + "LOG", absolute_in(a.log, cwd), "--log"});
  // A relative CUMEMGUARD_LOG (-e, the environment or an entry of CUMEMGUARD_OPTIONS) as --log
  // makes it: against this directory. The shim opens its log where the process is at its first
  // CUDA call, and a program that changed directory wrote it there while the list of logs and the
  // "read with" line named it here. The separate variable wins over an entry; a placeholder never
  // adds a directory, so a name that does not start with '/' is relative whatever it expands to.
  else if (const std::string &l = user.options.log; !l.empty() && l[0] != '/')
    out.push_back({prefix + "LOG", absolute_in(l, cwd), std::string(kMadeAbsolute)});
  return out;
}

std::string torch_override_refusal(std::string_view value, const std::string &reason,
                                   bool entry) {
  constexpr std::string_view kVar = "CUMEMGUARD_TORCH_ALLOC_CONF", kKept = "; keeping the original";
  const std::string name = entry ? "its torch_alloc_conf entry" : std::string(kVar);
  std::string why = reason;
  if (why.ends_with(kKept)) why.resize(why.size() - kKept.size());
  if (why.starts_with(kVar)) return name + why.substr(kVar.size());
  return name + "='" + shown(value) + "': " + why;
}

TorchOverride torch_override(const ParsedOptions &po,
                             const std::vector<std::pair<std::string, std::string>> &sets) {
  TorchOverride t{po.options.torch_alloc_conf, "environment"};
  if (t.value.empty()) return t;
  bool from_entry = false;
  for (const OptionValue &v : po.values)
    if (v.spec->name == "TORCH_ALLOC_CONF") from_entry = v.source == OptionSource::Options;
  const std::string var = from_entry ? "CUMEMGUARD_OPTIONS" : "CUMEMGUARD_TORCH_ALLOC_CONF";
  // The last -e of the name: it is the one setenv() left in the environment.
  for (auto it = sets.rbegin(); it != sets.rend(); ++it)
    if (it->first == var) return {t.value, "-e " + it->first + "=" + shown(it->second), from_entry};
  if (from_entry) t.label = "environment: CUMEMGUARD_OPTIONS";
  t.entry = from_entry;
  return t;
}

std::string option_env_conflict(const std::vector<std::string_view> &given,
                                const std::vector<std::pair<std::string, std::string>> &sets) {
  for (std::string_view opt : given)
    for (const OptionName &n : kNames) {
      if (n.name != opt) continue;
      for (const OptionName &s : kSets) {
        if (s.id != n.id) continue;
        const std::string e = setting_of(s.name, sets);
        if (e.empty()) continue;
        return std::string(opt) + " and -e " + shown(e) + " both set CUMEMGUARD_" +
               std::string(s.name) + "; give one of them";
      }
    }
  return {};
}

}  // namespace cmg::tools
