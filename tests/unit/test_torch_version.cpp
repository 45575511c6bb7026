// SPDX-License-Identifier: Apache-2.0
// policy/torch_version, torch_rules and torch_rewrite: version strings and where torch keeps them,
// every row of the version table (applies in its range, not outside, with its bug), and the scoped
// settings change checked against the setter model.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "torch_rewrite.h"
#include "torch_rules.h"
#include "torch_version.h"

using namespace cmg::torchconf;

namespace {

TorchVersion v(const char *s) {
  return torch_version(s);
}

std::vector<std::string> ids(const Judgement &j) {
  std::vector<std::string> r;
  for (const KnownProblem &k : j.known) r.emplace_back(k.rule->id);
  return r;
}

std::string text_of(const Judgement &j, std::string_view id) {
  for (const KnownProblem &k : j.known)
    if (k.rule->id == id) return k.text;
  return "";
}

Env env_of(std::initializer_list<std::pair<const char *, const char *>> vars) {
  Env e;
  for (auto [k, val] : vars) {
    const std::string_view n = k;
    if (n == "PYTORCH_CUDA_ALLOC_CONF") e.cuda = val;
    if (n == "PYTORCH_HIP_ALLOC_CONF") e.hip = val;
    if (n == "PYTORCH_ALLOC_CONF") e.alloc = val;
    if (n == "PYTORCH_NO_CUDA_MEMORY_CACHING") e.no_caching = val;
  }
  return e;
}

// A file system in memory for the version finders.
struct MemFs {
  std::map<std::string, std::string> files;
  std::map<std::string, std::vector<std::string>> dirs;
  FileAccess access() const {
    return FileAccess{[this](const std::string &p) -> std::optional<std::string> {
                        auto it = files.find(p);
                        if (it == files.end()) return std::nullopt;
                        return it->second;
                      },
                      [this](const std::string &d) {
                        auto it = dirs.find(d);
                        return it == dirs.end() ? std::vector<std::string>{} : it->second;
                      }};
  }
};

}  // namespace

TEST_CASE("torch version strings", "[torch_version]") {
  auto a = parse_torch_version("2.11.0+cu130");
  REQUIRE(a);
  CHECK(a->major == 2);
  CHECK(a->minor == 11);
  CHECK(a->patch == 0);
  CHECK(a->text == "2.11.0+cu130");
  CHECK(a->release() == "2.11.0");
  auto b = parse_torch_version("2.10.0a0+git1234abc");
  REQUIRE(b);
  CHECK(b->release() == "2.10.0");
  auto c = parse_torch_version("2.9");
  REQUIRE(c);
  CHECK(c->patch == 0);
  CHECK(parse_torch_version("v2.8.1")->minor == 8);
  CHECK_FALSE(parse_torch_version("2"));
  CHECK_FALSE(parse_torch_version("two.one"));
  CHECK_FALSE(parse_torch_version(""));
  CHECK_FALSE(parse_torch_version("2.x"));
  // Release order: the local part does not count, minor 10 > 9.
  CHECK(v("2.10.0") > v("2.9.1"));
  CHECK(v("2.11.0+cu130") == v("2.11.0"));
  CHECK(v("2.9.1") < v("2.10.0"));
  CHECK(grammar_version().release() == "2.11.0");
  // Each release has its row; a patch release and a local part use their minor's.
  CHECK(grammar_for(v("2.10.1")).release == "2.10");
  CHECK(grammar_for(v("2.11.0+cu130")).release == "2.11");
  CHECK(grammar_for(v("2.11.0+cu130")).fit == Fit::Exact);
  CHECK(grammar_for(v("2.12.0")).release == "2.12");
}

TEST_CASE("torch version: version.py, dist-info, library names", "[torch_version]") {
  CHECK(version_in_version_py("__version__ = '2.11.0+cu130'\ndebug = False\n") == "2.11.0+cu130");
  CHECK(version_in_version_py("from typing import Optional\n__all__ = ['__version__']\n"
                              "__version__ = \"2.9.1\"\n") == "2.9.1");
  CHECK(version_in_version_py("__version__: str = '2.10.0'\n") == "2.10.0");
  CHECK_FALSE(version_in_version_py("x = '__version__ = 1'\n"));
  CHECK_FALSE(version_in_version_py("__version__ = get()\n"));
  CHECK(version_in_dist_info("torch-2.11.0+cu130.dist-info") == "2.11.0+cu130");
  CHECK(version_in_dist_info("/x/site-packages/torch-2.9.1.dist-info/") == "2.9.1");
  CHECK_FALSE(version_in_dist_info("torchvision-0.26.0.dist-info"));
  CHECK_FALSE(version_in_dist_info("torch_memory_saver-0.0.9.dist-info"));
  CHECK(version_in_library_name("/usr/lib/x86_64-linux-gnu/libtorch_cuda.so.2.11.0") == "2.11.0");
  CHECK(version_in_library_name("libc10.so.2.9") == "2.9");
  CHECK_FALSE(version_in_library_name("libc10.so.2"));  // an ABI number, not a release
  CHECK_FALSE(version_in_library_name("/site-packages/torch/lib/libc10_cuda.so"));
  CHECK_FALSE(version_in_library_name("libcudart.so.13.0.96"));
  CHECK(is_torch_library("/a/torch/lib/libtorch_cpu.so"));
  CHECK(is_torch_library("libc10_cuda.so"));
  CHECK_FALSE(is_torch_library("/a/libcudart.so.13"));
  CHECK(is_torch_allocator_library("/a/torch/lib/libc10_cuda.so"));
  CHECK(is_torch_allocator_library("libtorch_cuda.so"));
  CHECK_FALSE(is_torch_allocator_library("/a/torch/lib/libtorch_cpu.so"));
  CHECK_FALSE(is_torch_allocator_library("/a/torch/lib/libc10.so"));

  MemFs fs;
  fs.files["/sp/torch/version.py"] = "__version__ = '2.9.1+cu128'\n";
  auto f = version_of_library("/sp/torch/lib/libc10_cuda.so", fs.access());
  REQUIRE(f);
  CHECK(f->version.text == "2.9.1+cu128");
  CHECK(f->source == "/sp/torch/version.py");
  // No version.py: the dist-info directory beside the package.
  MemFs fs2;
  fs2.dirs["/sp2"] = {"numpy-2.0.dist-info", "torch", "torch-2.10.0.dist-info"};
  auto g = version_of_package("/sp2/torch", fs2.access());
  REQUIRE(g);
  CHECK(g->version.release() == "2.10.0");
  CHECK(g->source == "/sp2/torch-2.10.0.dist-info");
  // A versioned name wins; a library outside a torch/lib directory has no package.
  CHECK(version_of_library("/usr/lib/libtorch_cuda.so.2.8.0", fs.access())->version.release() ==
        "2.8.0");
  CHECK_FALSE(version_of_library("/usr/lib/libc10_cuda.so", fs.access()));
}

TEST_CASE("version rules: 2.9 ignores PYTORCH_ALLOC_CONF for expandable_segments",
          "[torch_rules]") {
  const Env e = env_of({{"PYTORCH_ALLOC_CONF", "expandable_segments:True"}});
  const Judgement j29 = judge(e, v("2.9.1"), "--torch-version");
  CHECK(ids(j29) == std::vector<std::string>{"unified-variable-ignored"});
  CHECK_FALSE(j29.exact);
  CHECK(j29.outcome.settings.expandable_segments == false);  // what 2.9.1 gets
  CHECK(j29.outcome.source[static_cast<std::size_t>(Key::ExpandableSegments)] == Var::None);
  CHECK(text_of(j29, "unified-variable-ignored").find("pytorch#183387") != std::string::npos);
  CHECK(text_of(j29, "unified-variable-ignored").find("PYTORCH_CUDA_ALLOC_CONF instead") !=
        std::string::npos);
  CHECK(j29.summary().find("torch 2.9.1 (--torch-version): the 2.9 grammar and its known problems; "
                           "not modelled: parser A of a stored pre-2.10 source") == 0);
  // 2.10 and 2.11 honour it: no known problem, the grammar's own value.
  for (const char *ver : {"2.10.0", "2.11.0"}) {
    const Judgement j = judge(e, v(ver), "test");
    INFO(ver);
    CHECK(j.known.empty());
    CHECK(j.exact);
    CHECK(j.outcome.settings.expandable_segments);
  }
  // With PYTORCH_CUDA_ALLOC_CONF present, 2.9 reads it (and prints its deprecation warning).
  const Judgement jc =
      judge(env_of({{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"}}), v("2.9.1"), "t");
  CHECK(ids(jc) ==
        std::vector<std::string>{"mempool-custom-allocator", "cuda-variable-deprecated"});
  CHECK(jc.known[1].rule->severity == Severity::Note);
  CHECK(jc.outcome.settings.expandable_segments);
  CHECK(judge(env_of({{"PYTORCH_CUDA_ALLOC_CONF", ""}}), v("2.11.0"), "t").known.empty());
}

TEST_CASE("version rules: expandable_segments with max_split_size_mb by release", "[torch_rules]") {
  const Env e =
      env_of({{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:512"}});
  // (Releases before 2.10 also list the MemPool row, before 2.5 the IPC row: expandable segments
  // are on.)
  CHECK(ids(judge(e, v("2.2.2"), "t")) ==
        std::vector<std::string>{"expandable-max-split-assert", "expandable-near-oom-assert",
                                 "expandable-ipc-unsupported", "mempool-custom-allocator",
                                 "expandable-max-split-growth"});
  CHECK(ids(judge(e, v("2.3.0"), "t")) ==
        std::vector<std::string>{"expandable-near-oom-assert", "expandable-ipc-unsupported",
                                 "mempool-custom-allocator", "expandable-max-split-growth"});
  CHECK(ids(judge(e, v("2.5.0"), "t")) ==
        std::vector<std::string>{"mempool-custom-allocator", "expandable-max-split-growth"});
  const Judgement j = judge(e, v("2.11.0"), "t");
  REQUIRE(ids(j) == std::vector<std::string>{"expandable-max-split-growth"});
  CHECK(j.known[0].rule->at_run_time == false);  // listed by config, not a finding
  CHECK(j.known[0].text.find("pytorch#123548") != std::string::npos);
  CHECK(j.known[0].text.find("PR #193400") != std::string::npos);
  CHECK(text_of(judge(e, v("2.2.0"), "t"), "expandable-max-split-assert")
            .find("pytorch#119452; fixed by PR #120022, first in 2.3.0") != std::string::npos);
  // garbage_collection_threshold alone: only the near-OOM assert of releases before 2.5.
  const Env g = env_of(
      {{"PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.8,expandable_segments:True"}});
  CHECK(ids(judge(g, v("2.4.1"), "t")) == std::vector<std::string>{"expandable-near-oom-assert",
                                                                   "expandable-ipc-unsupported",
                                                                   "mempool-custom-allocator"});
  CHECK(text_of(judge(g, v("2.4.1"), "t"), "expandable-near-oom-assert")
            .find("garbage_collection_threshold (PYTORCH_CUDA_ALLOC_CONF)") != std::string::npos);
  CHECK(ids(judge(g, v("2.5.0"), "t")) == std::vector<std::string>{"mempool-custom-allocator"});
  CHECK(judge(g, v("2.11.0"), "t").known.empty());
  // Not with expandable segments off, nor under cudaMallocAsync (they are native-only).
  CHECK(judge(env_of({{"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512"}}), v("2.2.0"), "t")
            .known.empty());
  CHECK(judge(env_of({{"PYTORCH_CUDA_ALLOC_CONF",
                       "backend:cudaMallocAsync,expandable_segments:True,max_split_size_mb:512"}}),
              v("2.2.0"), "t")
            .known.empty());
}

TEST_CASE("version rules: PYTORCH_NO_CUDA_MEMORY_CACHING by release", "[torch_rules]") {
  const Env zero = env_of({{"PYTORCH_NO_CUDA_MEMORY_CACHING", "0"}});
  CHECK(caching_off(zero, v("2.6.0")));
  CHECK_FALSE(caching_off(zero, v("2.7.0")));
  CHECK(caching_off(env_of({{"PYTORCH_NO_CUDA_MEMORY_CACHING", "1"}}), v("2.11.0")));
  CHECK(caching_off(env_of({{"PYTORCH_NO_CUDA_MEMORY_CACHING", ""}}), v("2.5.1")));
  CHECK_FALSE(caching_off(Env{}, v("2.5.1")));
  const Judgement j = judge(zero, v("2.5.1"), "t");
  REQUIRE(ids(j) == std::vector<std::string>{"no-caching-any-value"});
  CHECK(j.known[0].rule->at_run_time);
  CHECK(j.known[0].text.find(
            "PYTORCH_NO_CUDA_MEMORY_CACHING='0' turns the CUDA caching allocator off") == 0);
  CHECK(j.known[0].text.find("pytorch#145661; fixed by PR #145905, first in 2.7.0") !=
        std::string::npos);
  CHECK(judge(zero, v("2.7.0"), "t").known.empty());
  // Caching off makes the allocator settings moot, in every release.
  const Env both = env_of({{"PYTORCH_NO_CUDA_MEMORY_CACHING", "1"},
                           {"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"}});
  CHECK(ids(judge(both, v("2.11.0"), "t")) == std::vector<std::string>{"caching-off"});
  const Env zero_conf = env_of({{"PYTORCH_NO_CUDA_MEMORY_CACHING", "0"},
                                {"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"}});
  CHECK(judge(zero_conf, v("2.11.0"), "t").known.empty());
  CHECK(ids(judge(zero_conf, v("2.6.0"), "t")) ==
        std::vector<std::string>{"no-caching-any-value", "caching-off"});
}

TEST_CASE("version rules: every row names its bug or reason and a fix state", "[torch_rules]") {
  for (const VersionRule &r : version_rules()) {
    INFO(r.id);
    CHECK(!r.id.empty());
    CHECK(!r.fix.empty());
    if (!r.since.empty()) CHECK(parse_torch_version(r.since));
    if (!r.until.empty()) CHECK(parse_torch_version(r.until));
    if (!r.since.empty() && !r.until.empty())
      CHECK(v(std::string(r.since).c_str()) < v(std::string(r.until).c_str()));
  }
}

// ---- the scoped rewrite (the scoped allocator-settings guard)

namespace {

// The Python stand-in's and the scoped guard's cases: what the setter gets inside and after the block.
Rewrite off(const Env &e, std::optional<std::string> base = std::nullopt) {
  RewriteRequest q;
  q.base = std::move(base);
  q.overrides = "expandable_segments:False";
  return rewrite(e, q);
}

}  // namespace

TEST_CASE("rewrite: mixed legacy configuration keeps every other token", "[torch_rewrite]") {
  const Env e = env_of({{"PYTORCH_CUDA_ALLOC_CONF",
                         "max_split_size_mb:512,garbage_collection_threshold:0.8,"
                         "expandable_segments:True"}});
  const Rewrite r = off(e);
  INFO(r.error);
  REQUIRE(r.error.empty());
  CHECK(r.variable == Var::Cuda);
  CHECK(r.base ==
        "max_split_size_mb:512,garbage_collection_threshold:0.8,expandable_segments:True");
  CHECK(r.result ==
        "max_split_size_mb:512,garbage_collection_threshold:0.8,expandable_segments:False");
  CHECK(r.restore == r.base);
  CHECK(r.expandable_before);
  CHECK_FALSE(r.expandable_after);
  CHECK(r.changed);
  const std::string j = rewrite_json(r);
  CHECK(j.find("\"variable\":\"PYTORCH_CUDA_ALLOC_CONF\"") != std::string::npos);
  CHECK(j.find("\"expandable_before\":true,\"expandable_after\":false") != std::string::npos);
  CHECK(j.find("\"error\":null") != std::string::npos);
}

TEST_CASE("rewrite: unified variable, empty legacy shadowing, brackets", "[torch_rewrite]") {
  const Rewrite u =
      off(env_of({{"PYTORCH_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:256"}}));
  REQUIRE(u.error.empty());
  CHECK(u.variable == Var::Alloc);
  CHECK(u.result == "expandable_segments:False,max_split_size_mb:256");
  // A present but empty PYTORCH_CUDA_ALLOC_CONF hides the unified one: nothing is in effect.
  const Rewrite s = off(env_of(
      {{"PYTORCH_CUDA_ALLOC_CONF", ""}, {"PYTORCH_ALLOC_CONF", "expandable_segments:True"}}));
  REQUIRE(s.error.empty());
  CHECK(s.variable == Var::Cuda);
  CHECK(s.base == "");
  CHECK_FALSE(s.expandable_before);
  // Brackets of roundup_power2_divisions stay as written.
  const Rewrite b =
      off(env_of({{"PYTORCH_CUDA_ALLOC_CONF",
                   "roundup_power2_divisions:[256:1,512:2,>:4],expandable_segments:True"}}));
  REQUIRE(b.error.empty());
  CHECK(b.result == "roundup_power2_divisions:[256:1,512:2,>:4],expandable_segments:False");
  // 2.9.1 never enabled expandable segments from the unified variable.
  RewriteRequest q;
  q.overrides = "expandable_segments:False";
  q.version = v("2.9.1");
  q.version_source = "torch.__version__";
  const Rewrite r29 = rewrite(env_of({{"PYTORCH_ALLOC_CONF", "expandable_segments:True"}}), q);
  CHECK(r29.error.empty());
  CHECK_FALSE(r29.expandable_before);
  // The setter does honour the string at run time, so the restore keeps what 2.9.1 had: off.
  CHECK(r29.result == "expandable_segments:False");
  CHECK(r29.restore == "expandable_segments:False");
  REQUIRE(r29.known.size() == 1);
  CHECK(r29.known[0].find("pytorch#183387") != std::string::npos);
}

TEST_CASE("rewrite: nested use, the restore, and refusals", "[torch_rewrite]") {
  const Env e = env_of({{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"}});
  const Rewrite outer = off(e);
  REQUIRE(outer.error.empty());
  // Inside the block the base is what the block passed to the setter: expandable already off.
  const Rewrite inner = off(e, outer.result);
  REQUIRE(inner.error.empty());
  CHECK_FALSE(inner.expandable_before);
  CHECK(inner.result == outer.result);
  CHECK_FALSE(inner.changed);
  // Turning them on where nothing enables them: the restore must switch them off again, since
  // the setter does not reset expandable_segments when a string omits it (reference §5).
  RewriteRequest on;
  on.overrides = "expandable_segments:True";
  const Rewrite r = rewrite(env_of({{"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"}}), on);
  REQUIRE(r.error.empty());
  CHECK(r.result == "max_split_size_mb:64,expandable_segments:True");
  CHECK(r.restore == "max_split_size_mb:64,expandable_segments:False");
  CHECK_FALSE(r.expandable_before);
  CHECK(r.expandable_after);
  // An environment PyTorch rejects, a bad override, an override with a side effect.
  CHECK(off(env_of({{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:true"}}))
            .error.find("the environment already fails at the first CUDA allocation: ValueError") ==
        0);
  RewriteRequest bad;
  bad.overrides = "expandable_segment:False";
  CHECK(rewrite(e, bad).error.find("unknown key 'expandable_segment' (did you mean "
                                   "expandable_segments?)") != std::string::npos);
  const Rewrite frombase = off(e, std::string("max_split_size_mb:1"));
  CHECK(frombase.error.find("the base configuration raises ValueError") == 0);
  CHECK(frombase.result == frombase.base);
}

TEST_CASE("copy_out follows snprintf's contract", "[torch_rewrite]") {
  char buf[8];
  CHECK(copy_out("abc", buf, sizeof buf) == 3);
  CHECK(std::string(buf) == "abc");
  CHECK(copy_out("0123456789", buf, sizeof buf) == 10);
  CHECK(std::string(buf).empty());
  CHECK(copy_out("x", nullptr, 0) == 1);
}

TEST_CASE("rewrite_json escapes what the environment holds", "[torch_rewrite]") {
  Rewrite r;
  r.base = "a\"b\\c\x01\n";
  r.error = "tab\there";
  const std::string j = rewrite_json(r);
  CHECK(j.find("\"base\":\"a\\\"b\\\\c\\u0001\\u000a\"") != std::string::npos);
  CHECK(j.find("\"error\":\"tab\\u0009here\"") != std::string::npos);
  CHECK(j.find("\"variable\":null") == 1);
}
