// SPDX-License-Identifier: Apache-2.0
// tools/config_cmd: arguments, exit status, --env edits, and the JSON listing (config-json.md).
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>

#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "config_cmd.h"
#include "findings.h"
#include "options.h"

namespace {

struct Run {
  int status;
  std::string out, err;
  nlohmann::json json() const { return nlohmann::json::parse(out); }
};

Run run(std::vector<std::string> args, std::vector<std::string> env = {}) {
  args.insert(args.begin(), "config");
  std::vector<char *> argv, envp;
  for (auto &a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto &e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::ostringstream out, err;
  int st = cmg::config_main(static_cast<int>(args.size()), argv.data(), envp.data(), out, err);
  return {st, out.str(), err.str()};
}

const nlohmann::json *find_key(const nlohmann::json &keys, const std::string &name) {
  for (const auto &k : keys)
    if (k["key"] == name) return &k;
  return nullptr;
}

}  // namespace

TEST_CASE("config --json lists every option of option_specs()", "[config_cmd]") {
  Run r = run({"--json"});
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  auto j = r.json();
  CHECK(j["schema"] == 1);
  const auto specs = cmg::option_specs();
  const auto &opts = j["options"];
  REQUIRE(opts.size() == specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    INFO(specs[i].name);
    CHECK(opts[i]["name"] == "CUMEMGUARD_" + std::string(specs[i].name));
    CHECK(opts[i]["type"] == std::string(cmg::option_kind_name(specs[i].kind)));
    CHECK(opts[i]["default"] == std::string(specs[i].default_value));
    CHECK(opts[i]["source"] == "default");
    CHECK(opts[i]["help"] == std::string(specs[i].help));
  }
  CHECK(j["torch"]["outcome"] == "ok");
  CHECK(j["torch"]["keys"].size() == 14);
  CHECK(j["exit_status"] == 0);
}

TEST_CASE("config: exit 1 for an [E] environment, with the exception", "[config_cmd]") {
  Run r = run({"--json"}, {"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true", "HOME=/root"});
  CHECK(r.status == 1);
  auto j = r.json();
  CHECK(j["exit_status"] == 1);
  CHECK(j["torch"]["outcome"] == "exception");
  CHECK(j["torch"]["error"]["type"] == "ValueError");
  CHECK(j["torch"]["error"]["python"] ==
        "ValueError: Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'");
  CHECK(j["torch"]["error"]["parser"] == "A");
  CHECK(j["torch"]["error"]["variable"] == "PYTORCH_CUDA_ALLOC_CONF");
  CHECK(j["torch"]["error"]["when"] == "first-allocation");
  CHECK(j["torch"]["snapshot"].is_null());
  // text mode: same status
  Run t = run({}, {"PYTORCH_CUDA_ALLOC_CONF=foo:bar"});
  CHECK(t.status == 1);
  CHECK(t.out.find("the first CUDA allocation raises ValueError: Unrecognized key 'foo' in CUDA "
                   "allocator config.") != std::string::npos);
}

TEST_CASE("config: P20 through --env, named variable, exit 1", "[config_cmd][P20]") {
  Run r = run({"--env", "PYTORCH_ALLOC_CONF=expandable_segments"});
  CHECK(r.status == 1);
  CHECK(r.out.find("import torch aborts") != std::string::npos);
  CHECK(r.out.find("PYTORCH_ALLOC_CONF='expandable_segments': import torch would abort") !=
        std::string::npos);
  auto j = run({"--json", "--env=PYTORCH_ALLOC_CONF=expandable_segments"}).json();
  CHECK(j["torch"]["outcome"] == "import-abort");
  CHECK(j["torch"]["error"]["variable"] == "PYTORCH_ALLOC_CONF");
  CHECK(j["torch"]["problems"][0]["severity"] == "error");
}

TEST_CASE("config --env sets and unsets without touching the process", "[config_cmd]") {
  std::vector<std::string> env = {"PYTORCH_CUDA_ALLOC_CONF=expandable_segments",
                                  "PYTORCH_ALLOC_CONF=max_split_size_mb:512"};
  CHECK(run({"--json"}, env).status == 1);
  Run r = run({"--json", "--env", "PYTORCH_CUDA_ALLOC_CONF"}, env);  // unset: ALLOC is read
  REQUIRE(r.status == 0);
  auto j = r.json();
  CHECK(j["torch"]["variables"]["PYTORCH_CUDA_ALLOC_CONF"].is_null());
  CHECK(j["torch"]["parsers"][2]["variable"] == "PYTORCH_ALLOC_CONF");
  const auto *ms = find_key(j["torch"]["keys"], "max_split_size_mb");
  REQUIRE(ms);
  CHECK((*ms)["effective"] == 536870912);
  CHECK((*ms)["default"] == -1);
  CHECK((*ms)["source"] == "PYTORCH_ALLOC_CONF");
  CHECK(j["torch"]["snapshot"]["max_split_size"] == 536870912);
  CHECK(j["torch"]["snapshot"]["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512");
  CHECK(j["torch"]["snapshot"]["roundup_power2_divisions"]["32768"] == 0);
  // set: the last --env for a name wins; an empty value is present
  Run e = run({"--json", "--env", "PYTORCH_CUDA_ALLOC_CONF=x", "--env", "PYTORCH_CUDA_ALLOC_CONF="},
              env);
  REQUIRE(e.status == 0);
  auto je = e.json();
  CHECK(je["torch"]["variables"]["PYTORCH_CUDA_ALLOC_CONF"] == "");
  CHECK((*find_key(je["torch"]["keys"], "max_split_size_mb"))["effective"] == -1);
}

TEST_CASE("config: the shim's override is shown", "[config_cmd][P22]") {
  auto j = run({"--json"},
               {"PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512,garbage_collection_threshold:0.8,"
                "expandable_segments:True",
                "CUMEMGUARD_TORCH_ALLOC_CONF=expandable_segments:False"})
               .json();
  const auto &o = j["torch"]["override"];
  CHECK(o["value"] == "expandable_segments:False");
  CHECK(o["action"] == "write");
  REQUIRE(o["writes"].size() == 1);
  CHECK(o["writes"][0]["variable"] == "PYTORCH_CUDA_ALLOC_CONF");
  CHECK(o["writes"][0]["new"] ==
        "max_split_size_mb:512,garbage_collection_threshold:0.8,expandable_segments:False");
  CHECK(o["result_outcome"] == "ok");
  Run r = run({"--json"}, {"CUMEMGUARD_TORCH_ALLOC_CONF=expandable_segments:true"});
  auto refused = r.json();
  CHECK(refused["torch"]["override"]["action"] == "refuse");
  // PyTorch itself is fine, but `cumemguard run` does not start a program with this value: 64 as
  // run exits (it was 0), said on stderr.
  CHECK(r.status == 64);
  CHECK(refused["exit_status"] == 64);
  CHECK(r.err ==
        "cumemguard config: environment: CUMEMGUARD_TORCH_ALLOC_CONF='expandable_segments:true': "
        "the result would make the first CUDA allocation raise ValueError: Expected 'True' or "
        "'False' at index 2 in ConfigTokenizer but got 'true'; refused: cumemguard run would not "
        "start the program\n");
  CHECK(run({"--json"}).json()["torch"]["override"]["action"] == "none");
}

TEST_CASE("config: option values, sources and problems", "[config_cmd]") {
  auto j = run({"--json"}, {"CUMEMGUARD_MODE=report", "CUMEMGUARD_STACKS=99", "CUMEMGUARD_MODD=x"})
               .json();
  bool seen_mode = false, seen_stacks = false;
  for (const auto &o : j["options"]) {
    if (o["name"] == "CUMEMGUARD_MODE") {
      seen_mode = true;
      CHECK(o["effective"] == "report");
      CHECK(o["source"] == "environment");
      CHECK(o["raw"] == "report");
      CHECK(o["choices"] == nlohmann::json({"guard", "report", "strict"}));
    }
    if (o["name"] == "CUMEMGUARD_STACKS") {
      seen_stacks = true;
      CHECK(o["source"] == "invalid");
      CHECK(o["effective"] == "0");
    }
  }
  CHECK(seen_mode);
  CHECK(seen_stacks);
  CHECK(j["option_problems"].size() == 2);
  Run t = run({}, {"CUMEMGUARD_MODE=report"});
  CHECK(t.status == 0);
  // Every option is listed: the per-class actions left at their default by name in one block.
  for (const auto &s : cmg::option_specs()) {
    INFO(s.name);
    if (s.name.starts_with("ACTION_"))
      CHECK(t.out.find(" " + std::string(s.name.substr(7)) +
                       (s.name == cmg::option_specs().back().name ? "\n" : "")) != std::string::npos);
    else
      CHECK(t.out.find("# CUMEMGUARD_" + std::string(s.name) + ":") != std::string::npos);
  }
  CHECK(t.out.find("CUMEMGUARD_MODE=report  (environment)") != std::string::npos);
}

TEST_CASE("config: cudaMallocAsync has no snapshot and defers errors", "[config_cmd]") {
  auto j = run({"--json", "--env", "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"}).json();
  CHECK(j["torch"]["outcome"] == "ok");
  CHECK(j["torch"]["deferred"] == true);
  CHECK(j["torch"]["error"].is_null());
  CHECK(j["torch"]["load_backend"] == "cudaMallocAsync");
  CHECK(j["torch"]["snapshot"].is_null());
  Run r = run({"--json", "--env", "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync,foo:1"});
  CHECK(r.status == 0);  // allocations work; the first settings call raises
  auto d = r.json();
  CHECK(d["torch"]["outcome"] == "ok");
  CHECK(d["torch"]["error"]["when"] == "first-settings-call");
  CHECK(d["torch"]["error"]["python"] ==
        "ValueError: Unrecognized key 'foo' in Accelerator allocator config.");
  CHECK(d["torch"]["problems"][0]["severity"] == "error");
}

TEST_CASE("config: bad arguments exit 64 with one line", "[config_cmd]") {
  for (std::vector<std::string> args : {std::vector<std::string>{"--bogus"},
                                        {"--env"},
                                        {"--env", "=x"},
                                        {"--env", "1A=x"},
                                        {"json"}}) {
    Run r = run(args);
    INFO(r.err);
    CHECK(r.status == 64);
    CHECK(r.out.empty());
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.rfind("cumemguard config: ", 0) == 0);
  }
  Run h = run({"--help"});
  CHECK(h.status == 0);
  CHECK(h.out.rfind("Usage: cumemguard config", 0) == 0);
}

namespace {
const nlohmann::json &option_row(const nlohmann::json &j, const std::string &name) {
  for (const auto &o : j["options"])
    if (o["name"] == name) return o;
  FAIL("no option " << name);
  return j;
}
}  // namespace

TEST_CASE("config: CUMEMGUARD_OPTIONS entries, the variable winning, and the profile", "[config_cmd]") {
  auto j = run({"--json"}, {"CUMEMGUARD_OPTIONS=mode=strict:stacks=16:profile=debug",
                            "CUMEMGUARD_MODE=report"})
               .json();
  CHECK(j["options_variable"] == "mode=strict:stacks=16:profile=debug");
  CHECK(option_row(j, "CUMEMGUARD_MODE")["effective"] == "report");
  CHECK(option_row(j, "CUMEMGUARD_MODE")["source"] == "environment");
  CHECK(option_row(j, "CUMEMGUARD_STACKS")["effective"] == "16");
  CHECK(option_row(j, "CUMEMGUARD_STACKS")["source"] == "options");
  CHECK(option_row(j, "CUMEMGUARD_STACKS")["raw"] == "16");
  CHECK(option_row(j, "CUMEMGUARD_QUARANTINE")["effective"] == "auto");
  CHECK(option_row(j, "CUMEMGUARD_QUARANTINE")["source"] == "profile");
  CHECK(option_row(j, "CUMEMGUARD_QUARANTINE")["debug_default"] == "auto");
  CHECK(j["profile"]["name"] == "debug");
  CHECK(j["profile"]["why"] == "debug: set by CUMEMGUARD_OPTIONS");

  Run t = run({}, {"CUMEMGUARD_OPTIONS=stacks=8"});
  CHECK(t.out.find("  profile guard: default (a plain LD_PRELOAD; cumemguard run sets debug)\n") !=
        std::string::npos);
  CHECK(t.out.find("CUMEMGUARD_STACKS=8  (CUMEMGUARD_OPTIONS)\n") != std::string::npos);
  CHECK(t.out.find("  CUMEMGUARD_OPTIONS='stacks=8'") != std::string::npos);

  Run p = run({}, {"CUMEMGUARD_PROFILE=debug"});
  CHECK(p.out.find("  profile debug: set by CUMEMGUARD_PROFILE\n") != std::string::npos);
  CHECK(p.out.find("CUMEMGUARD_STACKS=16  (profile debug)\n") != std::string::npos);
  CHECK(p.out.find("# CUMEMGUARD_STACKS: int, default '0', debug profile '16'\n") !=
        std::string::npos);

  // --run: what cumemguard run gives the program; a profile the user set stays.
  Run r = run({"--run"});
  CHECK(r.out.find("  profile debug: set by cumemguard run\n") != std::string::npos);
  CHECK(r.out.find("CUMEMGUARD_STACKS=16  (profile debug)\n") != std::string::npos);
  auto rj = run({"--run", "--json"}, {"CUMEMGUARD_PROFILE=guard"}).json();
  CHECK(rj["profile"]["why"] == "guard: set by CUMEMGUARD_PROFILE");
  CHECK(option_row(rj, "CUMEMGUARD_STACKS")["effective"] == "0");
}

TEST_CASE("config: a repeated name reads as the shim reads it (first entry), refused actions",
          "[config_cmd]") {
  auto j = run({"--json"}, {"CUMEMGUARD_MODE=strict", "CUMEMGUARD_MODE=report",
                            "CUMEMGUARD_ACTION_LEAK=abort"})
               .json();
  CHECK(option_row(j, "CUMEMGUARD_MODE")["effective"] == "strict");
  CHECK(option_row(j, "CUMEMGUARD_ACTION_LEAK")["source"] == "invalid");
  CHECK(option_row(j, "CUMEMGUARD_ACTION_LEAK")["choices"] == nlohmann::json({"default", "forward"}));
  REQUIRE(j["option_problems"].size() == 2);
  CHECK(j["option_problems"][0] ==
        "CUMEMGUARD_MODE is set 2 times in the environment; the first ('strict') is used, as "
        "getenv() does");
}

TEST_CASE("config: --version, and _mb keys shown in MiB", "[config_cmd]") {
  Run v = run({"--version"});
  CHECK(v.status == 0);
  CHECK(v.out.rfind("cumemguard config ", 0) == 0);
  Run t = run({}, {"PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128"});
  CHECK(t.out.find("  max_split_size_mb                  128 (134217728 B)      unlimited (-1)") !=
        std::string::npos);
  CHECK(t.out.find(" 134217728 ") == std::string::npos);
}

TEST_CASE("config's outcome names the release that accepts, and says when none was found",
          "[config_cmd]") {
  // A named release answers for itself; without one found (an empty environment: no python,
  // no torch), the default release answers, and the line says so instead of "PyTorch accepts".
  Run named = run({"--torch-version", "2.11.0"});
  REQUIRE(named.status == 0);
  CHECK(named.out.find("\n  outcome: ok (torch 2.11.0 accepts this environment)\n") !=
        std::string::npos);
  // With nothing of PyTorch's set either, the section is three lines (it was the default
  // release's whole table, 40 lines, before the shim's options).
  Run none = run({});
  REQUIRE(none.status == 0);
  CHECK(none.out.rfind("PyTorch allocator configuration: nothing to check\n  judged: torch ", 0) == 0);
  CHECK(none.out.find("\n  no PyTorch allocator variable and no CUMEMGUARD_TORCH_ALLOC_CONF is set: "
                      "torch ") != std::string::npos);
  CHECK(none.out.find("  key  ") == std::string::npos);
  CHECK(none.out.find("PyTorch accepts") == std::string::npos);
  // A PyTorch variable set: the whole section, with the default release's answer said.
  Run set = run({}, {"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"});
  REQUIRE(set.status == 0);
  CHECK(set.out.find("accepts this environment; no installed torch release was found, so this "
                     "is the default release's answer)\n") != std::string::npos);
  CHECK(set.out.find("nothing to check") == std::string::npos);
  // An override given as CUMEMGUARD_OPTIONS' entry is planned: the whole section says what the
  // shim will write, or why it refuses (the short form said "nothing to check" over both).
  Run entry = run({}, {"CUMEMGUARD_OPTIONS=torch_alloc_conf='expandable_segments:True'"});
  REQUIRE(entry.status == 0);
  CHECK(entry.out.find("nothing to check") == std::string::npos);
  CHECK(entry.out.find("    create PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'") !=
        std::string::npos);
  Run bogus = run({}, {"CUMEMGUARD_OPTIONS=torch_alloc_conf=bogus"});
  CHECK(bogus.status == 64);
  CHECK(bogus.out.find("nothing to check") == std::string::npos);
  CHECK(bogus.out.find("    refused (the shim keeps the original") != std::string::npos);
}

// The per-class ACTION_* rows share one help text: those at their default are one block of names
// (29 three-line blocks before); one that is set is listed as any option is.
TEST_CASE("config: default per-class actions are named in one block", "[config_cmd]") {
  Run plain = run({});
  REQUIRE(plain.status == 0);
  CHECK(plain.out.find("CUMEMGUARD_ACTION_DOUBLE_FREE=") == std::string::npos);
  const std::size_t n = cmg::kFindingClassCount;
  CHECK(plain.out.find("\n# " + std::to_string(n) + " classes are 'default' (the mode's action):\n#   ") !=
        std::string::npos);
  for (std::size_t c = 0; c < cmg::kFindingClassCount; ++c)
    CHECK(plain.out.find(" " + std::string(cmg::finding_info(static_cast<cmg::FindingClass>(c)).option.substr(7))) !=
          std::string::npos);
  Run one = run({}, {"CUMEMGUARD_ACTION_DOUBLE_FREE=forward"});
  REQUIRE(one.status == 0);
  CHECK(one.out.find("\nCUMEMGUARD_ACTION_DOUBLE_FREE=forward  (environment)\n") != std::string::npos);
  CHECK(one.out.find("\n# " + std::to_string(n - 1) + " classes are 'default'") != std::string::npos);
  // Sizes as written: the default '4G' is shown as 4G.
  CHECK(plain.out.find("\nCUMEMGUARD_DEFER_LIMIT=4G  (default)\n") != std::string::npos);
}

// A setting `cumemguard run` refuses is said on the first screen and exits 64 as run does (it
// exited 0 with "problems: none", PyTorch's, at the top and the value lost from the JSON).
// Refused on stderr, one line each, in run's words: they were said on stdout only, as "ignored"
// and "keeping '0'", before a listing that exited 64.
TEST_CASE("config: settings that cannot apply are refused on stderr, keep their value, exit 64",
          "[config_cmd]") {
  const std::vector<std::string> env{"CUMEMGUARD_STACKS=abc", "CUMEMGUARD_STAKS=4"};
  Run t = run({"--torch-version", "2.11"}, env);
  CHECK(t.status == 64);
  CHECK(t.err ==
        "cumemguard config: environment: unknown option CUMEMGUARD_STAKS (did you mean "
        "CUMEMGUARD_STACKS?); refused: cumemguard run would not start the program\n"
        "cumemguard config: environment: CUMEMGUARD_STACKS: 'abc' is not valid: not a whole "
        "number; refused: cumemguard run would not start the program\n");
  CHECK(t.out.rfind("PyTorch allocator configuration", 0) == 0);
  CHECK(t.out.find("cannot apply") == std::string::npos);
  Run j = run({"--json", "--torch-version", "2.11"}, env);
  CHECK(j.status == 64);
  auto doc = j.json();
  CHECK(doc["exit_status"] == 64);
  CHECK(option_row(doc, "CUMEMGUARD_STACKS")["source"] == "invalid");
  CHECK(option_row(doc, "CUMEMGUARD_STACKS")["raw"] == "abc");
  // An entry of CUMEMGUARD_OPTIONS refused: its value too.
  auto o = run({"--json"}, {"CUMEMGUARD_OPTIONS=stacks=xyz"}).json();
  CHECK(option_row(o, "CUMEMGUARD_STACKS")["raw"] == "xyz");
  CHECK(o["exit_status"] == 64);
  // A name set twice is let through by run: not a refusal here either.
  Run twice =
      run({"--torch-version", "2.11"}, {"CUMEMGUARD_MODE=strict", "CUMEMGUARD_MODE=report"});
  CHECK(twice.status == 0);
  CHECK(twice.out.rfind("PyTorch allocator configuration", 0) == 0);
}

// An override run refuses exited 0 without --run (and 64 with it).
TEST_CASE("config: an override that cannot apply is refused as run refuses it", "[config_cmd]") {
  const std::string line =
      "cumemguard config: environment: CUMEMGUARD_TORCH_ALLOC_CONF: 'bogus' needs ':value' (or "
      "write -bogus to remove it); refused: cumemguard run would not start the program\n";
  for (const std::vector<std::string> &env :
       {std::vector<std::string>{"CUMEMGUARD_TORCH_ALLOC_CONF=bogus"}}) {
    Run t = run({"--torch-version", "2.11"}, env);
    CHECK(t.status == 64);
    CHECK(t.err == line);
    CHECK(t.out.rfind("PyTorch allocator configuration", 0) == 0);
    Run j = run({"--json", "--torch-version", "2.11"}, env);
    CHECK(j.status == 64);
    CHECK(j.json()["exit_status"] == 64);
    Run r = run({"--run", "--torch-version", "2.11"}, env);
    CHECK(r.status == 64);
    CHECK(r.err == line);
    CHECK(r.out.empty());
  }
  // Given with --env, it is the environment config evaluates; an empty one is no override.
  CHECK(run({"--env", "CUMEMGUARD_TORCH_ALLOC_CONF=bogus"}).err == line);
  CHECK(run({"--torch-version", "2.11"}, {"CUMEMGUARD_TORCH_ALLOC_CONF="}).status == 0);
}

// run's own options with --run, from its table: they were "unknown option" here.
TEST_CASE("config --run takes run's options and shows what they set", "[config_cmd]") {
  char cwd[4096];
  REQUIRE(getcwd(cwd, sizeof cwd));
  const std::string dir = cwd;
  auto opts = [](const Run &r) {
    std::map<std::string, nlohmann::json> m;
    const nlohmann::json doc = r.json();  // kept: the loop reads into it
    for (const auto &o : doc["options"]) m[o["name"].get<std::string>()] = o;
    return m;
  };
  // The suppressions file must be readable (run refuses one that is not, and so does config): one
  // of this test's own, in a directory no other run of the tests shares.
  char tmpl[] = "/tmp/cmg-config-cmd.XXXXXX";
  REQUIRE(mkdtemp(tmpl));
  const std::string supp = std::string(tmpl) + "/s.supp";
  std::ofstream(supp) << "double-free:vendor_*\n";
  Run r = run({"--run", "--json", "--torch-version", "2.11", "--log", "x.log", "--brief",
               "--mode=report", "--stacks", "4", "--suppressions", supp, "-e",
               "CUMEMGUARD_WARN_LIMIT=5", "--error-exitcode", "3", "--fail-on-leaks"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto o = opts(r);
  CHECK(o["CUMEMGUARD_LOG"]["effective"] == dir + "/x.log");
  CHECK(o["CUMEMGUARD_LOG"]["source"] == "cumemguard run");
  CHECK(o["CUMEMGUARD_WARN_FRAMES"]["effective"] == "0");
  CHECK(o["CUMEMGUARD_WARN_FRAMES"]["source"] == "cumemguard run");
  CHECK(o["CUMEMGUARD_MODE"]["effective"] == "report");
  CHECK(o["CUMEMGUARD_STACKS"]["effective"] == "4");
  CHECK(o["CUMEMGUARD_SUPPRESSIONS"]["effective"] == supp);
  CHECK(o["CUMEMGUARD_WARN_LIMIT"]["effective"] == "5");
  CHECK(o["CUMEMGUARD_SUMMARY"]["source"] == "cumemguard run");
  CHECK(r.json()["run"] == nlohmann::json{{"error_exitcode", 3}, {"fail_on_leaks", true}});
  std::remove(supp.c_str());
  rmdir(tmpl);
  Run t = run({"--run", "--torch-version", "2.11", "--error-exitcode", "3"});
  CHECK(t.out.find("\n  exit status: 3 when a process of the run has findings that are not "
                   "suppressed, or when nothing was checked (--error-exitcode 3)\n") !=
        std::string::npos);
  // --no-log: an empty log, set by run; --no-summary: the summary left to the environment.
  auto n = opts(run({"--run", "--json", "--no-log", "--no-summary"}));
  CHECK(n["CUMEMGUARD_LOG"]["effective"] == "");
  CHECK(n["CUMEMGUARD_LOG"]["source"] == "cumemguard run");
  CHECK(n["CUMEMGUARD_SUMMARY"]["source"] == "default");
  CHECK(run({"--json"}).json()["run"].is_null());
  // Refused as run refuses them, one line, nothing on stdout.
  for (const auto &[args, line] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--log", "x.log"},
            "--log is an option of cumemguard run: give --run with it (see cumemguard config "
            "--help)"},
           {{"--run", "--log"}, "--log needs a value (see cumemguard config --help)"},
           {{"--run", "--log", ""}, "--log needs a path (use --no-log for no log)"},
           {{"--run", "--mode", "stict"},
            "--mode must be guard, report or strict, not 'stict' (did you mean 'strict'?)"},
           {{"--run", "--no-log", "--log", "a"}, "--log and --no-log conflict (give one)"},
           {{"--run", "--fail-on-leaks"}, "--fail-on-leaks needs --error-exitcode N"},
           {{"--run", "-e", "X"}, "-e expects NAME=VALUE, got 'X'"},
           {{"--run", "--stacks", "x"},
            "--stacks: CUMEMGUARD_STACKS: 'x' is not valid: not a whole number; refused: "
            "cumemguard run would not start the program"},
           {{"--run", "-e", "CUMEMGUARD_MODE=stict"},
            "-e CUMEMGUARD_MODE=stict: CUMEMGUARD_MODE: 'stict' is not valid: expected one of "
            "guard|report|strict (did you mean 'strict'?); refused: cumemguard run would not "
            "start the program"},
           {{"--run", "-e", "CUMEMGUARD_STATUS_DIR=/tmp"},
            "-e CUMEMGUARD_STATUS_DIR=/tmp: CUMEMGUARD_STATUS_DIR is set by the launcher and the "
            "shim themselves; -e cannot give it to the program; refused: cumemguard run would "
            "not start the program"},
           {{"--run", "--brief", "-e", "CUMEMGUARD_WARN_FRAMES=3"},
            "--brief and -e CUMEMGUARD_WARN_FRAMES=3 both set CUMEMGUARD_WARN_FRAMES; give one "
            "of them (refused: cumemguard run would not start the program)"}}) {
    Run b = run(args);
    INFO(b.err);
    CHECK(b.status == 64);
    CHECK(b.out.empty());
    CHECK(b.err == "cumemguard config: " + line + "\n");
  }
  // An -e override run refuses is named as run names it.
  CHECK(run({"--run", "-e", "CUMEMGUARD_TORCH_ALLOC_CONF=bogus"}).err ==
        "cumemguard config: -e CUMEMGUARD_TORCH_ALLOC_CONF=bogus: CUMEMGUARD_TORCH_ALLOC_CONF: "
        "'bogus' needs ':value' (or write -bogus to remove it); refused: cumemguard run would "
        "not start the program\n");
}

// Before 2.8 a CUDA build has one parser of keys (C) and reads PYTORCH_CUDA_ALLOC_CONF alone: the
// listing says so instead of showing parser A and the other variables as if they were read.
TEST_CASE("config: a release before 2.8 shows its one parser and its one variable",
          "[config_cmd]") {
  Run old = run({"--torch-version", "2.3", "--env", "PYTORCH_ALLOC_CONF=expandable_segments:True"});
  REQUIRE(old.status == 0);
  CHECK(old.out.find("\n  PYTORCH_ALLOC_CONF        'expandable_segments:True'  (not read by torch "
                     "2.3)\n") != std::string::npos);
  CHECK(old.out.find("\n  PYTORCH_CUDA_ALLOC_CONF   unset\n") != std::string::npos);
  CHECK(old.out.find("AcceleratorAllocatorConfig):\n      no variable (none in this release: "
                     "parser A came with 2.8; before, C parses every key)\n") != std::string::npos);
  auto j = run({"--json", "--torch-version", "2.3"}).json();
  CHECK(j["torch"]["parsers"][2]["parser"] == "A");
  CHECK(j["torch"]["parsers"][2]["variable"].is_null());
  // 2.11 reads it, and has parser A.
  Run now = run({"--torch-version", "2.11", "--env", "PYTORCH_ALLOC_CONF=expandable_segments:True"});
  CHECK(now.out.find("not read by torch") == std::string::npos);
  CHECK(now.out.find("none in this release") == std::string::npos);
}
