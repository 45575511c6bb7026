// SPDX-License-Identifier: Apache-2.0
// `cumemguard config` by PyTorch release: --torch-version, the installed torch found through the
// interpreter without importing it, which release was judged, and every row of the version table
// in the text and the JSON listing.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "config_cmd.h"

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

std::vector<std::string> known_ids(const nlohmann::json &j) {
  std::vector<std::string> r;
  for (const auto &k : j["torch"]["known_problems"]) r.push_back(k["id"]);
  return r;
}

// A directory that removes itself.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/cmg-config-torch-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  void write(const std::string &rel, const std::string &text, bool exec = false) const {
    const std::string p = path + "/" + rel;
    std::system(("mkdir -p \"$(dirname '" + p + "')\"").c_str());
    std::ofstream(p) << text;
    if (exec) chmod(p.c_str(), 0755);
  }
};

}  // namespace

TEST_CASE("config: --torch-version names the judged release, text and JSON", "[config_torch]") {
  Run t = run({"--torch-version", "2.9.1"}, {"PYTORCH_ALLOC_CONF=expandable_segments:True"});
  CHECK(t.status == 0);
  CHECK(t.out.find("PyTorch allocator configuration (as torch 2.9.1 reads it on a CUDA build)\n"
                   "  judged: torch 2.9.1 (--torch-version): the 2.9 grammar and its known "
                   "problems; not modelled: parser A of a stored pre-2.10 source") == 0);
  CHECK(t.out.find("\n    warning: PYTORCH_ALLOC_CONF sets "
                   "expandable_segments:True, but this release takes expandable_segments for CUDA "
                   "only from PYTORCH_CUDA_ALLOC_CONF") != std::string::npos);
  // The key table shows what 2.9.1 gets.
  CHECK(t.out.find("  expandable_segments                False                  False") !=
        std::string::npos);

  Run j = run({"--json", "--torch-version=2.9.1"}, {"PYTORCH_ALLOC_CONF=expandable_segments:True"});
  REQUIRE(j.status == 0);
  const auto js = j.json();
  CHECK(js["torch"]["torch_version"]["judged"] == "2.9.1");
  CHECK(js["torch"]["torch_version"]["source"] == "--torch-version");
  CHECK(js["torch"]["torch_version"]["exact"] == false);
  CHECK(js["torch"]["torch_versions"] == "2.9");  // the grammar's row
  REQUIRE(known_ids(js) == std::vector<std::string>{"unified-variable-ignored"});
  const auto &k = js["torch"]["known_problems"][0];
  CHECK(k["severity"] == "warning");
  CHECK(k["bug"] == "pytorch#183387");
  CHECK(k["fixed_in"] == "2.10.0");
  CHECK(k["at_run_time"] == true);
  for (const auto &key : js["torch"]["keys"])
    if (key["key"] == "expandable_segments") CHECK(key["effective"] == false);

  // The same environment judged for 2.11: no known problem, the value the grammar gives.
  const auto j11 =
      run({"--json", "--torch-version", "2.11.0"}, {"PYTORCH_ALLOC_CONF=expandable_segments:True"})
          .json();
  CHECK(known_ids(j11).empty());
  CHECK(j11["torch"]["torch_version"]["exact"] == true);
  CHECK(run({"--torch-version", "2.11.0"}).out.find("  known problems of torch 2.11.0: none\n") !=
        std::string::npos);
}

TEST_CASE("config: every row of the version table in the listing", "[config_torch]") {
  struct Row {
    std::string version;
    std::vector<std::string> env;
    std::vector<std::string> ids;
    std::string text;  // in the text output
  };
  const std::vector<Row> rows = {
      {"2.2.2",
       {"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:512"},
       {"expandable-max-split-assert", "expandable-near-oom-assert", "expandable-ipc-unsupported",
        "mempool-custom-allocator", "expandable-max-split-growth"},
       "RuntimeError: !block->expandable_segment_ INTERNAL ASSERT FAILED (pytorch#119452; fixed by "
       "PR #120022, first in 2.3.0)"},
      {"2.4.1",
       {"PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6,expandable_segments:True"},
       {"expandable-near-oom-assert", "expandable-ipc-unsupported", "mempool-custom-allocator"},
       "the allocator can fail an assertion when the device is nearly out of memory (PR #134338; "
       "first in 2.5.0)"},
      {"2.5.1",
       {"PYTORCH_NO_CUDA_MEMORY_CACHING=0"},
       {"no-caching-any-value"},
       "PYTORCH_NO_CUDA_MEMORY_CACHING='0' turns the CUDA caching allocator off in this release"},
      {"2.9.1",
       {"PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64"},
       {"cuda-variable-deprecated"},
       "note: PyTorch will print: Warning: PYTORCH_CUDA_ALLOC_CONF is deprecated"},
      {"2.9.1",
       {"PYTORCH_ALLOC_CONF=expandable_segments:True"},
       {"unified-variable-ignored"},
       "(pytorch#183387; reported on 2.9.1; 2.10.0 and 2.11.0 honour PYTORCH_ALLOC_CONF)"},
      {"2.11.0",
       {"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:512"},
       {"expandable-max-split-growth"},
       "reserved memory can grow (expandable segments need no max_split_size_mb) "
       "(pytorch#123548; fix proposed in PR #193400, in no release yet)"},
      {"2.11.0",
       {"PYTORCH_NO_CUDA_MEMORY_CACHING=1", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"},
       {"caching-off"},
       "PYTORCH_NO_CUDA_MEMORY_CACHING='1' turns the caching allocator off: every allocation is a "
       "cudaMalloc of its own"},
      {"2.11.0", {"PYTORCH_NO_CUDA_MEMORY_CACHING=0"}, {}, "known problems of torch 2.11.0: none"},
  };
  for (const Row &r : rows) {
    INFO(r.version << " " << r.env[0]);
    const Run j = run({"--json", "--torch-version", r.version}, r.env);
    CHECK(j.status == 0);
    CHECK(known_ids(j.json()) == r.ids);
    const Run t = run({"--torch-version", r.version}, r.env);
    CHECK(t.out.find(r.text) != std::string::npos);
  }
}

TEST_CASE("config: the installed torch is found without importing it", "[config_torch]") {
  TempDir d;
  // A site-packages whose torch would fail on import: only its version.py is read.
  d.write("sp/torch/__init__.py", "raise SystemExit('imported')\n");
  d.write("sp/torch/version.py", "__version__ = '2.9.1+cu128'\ngit_version = 'abc'\n");
  const std::string py = d.path + "/bin/python3";
  // Stands for the interpreter: prints the package directory as find_spec would.
  d.write("bin/python3", "#!/bin/sh\nprintf '%s' \"$SITE/torch\"\n", true);
  const auto j = run({"--json"}, {"PATH=" + d.path + "/bin", "SITE=" + d.path + "/sp",
                                  "PYTORCH_ALLOC_CONF=expandable_segments:True"})
                     .json();
  CHECK(j["torch"]["torch_version"]["judged"] == "2.9.1+cu128");
  CHECK(j["torch"]["torch_version"]["source"] == d.path + "/sp/torch/version.py (python3)");
  CHECK(known_ids(j) == std::vector<std::string>{"unified-variable-ignored"});
  // --python names another interpreter; --torch-version wins over both.
  const auto j2 = run({"--json", "--python", py}, {"SITE=" + d.path + "/sp"}).json();
  CHECK(j2["torch"]["torch_version"]["judged"] == "2.9.1+cu128");
  const auto j3 =
      run({"--json", "--python", py, "--torch-version", "2.10.0"}, {"SITE=" + d.path + "/sp"})
          .json();
  CHECK(j3["torch"]["torch_version"]["judged"] == "2.10.0");

  // With the real interpreter: find_spec locates the package and runs none of it.
  if (access("/usr/bin/python3", X_OK) == 0) {
    const auto j4 = run({"--json", "--python", "/usr/bin/python3"},
                        {"PYTHONPATH=" + d.path + "/sp", "PYTHONNOUSERSITE=1"})
                        .json();
    CHECK(j4["torch"]["torch_version"]["judged"] == "2.9.1+cu128");
    CHECK(j4["torch"]["torch_version"]["source"] ==
          d.path + "/sp/torch/version.py (/usr/bin/python3)");
  }
}

TEST_CASE("config: a FIFO as torch/version.py is not opened blocking", "[config_torch]") {
  TempDir d;
  d.write("sp/torch/__init__.py", "");
  // No writer will ever come: a blocking open(2) of it never returned.
  REQUIRE(mkfifo((d.path + "/sp/torch/version.py").c_str(), 0600) == 0);
  d.write("bin/python3", "#!/bin/sh\nprintf '%s' \"$SITE/torch\"\n", true);
  const auto j =
      run({"--json", "--python", d.path + "/bin/python3"}, {"SITE=" + d.path + "/sp"}).json();
  CHECK(j["torch"]["torch_version"]["judged"] == "2.11.0");
  CHECK(j["torch"]["torch_version"]["source"].get<std::string>().rfind("default", 0) == 0);
}

TEST_CASE("config: no torch found, and bad arguments", "[config_torch]") {
  // No PATH in the evaluated environment: the grammar's own release, saying why.
  const auto j = run({"--json"}).json();
  CHECK(j["torch"]["torch_version"]["judged"] == "2.11.0");
  CHECK(j["torch"]["torch_version"]["source"] == "default: python3 not found on PATH");
  TempDir d;
  d.write("bin/python3", "#!/bin/sh\nexit 0\n", true);  // answers nothing: no torch
  const auto j3 = run({"--json"}, {"PATH=" + d.path + "/bin"}).json();
  CHECK(j3["torch"]["torch_version"]["source"] ==
        "default: no torch package for " + d.path + "/bin/python3");
  // The same interpreter named by --python: no torch is an answer, judged by the default.
  const Run none = run({"--python", d.path + "/bin/python3"});
  CHECK(none.status == 0);
  CHECK(none.err == "");
}

TEST_CASE("config: an interpreter --python names that cannot be asked is refused",
          "[config_torch]") {
  // It was judged as if no torch were installed, and exited 0: "judged: torch 2.11.0 (default:
  // /nonexistent/python3 not found)". The interpreter named is what the user asked about.
  TempDir d;
  d.write("bin/fails", "#!/bin/sh\nexit 3\n", true);
  d.write("bin/plain.txt", "not a program\n");
  const std::string tail = "; name an interpreter that runs (or give --torch-version V)\n";
  const std::pair<std::string, std::string> cases[] = {
      {"/nonexistent/python3", "/nonexistent/python3 not found"},
      {"python3-nonexistent", "python3-nonexistent not found on PATH"},
      {d.path + "/bin/plain.txt", d.path + "/bin/plain.txt is not an executable file"},
      {d.path + "/bin/fails", d.path + "/bin/fails exited with status 3"},
  };
  for (const auto &[python, why] : cases)
    for (const bool json : {false, true}) {
      std::vector<std::string> args{"--python", python};
      if (json) args.insert(args.begin(), "--json");
      const Run r = run(args, {"PATH=" + d.path + "/bin"});
      INFO(python << (json ? " --json" : ""));
      CHECK(r.status == 66);
      CHECK(r.out == "");
      CHECK(r.err == "cumemguard config: --python: " + why + tail);
    }

  Run bad = run({"--torch-version", "latest"});
  CHECK(bad.status == 64);
  CHECK(
      bad.err ==
      "cumemguard config: --torch-version: 'latest' is not a release such as 2.9.1 (see cumemguard "
      "config --help)\n");
  CHECK(run({"--torch-version"}).status == 64);
  CHECK(run({"--python"}).status == 64);
  CHECK(run({"--python="}).status == 64);
  CHECK(run({"--help"}).out.find("--torch-version V") != std::string::npos);
}
