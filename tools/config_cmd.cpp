// SPDX-License-Identifier: Apache-2.0
// `cumemguard config`: the environment through policy/torch_conf and policy/options, text or JSON.
// Options print like libfabric's `fi_info -e`; the JSON schema is docs/config-json.md.
#include "config_cmd.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <map>
#include <set>
#include <string>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "cli.h"
#include "cmg_config.h"
#include "config_torch_version.h"
#include "options.h"
#include "run_args.h"
#include "run_env_checks.h"
#include "run_defaults.h"
#include "torch_conf.h"

namespace cmg {
namespace {

namespace tc = torchconf;
using json = nlohmann::ordered_json;

// The exit statuses every subcommand shares (README "Exit status").
constexpr int kExitOk = 0;
constexpr int kExitTorchFails = 1;
constexpr int kExitUsage = 64;  // EX_USAGE from sysexits.h
constexpr int kExitNoInput = 66;  // EX_NOINPUT: the interpreter --python names
constexpr int kJsonSchema = 1;

struct Args {
  bool json = false;
  bool help = false;
  bool version = false;
  bool as_run = false;
  std::vector<std::pair<std::string, std::optional<std::string>>> env;
  std::optional<torchconf::TorchVersion> torch_version;
  std::string python = "python3";
  tools::RunArgs run;      // cumemguard run's own options, for --run (run_options.def)
  bool err_whole = false;  // the error is run's reader's line, which says what to do itself
  bool python_given = false;  // --python: an interpreter that cannot be asked is refused
};

bool valid_name(std::string_view n) {
  if (n.empty() || (n[0] >= '0' && n[0] <= '9')) return false;
  for (char c : n)
    if (!(c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')))
      return false;
  return true;
}

bool parse_args(int argc, char **argv, Args &a, std::string &err) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i] ? argv[i] : "";
    if (arg == "--json") {
      a.json = true;
    } else if (arg == "-h" || arg == "--help") {
      a.help = true;
    } else if (arg == "--version") {
      a.version = true;
    } else if (arg == "--run") {
      a.as_run = true;
    } else if (arg == "--torch-version" || arg.starts_with("--torch-version=") || arg == "--python" ||
               arg.starts_with("--python=")) {
      const bool version = arg.starts_with("--torch-version");
      const std::string_view name = version ? "--torch-version" : "--python";
      std::string_view v;
      if (arg == name) {
        if (i + 1 >= argc || !argv[i + 1]) {
          err = std::string(name) + (version ? " needs a release such as 2.9.1" : " needs a path");
          return false;
        }
        v = argv[++i];
      } else {
        v = arg.substr(name.size() + 1);
      }
      if (version) {
        a.torch_version = torchconf::parse_torch_version(v);
        if (!a.torch_version) {
          err = "--torch-version: '" + std::string(v) + "' is not a release such as 2.9.1";
          return false;
        }
      } else if (v.empty()) {
        err = "--python needs a path";
        return false;
      } else {
        a.python = std::string(v);
        a.python_given = true;
      }
    } else if (arg == "--env" || arg.starts_with("--env=")) {
      std::string_view v;
      if (arg == "--env") {
        if (i + 1 >= argc || !argv[i + 1]) {
          err = "--env needs NAME=VALUE or NAME";
          return false;
        }
        v = argv[++i];
      } else {
        v = arg.substr(6);
      }
      const std::size_t eq = v.find('=');
      const std::string_view name = v.substr(0, eq);
      if (!valid_name(name)) {
        err = "--env: '" + std::string(name) + "' is not a variable name";
        return false;
      }
      a.env.emplace_back(std::string(name), eq == std::string_view::npos
                                                ? std::nullopt
                                                : std::optional<std::string>(v.substr(eq + 1)));
    } else {
      // run's options, read as run reads them: --run shows what they make of the environment.
      std::string bad;
      const tools::RunOptionRead got = tools::read_run_option(argc, argv, i, a.run, "config", bad);
      if (got == tools::RunOptionRead::Bad) {
        err = bad;
        a.err_whole = true;
        return false;
      }
      if (got == tools::RunOptionRead::NotOne) {
        err = (arg.starts_with('-') ? "unknown option '" : "unexpected argument '") + shown(arg) +
              "'" + tools::cli::option_hint(tools::cli::command("config"), arg);
        return false;
      }
    }
  }
  if (!a.as_run && !a.run.given.empty()) {
    err = std::string(a.run.given[0]) + " is an option of cumemguard run: give --run with it";
    return false;
  }
  return true;
}

// The environment to evaluate: the process's, edited by --env, in environ order.
using EnvList = std::vector<std::pair<std::string, std::string>>;

// The log name's %q{VAR} reads the program's environment through a plain function pointer
// (shim/logname.h): config's is a list, named here while it is checked (config runs once).
const EnvList *g_lookup_env = nullptr;
// The first of a name, as getenv() and the options' parser read the list. The variables run sets
// in every program's environment (its id and status directory, the preload) are there for a log
// name's %q{VAR} as they will be under run, whatever config's own environment holds.
const char *lookup_in_env(const char *name) {
  if (!g_lookup_env) return nullptr;
  for (const auto &[n, v] : *g_lookup_env)
    if (n == name) return v.c_str();
  for (const char *set : {"CUMEMGUARD_RUN_ID", "CUMEMGUARD_STATUS_DIR", "LD_PRELOAD"})
    if (std::strcmp(name, set) == 0) return set;
  return nullptr;
}

EnvList build_env(char **envp, const Args &a) {
  EnvList env;
  for (char **p = envp; p && *p; ++p) {
    const std::string_view kv(*p);
    const std::size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    // Repeated names are kept: the options parser reads the first entry, as getenv() and the
    // shim do, and says that there were more; lookup() returns the first too.
    env.emplace_back(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  for (const auto &[name, value] : a.env) {
    std::erase_if(env, [&](const auto &e) { return e.first == name; });
    if (value) env.emplace_back(name, *value);
  }
  return env;
}

std::optional<std::string> lookup(const EnvList &env, std::string_view name) {
  for (const auto &e : env)
    if (e.first == name) return e.second;
  return std::nullopt;
}

std::string in_quotes(std::string_view s) {
  return "'" + std::string(s) + "'";
}

std::string source_name(const tc::Outcome &o, tc::Key k) {
  const tc::Var v = o.source[static_cast<std::size_t>(k)];
  return v == tc::Var::None ? std::string("default") : std::string(tc::var_name(v));
}

json var_json(tc::Var v) {
  return v == tc::Var::None ? json(nullptr) : json(std::string(tc::var_name(v)));
}

// torch.cuda.memory._snapshot()["allocator_settings"] as 2.11 builds it (reference §5).
json snapshot_json(const tc::Settings &s) {
  json d = json::object();
  for (std::size_t i = 0; i < s.roundup_power2_divisions.size(); ++i)
    d[std::to_string(1ull << i)] = s.roundup_power2_divisions[i];
  return json{{"PYTORCH_CUDA_ALLOC_CONF", s.last_allocator_settings},
              {"max_split_size", tc::snapshot_max_split_size(s)},
              {"garbage_collection_threshold", s.garbage_collection_threshold},
              {"expandable_segments", s.expandable_segments},
              {"pinned_num_register_threads", s.pinned_num_register_threads},
              {"release_lock_on_cudamalloc", s.release_lock_on_cudamalloc},
              {"pinned_use_cuda_host_register", s.pinned_use_cuda_host_register},
              {"graph_capture_record_stream_reuse", s.graph_capture_record_stream_reuse},
              {"roundup_power2_divisions", d}};
}

json error_json(const tc::Outcome &o) {
  if (!o.error) return nullptr;
  return json{{"type", std::string(tc::error_type_name(o.error->type))},
              {"message", o.error->message},
              {"internal_assert", o.error->internal_assert},
              {"python", o.error->python()},
              {"parser", std::string(tc::parser_name(o.error_parser))},
              {"variable", var_json(o.error_var)},
              {"when", o.cls == tc::OutcomeClass::ImportAbort ? "import"
                       : o.cls == tc::OutcomeClass::Exception ? "first-allocation"
                                                              : "first-settings-call"}};
}

json problems_json(const std::vector<tc::Problem> &ps) {
  json a = json::array();
  for (const tc::Problem &p : ps)
    a.push_back({{"severity", std::string(tc::severity_name(p.severity))}, {"message", p.text}});
  return a;
}

std::string option_source(const OptionValue &v) {
  if (v.rejected) return "invalid";
  return std::string(option_source_name(v.source));
}

// Which profile is in force and why, in words.
std::string profile_why(const ParsedOptions &po, bool set_by_run) {
  const std::string name = po.options.profile == Profile::Debug ? "debug" : "guard";
  if (set_by_run) return name + ": set by cumemguard run";
  switch (po.profile_source) {
    case OptionSource::Environment: return name + ": set by CUMEMGUARD_PROFILE";
    case OptionSource::Options: return name + ": set by CUMEMGUARD_OPTIONS";
    default: break;
  }
  return name + ": default (a plain LD_PRELOAD; cumemguard run sets debug)";
}

json torch_json(const tc::Env &env, const tc::Plan &p, const tc::Judgement &jd,
                const std::optional<std::string> &override_raw) {
  const tc::Outcome &o = jd.outcome;  // as the judged release reads it
  json vars = json::object();
  for (tc::Var v : tc::kVars) {
    const auto &val = env.get(v);
    vars[std::string(tc::var_name(v))] = val ? json(*val) : json(nullptr);
  }
  json parsers = json::array();
  for (tc::Parser q : {tc::Parser::Load, tc::Parser::Cuda, tc::Parser::Accel}) {
    const tc::Read &r = o.read(q);
    parsers.push_back({{"parser", std::string(tc::parser_name(q))},
                       {"when", q == tc::Parser::Load ? "import" : "first-allocation"},
                       {"role", std::string(tc::parser_title(q))},
                       {"variable", var_json(r.var)},
                       {"reason", r.reason}});
  }
  const tc::Settings defaults;
  json keys = json::array();
  for (const tc::KeyInfo &k : tc::keys()) {
    if (!o.grammar.knows(k.key)) continue;  // this release's key set
    json row{{"key", std::string(k.name)},
             {"first_release", std::string(k.first)},
             {"alias", k.alias.empty() ? json(nullptr) : json(std::string(k.alias))},
             {"parser", std::string(tc::parser_name(k.owner))},
             {"setting", std::string(k.setting)},
             {"unit", std::string(k.unit)},
             {"in_snapshot", k.in_snapshot},
             {"effective", key_value(o.settings, k.key)},
             {"default", key_value(defaults, k.key)},
             {"source", source_name(o, k.key)},
             {"help", std::string(k.help)}};
    keys.push_back(std::move(row));
  }
  const bool snapshot = o.cls == tc::OutcomeClass::Ok && o.load_backend == tc::Backend::Native;
  json warnings = json::array();
  for (const std::string &w : o.warnings) warnings.push_back(w);
  json writes = json::array();
  for (const tc::Write &w : p.writes)
    writes.push_back({{"variable", std::string(tc::var_name(w.var))},
                      {"create", w.create},
                      {"old", w.old_value ? json(*w.old_value) : json(nullptr)},
                      {"new", w.new_value},
                      {"why", w.why}});
  json over{{"value", override_raw ? json(*override_raw) : json(nullptr)},
            {"action", std::string(tc::plan_action_name(p.action))},
            {"reason", p.reason},
            {"writes", writes},
            {"result_outcome",
             p.after ? json(std::string(tc::outcome_name(p.after->cls))) : json(nullptr)}};
  return json{{"build", "cuda"},
              {"torch_versions", std::string(o.grammar.release)},
              {"torch_version", version_json(jd)},
              {"variables", vars},
              {"parsers", parsers},
              {"outcome", std::string(tc::outcome_name(o.cls))},
              {"error", error_json(o)},
              {"deferred", o.deferred},
              {"load_backend", std::string(tc::backend_name(o.load_backend))},
              {"expandable_segments_ipc", ipc_json(env)},
              {"keys", keys},
              {"snapshot", snapshot ? snapshot_json(o.settings) : json(nullptr)},
              {"warnings", warnings},
              {"problems", problems_json(p.problems)},
              {"known_problems", known_problems_json(jd)},
              {"override", over}};
}

// Where a value came from, with --run: the launcher's own setting, or an -e the user gave it,
// before what the parsed environment says (an -e value is in the environment by then).
std::string run_source(const OptionValue &v, const std::set<std::string_view> &by_run,
                       const std::set<std::string_view> &by_e) {
  if (by_run.count(v.spec->name)) return "cumemguard run";
  if (by_e.count(v.spec->name) && v.source == OptionSource::Environment) return "run -e";
  return {};
}

json options_json(const ParsedOptions &po, const std::set<std::string_view> &by_run,
                  const std::set<std::string_view> &by_e) {
  json a = json::array();
  for (const OptionValue &v : po.values) {
    json choices = json::array();
    for (std::string_view c = v.spec->choices; !c.empty();) {
      const std::size_t bar = c.find('|');
      choices.push_back(std::string(c.substr(0, bar)));
      c = bar == std::string_view::npos ? std::string_view() : c.substr(bar + 1);
    }
    a.push_back(
        {{"name", std::string(kOptionPrefix) + std::string(v.spec->name)},
         {"type", std::string(option_kind_name(v.spec->kind))},
         {"choices", choices},
         {"default", std::string(v.spec->default_value)},
         {"debug_default", std::string(v.spec->debug_value)},
         {"effective", v.effective},
         {"source", [&] {
            const std::string r = run_source(v, by_run, by_e);
            return r.empty() ? option_source(v) : r;
          }()},
         {"raw",
          v.source == OptionSource::Environment || v.source == OptionSource::Options || v.rejected
              ? json(v.raw)
              : json(nullptr)},
         {"help", std::string(v.spec->help)}});
  }
  return a;
}

// The table keeps one line per key: 16 equal divisions print as "16 x N", others without spaces.
// A key named in MiB (`max_split_size_mb:128`) shows its value in MiB as written, with the bytes
// PyTorch holds after it: `128 (134217728 B)`, never bytes alone under an _mb name.
std::string table_text(const tc::Settings &s, tc::Key k) {
  if (k == tc::Key::LargeSegmentSizeMb || k == tc::Key::MaxSplitSizeMb ||
      k == tc::Key::MaxNonSplitRoundingMb) {
    const std::string bytes = tc::effective_text(s, k);
    if (bytes.starts_with("-")) return "unlimited (" + bytes + ")";
    const unsigned long long b = std::stoull(bytes);
    constexpr unsigned long long kMiB = 1ull << 20;
    const std::string mib = b % kMiB == 0 ? std::to_string(b / kMiB)
                                          : std::to_string(static_cast<double>(b) / kMiB);
    return mib + " (" + bytes + " B)";
  }
  if (k != tc::Key::RoundupPower2Divisions) return tc::effective_text(s, k);
  const auto &d = s.roundup_power2_divisions;
  if (std::adjacent_find(d.begin(), d.end(), std::not_equal_to<>()) == d.end())
    return std::to_string(d.size()) + " x " + std::to_string(d[0]);
  std::string r;
  for (auto v : d) r += (r.empty() ? "" : ",") + std::to_string(v);
  return r;
}

void print_torch_text(std::ostream &out, const tc::Env &env, const tc::Plan &p,
                      const tc::Judgement &jd, const std::optional<std::string> &override_raw,
                      bool override_in_force) {
  const tc::Outcome &o = jd.outcome;  // as the judged release reads it
  // No torch release found or named, nothing of PyTorch's set and no override (the variable or
  // CUMEMGUARD_OPTIONS' torch_alloc_conf entry) to plan: the release's whole default table
  // answered a question nobody asked (40 lines before the shim's own options); said in three.
  if (jd.source.starts_with("default") && env == tc::Env{} && !override_raw && !override_in_force &&
      p.action == tc::PlanAction::None && jd.known.empty() && p.problems.empty() &&
      o.cls == tc::OutcomeClass::Ok && !o.error) {
    out << "PyTorch allocator configuration: nothing to check\n  judged: " << jd.summary()
        << "\n  no PyTorch allocator variable and no CUMEMGUARD_TORCH_ALLOC_CONF is set: torch "
        << jd.version.text << " would read its defaults\n"
        << "  (--torch-version V lists what release V reads; --python PATH asks another interpreter)\n";
    return;
  }
  out << "PyTorch allocator configuration (as torch " << jd.version.text
      << " reads it on a CUDA build)\n  judged: " << jd.summary() << "\n";
  // Before 2.8 (one parser) a CUDA build reads PYTORCH_CUDA_ALLOC_CONF alone (reader()).
  const bool legacy = jd.grammar.family == tc::Family::Legacy;
  for (tc::Var v : tc::kVars) {
    const auto &val = env.get(v);
    out << "  " << tc::var_name(v) << std::string(26 - tc::var_name(v).size(), ' ')
        << (val ? in_quotes(*val) : std::string("unset"))
        << (legacy && v != tc::Var::Cuda ? "  (not read by torch " + jd.version.text + ")"
                                         : std::string())
        << '\n';
  }
  out << "  " << tc::kExpandableIpcVar << "  "
      << (env.expandable_ipc ? in_quotes(*env.expandable_ipc) + " " : std::string()) << "("
      << ipc_meaning(env) << ")\n";
  out << '\n';
  for (tc::Parser q : {tc::Parser::Load, tc::Parser::Cuda, tc::Parser::Accel}) {
    const tc::Read &r = o.read(q);
    out << "  " << tc::parser_name(q) << "  " << tc::parser_title(q) << ":\n      "
        << (r.var == tc::Var::None ? std::string("no variable") : std::string(tc::var_name(r.var)))
        << " (" << r.reason << ")\n";
  }
  out << "\n  outcome: ";
  switch (o.cls) {
    case tc::OutcomeClass::Ok:
      if (!o.error)
        // Which release accepts it: the judged one, which is the default when no torch is
        // installed for the interpreter asked (the judged line says so).
        out << "ok (torch " << jd.version.text << " accepts this environment"
            << (jd.source.starts_with("default") ? "; no installed torch release was found, so this is the "
                                                   "default release's answer"
                                                 : "")
            << ")\n";
      else
        out << "ok at allocations (backend:cudaMallocAsync does not read the other keys there); "
               "the first allocator-settings call raises "
            << o.error->python() << " (parser " << tc::parser_name(o.error_parser) << ", "
            << tc::var_name(o.error_var) << ")\n";
      break;
    case tc::OutcomeClass::Exception:
      out << "the first CUDA allocation raises " << o.error->python() << " (parser "
          << tc::parser_name(o.error_parser) << ", " << tc::var_name(o.error_var) << ")\n";
      break;
    case tc::OutcomeClass::ImportAbort:
      out << "import torch aborts (std::terminate, SIGABRT) reading " << tc::var_name(o.error_var)
          << ": " << o.error->what() << '\n';
      break;
  }
  if (o.error) out << "  (values below: as far as PyTorch gets)\n";
  out << '\n';
  const tc::Settings defaults;
  char line[512];
  std::snprintf(line, sizeof line, "  %-34s %-22s %-22s %s\n", "key", "effective", "default",
                "source");
  out << line;
  for (const tc::KeyInfo &k : tc::keys()) {
    if (!o.grammar.knows(k.key)) continue;  // this release's key set
    std::string name(k.name);
    if (!k.in_snapshot) name += " *";
    std::snprintf(line, sizeof line, "  %-34s %-22s %-22s %s\n", name.c_str(),
                  table_text(o.settings, k.key).c_str(), table_text(defaults, k.key).c_str(),
                  source_name(o, k.key).c_str());
    out << line;
  }
  out << "  (the keys torch " << o.grammar.release
      << " parses; keys named _mb in MiB as written, the bytes PyTorch holds in parentheses; the "
         "snapshot\n"
         "   reports max_split_size in bytes, -1 = unlimited;\n"
         "   * = not in torch.cuda.memory._snapshot()[\"allocator_settings\"])\n\n";
  if (p.problems.empty()) {
    out << "  problems: none\n";
  } else {
    out << "  problems:\n";
    for (const tc::Problem &pr : p.problems)
      out << "    " << tc::severity_name(pr.severity) << ": " << pr.text << '\n';
  }
  print_known_problems(out, jd);
  out << "\n  CUMEMGUARD_TORCH_ALLOC_CONF: "
      << (override_raw ? in_quotes(*override_raw) : std::string("unset")) << '\n';
  switch (p.action) {
    case tc::PlanAction::None:
      out << "    nothing to do: " << p.reason << '\n';
      break;
    case tc::PlanAction::Refuse:
      out << "    refused (the shim keeps the original and reports a config finding): " << p.reason
          << '\n';
      break;
    case tc::PlanAction::Write:
      for (const tc::Write &w : p.writes)
        out << "    " << (w.create ? "create " : "set ") << tc::var_name(w.var) << "="
            << in_quotes(w.new_value) << "  (" << w.why << ")\n";
      break;
  }
}

// What --error-exitcode and --fail-on-leaks given with --run make of the launcher's status: they
// set nothing in the program's environment.
std::string gate_text(const tools::RunArgs &run, int error_exitcode) {
  if (run.exitcode.empty()) return {};
  if (!error_exitcode) return "exit status: the program's own (--error-exitcode 0)";
  const std::string n = std::to_string(error_exitcode);
  return "exit status: " + n + " when a process of the run has findings that are not suppressed" +
         (run.fail_on_leaks ? ", leaks at exit included (--fail-on-leaks)" : "") +
         ", or when nothing was checked (--error-exitcode " + n + ")";
}

void print_options_text(std::ostream &out, const ParsedOptions &po, const EnvList &env,
                        const std::set<std::string_view> &by_run,
                        const std::set<std::string_view> &by_e,
                        const std::map<std::string_view, std::string> &run_option,
                        const std::string &gate) {
  out << "\ncumemguard options\n"
      << "  profile " << profile_why(po, by_run.count("PROFILE") > 0) << '\n';
  if (!gate.empty()) out << "  " << gate << '\n';
  if (po.has_options_variable)
    out << "  " << kOptionsVariable << "=" << in_quotes(po.options_variable)
        << "  (a separate CUMEMGUARD_<NAME> variable wins over its entries)\n";
  out << '\n';
  const char *profile = po.options.profile == Profile::Debug ? "debug" : "guard";
  // The per-class ACTION_* rows share one help text: those left at their default are named in
  // one block after the rest (29 repeats of three lines made most of the listing), and one set
  // in any way is listed as any option is.
  std::vector<std::string_view> default_actions;
  std::string_view action_help;
  for (const OptionValue &v : po.values) {
    if (v.spec->name.starts_with("ACTION_") && v.source == OptionSource::Default && !v.rejected &&
        run_source(v, by_run, by_e).empty()) {
      default_actions.push_back(v.spec->name.substr(7));
      action_help = v.spec->help;
      continue;
    }
    const std::string name = std::string(kOptionPrefix) + std::string(v.spec->name);
    out << "# " << name << ": " << option_kind_name(v.spec->kind);
    if (!v.spec->choices.empty()) out << " (" << v.spec->choices << ")";
    out << ", default " << (v.spec->default_value.empty() ? "''" : in_quotes(v.spec->default_value));
    if (v.spec->debug_value != v.spec->default_value)
      out << ", debug profile " << in_quotes(v.spec->debug_value);
    out << "\n# " << v.spec->help << '\n' << name << '=' << v.effective << "  (";
    const std::string src = option_source(v);
    if (const std::string r = run_source(v, by_run, by_e); !r.empty()) {
      const auto opt = run_option.find(v.spec->name);
      out << (r == "run -e"                 ? std::string("-e of cumemguard run")
              : opt != run_option.end()     ? opt->second
                                            : std::string("set by cumemguard run"));
    } else if (src == "invalid") {
      const auto raw = lookup(env, name);
      out << "invalid: " << (raw ? in_quotes(*raw) + " in the environment" : "the entry in " +
                                                                              std::string(kOptionsVariable))
          << ", default kept";
    } else if (v.source == OptionSource::Profile) {
      out << "profile " << profile;
    } else if (v.source == OptionSource::Options) {
      out << kOptionsVariable;
    } else {
      out << src;
    }
    out << ")\n";
  }
  if (!default_actions.empty()) {
    out << "# " << kOptionPrefix << "ACTION_<CLASS>: enum (default, or what the class accepts of "
           "skip|forward|abort), default 'default'\n# "
        << action_help
        << " (README \"Findings\"; config --json lists each class's choices)\n# "
        << default_actions.size() << " classes are 'default' (the mode's action):";
    std::size_t col = 100;
    for (std::string_view c : default_actions) {
      if (col + c.size() + 1 > 100) {
        out << "\n#  ";
        col = 3;
      }
      out << ' ' << c;
      col += c.size() + 1;
    }
    out << '\n';
  }
  if (!po.problems.empty()) {
    out << "\n  option problems:\n";
    for (const std::string &pr : po.problems) out << "    " << pr << '\n';
  }
}

}  // namespace

int config_main(int argc, char **argv, char **envp) {
  return config_main(argc, argv, envp, std::cout, std::cerr);
}

int config_main(int argc, char **argv, char **envp, std::ostream &out, std::ostream &err) {
  Args args;
  std::string why;
  if (!parse_args(argc, argv, args, why)) {
    err << "cumemguard config: " << why << (args.err_whole ? "" : " (see cumemguard config --help)")
        << '\n';
    return kExitUsage;
  }
  if (args.help) {
    out << tools::cli::help_text(tools::cli::command("config"));
    return kExitOk;
  }
  if (args.version) {
    out << "cumemguard config " << CMG_VERSION << '\n';
    return kExitOk;
  }
  EnvList env = build_env(envp, args);
  auto parse_env = [&] {
    std::vector<std::pair<std::string_view, std::string_view>> pairs;
    for (const auto &e : env) pairs.emplace_back(e.first, e.second);
    return parse_options(pairs);
  };
  auto set_env = [&](const std::string &name, const std::string &value) {  // as setenv() does
    std::erase_if(env, [&](const auto &e) { return e.first == name; });
    env.emplace_back(name, value);
  };
  // What `cumemguard run` refuses (the same checks, labelled as run labels them) is refused here
  // with its status, one line each on stderr, with or without --run.
  constexpr std::string_view kRefused = "refused: cumemguard run would not start the program";
  tools::RunChecked checked;
  if (args.as_run) {
    // --run: run's own options first, then their -e values in the program's environment.
    checked = tools::check_run_args(args.run, kRefused);
    for (const std::string &line : checked.refusals) err << "cumemguard config: " << line << '\n';
    if (!checked.refusals.empty()) return kExitUsage;
    for (const auto &[name, value] : checked.sets) set_env(name, value);
  }
  std::set<std::string_view> by_e;  // the options an -e of --run set
  for (const auto &[name, value] : checked.sets)
    if (std::string_view(name).starts_with(kOptionPrefix))
      for (const OptionSpec &sp : option_specs())
        if (sp.name == std::string_view(name).substr(kOptionPrefix.size())) by_e.insert(sp.name);
  ParsedOptions po = parse_env();
  // A name set twice is let through, as run lets it through.
  std::vector<std::string> refused;
  for (const std::string &line : tools::run_refusals(po)) refused.push_back("environment: " + line);
  // An override PyTorch's grammar refuses stops run too; planned, as run and the shim plan it,
  // with the newest grammar (the release is not known before `import torch`).
  // The variable or CUMEMGUARD_OPTIONS' torch_alloc_conf entry, the one in force (run_args.h).
  if (const tools::TorchOverride ov = tools::torch_override(po, checked.sets); !ov.value.empty()) {
    try {
      const tc::Plan tp = tc::plan(
          tc::Env::from_lookup([&](std::string_view name) { return lookup(env, name); }), ov.value,
          tc::newest_grammar());
      if (tp.action == tc::PlanAction::Refuse)
        refused.push_back(ov.label + ": " + tools::torch_override_refusal(ov.value, tp.reason, ov.entry));
    } catch (...) {
      // run lets through what it cannot evaluate (the shim says why); so does this
    }
  }
  for (const std::string &line : refused)
    err << "cumemguard config: " << line << "; " << kRefused << '\n';
  // --run: the listing shows the environment a program gets, and it would get none.
  if (args.as_run && !refused.empty()) return kExitUsage;
  // --run: what the launcher exports for its options and its defaults where the user did not set
  // them (run_args.h), shown as set by cumemguard run. The log is named after the program, which
  // config does not know: PROGRAM.
  std::set<std::string_view> by_run;
  std::map<std::string_view, std::string> run_option;  // the run option that set it, if one did
  const ParsedOptions user = po;  // before run's defaults: which log the user named
  if (args.as_run) {
    char cwd[PATH_MAX];
    const std::string dir = getcwd(cwd, sizeof cwd) ? cwd : ".";
    for (const tools::RunDefault &d : tools::run_exports(args.run, po, "PROGRAM", dir)) {
      set_env(d.name, d.value);
      // The user's relative log made absolute: still the user's setting, labelled as theirs.
      if (d.by == tools::kMadeAbsolute) continue;
      const std::string_view name = std::string_view(d.name).substr(kOptionPrefix.size());
      for (const OptionSpec &sp : option_specs())
        if (sp.name == name) {
          by_run.insert(sp.name);
          if (!d.by.empty()) run_option[sp.name] = d.by + " of cumemguard run";
        }
    }
    // Made anew by each launch (the run's id, its status directory): no value to show here.
    for (const OptionSpec &sp : option_specs())
      if ((sp.name == "RUN_ID" || sp.name == "STATUS_DIR") &&
          !lookup(env, std::string(kOptionPrefix) + std::string(sp.name))) {
        by_run.insert(sp.name);
        run_option[sp.name] = "made by cumemguard run at each launch";
      }
    po = parse_env();
  }
  // The program's environment as run would start it (with --run, run's exports too): a
  // suppressions file or an event log run cannot use stops config as it stops run, with run's
  // status (64, or 73 for a log that cannot be written) and words.
  g_lookup_env = &env;
  const tools::EnvRefusal env_refusal = tools::program_env_refusal(
      args.run, user, po.options, lookup_in_env, kRefused);
  g_lookup_env = nullptr;
  if (env_refusal.status) {
    err << "cumemguard config: " << env_refusal.line << '\n';
    if (args.as_run) return env_refusal.status;
  }
  const bool set_by_run = by_run.count("PROFILE") > 0;

  const tc::Env tenv =
      tc::Env::from_lookup([&](std::string_view name) { return lookup(env, name); });
  const std::optional<std::string> override_raw =
      lookup(env, std::string(kOptionPrefix) + "TORCH_ALLOC_CONF");
  std::vector<std::string> envp_list;
  for (const auto &e : env) envp_list.push_back(e.first + "=" + e.second);
  const TorchChoice choice = choose_torch_version(
      args.torch_version, args.python, [&](std::string_view n) { return lookup(env, n); },
      envp_list);
  // The interpreter named was what the user asked about: judging the default release instead
  // answered a question not asked ("judged: torch 2.11.0 (default: /nonexist not found)", 0).
  if (args.python_given && !choice.interpreter_problem.empty()) {
    err << "cumemguard config: --python: " << choice.interpreter_problem
        << "; name an interpreter that runs (or give --torch-version V)\n";
    return kExitNoInput;
  }
  // Judged, diagnosed and planned with the release's own grammar (its keys, its parser).
  const tc::Judgement jd = tc::judge(tenv, choice.version, choice.source);
  const tc::Plan p = tc::plan(tenv, po.options.torch_alloc_conf, jd.grammar);
  // In run's order: a setting that cannot apply (64) before the environment's checks.
  const int status = !refused.empty()                         ? kExitUsage
                     : env_refusal.status                       ? env_refusal.status
                     : jd.outcome.cls == tc::OutcomeClass::Ok ? kExitOk
                                                              : kExitTorchFails;

  if (args.json) {
    json j{
        {"schema", kJsonSchema},
        {"torch", torch_json(tenv, p, jd, override_raw)},
        {"profile",
         {{"name", po.options.profile == Profile::Debug ? "debug" : "guard"},
          {"source",
           set_by_run ? "cumemguard run" : std::string(option_source_name(po.profile_source))},
          {"why", profile_why(po, set_by_run)}}},
        {"options_variable", po.has_options_variable ? json(po.options_variable) : json(nullptr)},
        {"options", options_json(po, by_run, by_e)},
        {"option_problems", po.problems},
        {"run", args.as_run ? json{{"error_exitcode", args.run.exitcode.empty()
                                                          ? json(nullptr)
                                                          : json(checked.error_exitcode)},
                                   {"fail_on_leaks", args.run.fail_on_leaks}}
                            : json(nullptr)},
        {"exit_status", status}};
    out << j.dump(2, ' ', false, json::error_handler_t::replace) << '\n';
  } else {
    print_torch_text(out, tenv, p, jd, override_raw, !po.options.torch_alloc_conf.empty());
    print_options_text(out, po, env, by_run, by_e, run_option, gate_text(args.run, checked.error_exitcode));
  }
  return status;
}

}  // namespace cmg
