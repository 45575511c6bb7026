// SPDX-License-Identifier: Apache-2.0
// policy/torch_releases.def through the model: a table of vectors per modelled release (what that
// release's parser does with the environment: the outcome class, the exception and its message,
// effective values), each key's first release, the setter per release, a release newer or older
// than every row, the scoped rewrite keeping the keys of the release it runs under, and what the
// shim may say before it knows the release.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "torch_conf.h"
#include "torch_rewrite.h"
#include "torch_rules.h"

using namespace cmg::torchconf;

namespace {

TorchVersion v(const char *s) {
  return torch_version(s);
}

struct Vec {
  const char *release;
  const char *cuda;   // PYTORCH_CUDA_ALLOC_CONF, nullptr = unset
  const char *alloc;  // PYTORCH_ALLOC_CONF, nullptr = unset
  OutcomeClass cls;
  ErrorType type;     // when not Ok
  const char *what;   // TorchError::what() contains this ("" when Ok)
  Key key;            // a key whose effective value is checked
  const char *value;  // effective_text of it
};

constexpr auto Ok = OutcomeClass::Ok;
constexpr auto Exc = OutcomeClass::Exception;
constexpr auto Abort = OutcomeClass::ImportAbort;
constexpr auto VE = ErrorType::ValueError;
constexpr auto RE = ErrorType::RuntimeError;

// One row per fact the table claims, in release order. Legacy releases (2.0 to 2.7) raise
// RuntimeError for everything (TORCH_CHECK) and never abort the import (the regex backend scan).
const Vec kVectors[] = {
    {"2.0.1", "expandable_segments:True", nullptr, Exc, RE,
     "Unrecognized CachingAllocator option: expandable_segments", Key::ExpandableSegments, "False"},
    {"2.0.1", "roundup_bypass_threshold_mb:64", nullptr, Ok, RE, "", Key::RoundupBypassThresholdMb,
     "67108864"},
    {"2.1.2", "expandable_segments:True", nullptr, Ok, RE, "", Key::ExpandableSegments, "True"},
    {"2.1.2", "roundup_bypass_threshold_mb:64", nullptr, Exc, RE,
     "Unrecognized CachingAllocator option: roundup_bypass_threshold_mb", Key::ExpandableSegments,
     "False"},
    {"2.1.2", "release_lock_on_cudamalloc:True", nullptr, Exc, RE,
     "Unrecognized CachingAllocator option: release_lock_on_cudamalloc",
     Key::ReleaseLockOnCudamalloc, "False"},
    {"2.2.2", "release_lock_on_cudamalloc:True", nullptr, Ok, RE, "", Key::ReleaseLockOnCudamalloc,
     "True"},
    {"2.2.2", "expandable_segments:true", nullptr, Exc, RE,
     "Expected a single True/False argument for expandable_segments", Key::ExpandableSegments,
     "False"},
    {"2.2.2", "max_split_size_mb:20", nullptr, Exc, RE,
     "CachingAllocator option max_split_size_mb too small, must be > 20", Key::MaxSplitSizeMb,
     "-1"},
    {"2.3.1", "garbage_collection_threshold:1.0", nullptr, Exc, RE,
     "garbage_collect_threshold too big, set it 0.0~1.0", Key::GarbageCollectionThreshold, "0.0"},
    {"2.4.1", "expandable_segments=True", nullptr, Exc, RE,
     "Unrecognized CachingAllocator option: expandable_segments=True", Key::ExpandableSegments,
     "False"},
    {"2.4.1", "expandable_segments:True max_split_size_mb:64", nullptr, Exc, RE,
     "Expected a single True/False argument for expandable_segments", Key::ExpandableSegments,
     "False"},
    {"2.5.1", "max_non_split_rounding_mb:40", nullptr, Exc, RE,
     "Unrecognized CachingAllocator option: max_non_split_rounding_mb", Key::MaxNonSplitRoundingMb,
     "20971520"},
    {"2.6.0", "max_non_split_rounding_mb:40", nullptr, Ok, RE, "", Key::MaxNonSplitRoundingMb,
     "41943040"},
    {"2.6.0", "pinned_use_background_threads:True", nullptr, Ok, RE, "",
     Key::PinnedUseBackgroundThreads, "True"},
    {"2.7.1", "roundup_power2_divisions:[256:1,512:2,>:4]", nullptr, Ok, RE, "",
     Key::RoundupPower2Divisions, "[1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 4, 4, 4, 4, 4, 4]"},
    {"2.7.1", nullptr, "expandable_segments:True", Ok, RE, "", Key::ExpandableSegments, "False"},
    {"2.7.1", "expandable_segments:True,,max_split_size_mb:64", nullptr, Exc, RE,
     "Unrecognized CachingAllocator option: ,", Key::ExpandableSegments, "True"},
    {"2.8.0", "graph_capture_record_stream_reuse:True", nullptr, Exc, VE,
     "Unrecognized key 'graph_capture_record_stream_reuse' in CUDA allocator config.",
     Key::GraphCaptureRecordStreamReuse, "False"},
    {"2.9.1", "graph_capture_record_stream_reuse:True", nullptr, Ok, VE, "",
     Key::GraphCaptureRecordStreamReuse, "True"},
    {"2.9.1", "pinned_reserve_segment_size_mb:64", nullptr, Exc, VE,
     "Unrecognized key 'pinned_reserve_segment_size_mb' in CUDA allocator config.",
     Key::PinnedReserveSegmentSizeMb, "0"},
    {"2.10.0", "per_process_memory_fraction:0.5", nullptr, Ok, VE, "",
     Key::PerProcessMemoryFraction, "0.5"},
    {"2.10.0", "large_segment_size_mb:64", nullptr, Exc, VE,
     "Unrecognized key 'large_segment_size_mb' in CUDA allocator config.", Key::LargeSegmentSizeMb,
     "20971520"},
    {"2.10.0", "expandable_segments=True", nullptr, Abort, RE,
     "Index out of bounds in ConfigTokenizer", Key::ExpandableSegments, "False"},
    {"2.11.0", "large_segment_size_mb:64", nullptr, Ok, VE, "", Key::LargeSegmentSizeMb,
     "67108864"},
    {"2.11.0", "per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True", nullptr, Exc, VE,
     "Unrecognized key 'throw_on_cudamalloc_oom' in CUDA allocator config.",
     Key::PerProcessMemoryFraction, "0.5"},
    {"2.12.0", "per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True", nullptr, Ok, VE, "",
     Key::ThrowOnCudamallocOom, "True"},
    {"2.12.0", "throw_on_cudamalloc_oom:true", nullptr, Exc, VE,
     "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'",
     Key::ThrowOnCudamallocOom, "False"},
    {"2.11.0", "pinned_free_catch_all:True", nullptr, Exc, VE,
     "Unrecognized key 'pinned_free_catch_all' in CUDA allocator config.", Key::PinnedFreeCatchAll,
     "False"},
    {"2.13.0", "pinned_free_catch_all:True", nullptr, Ok, VE, "", Key::PinnedFreeCatchAll, "True"},
    {"2.14.0", "expandable_segments_reserve:0.5", nullptr, Exc, VE,
     "Unrecognized key 'expandable_segments_reserve' in CUDA allocator config.",
     Key::ExpandableSegmentsReserve, "default"},
    {"2.15.0a0", "expandable_segments_reserve:0.5", nullptr, Ok, VE, "",
     Key::ExpandableSegmentsReserve, "0.5"},
    {"2.15.0a0", "expandable_segments_reserve:40G", nullptr, Ok, VE, "",
     Key::ExpandableSegmentsReserve, "40G"},
    // A malformed reserve only warns and keeps the default, unlike every other key.
    {"2.15.0a0", "expandable_segments_reserve:half", nullptr, Ok, VE, "",
     Key::ExpandableSegmentsReserve, "default"},
    {"2.15.0a0", "expandable_segments_reserve:0", nullptr, Ok, VE, "",
     Key::ExpandableSegmentsReserve, "default"},
    {"2.15.0a0", "expandable_segments_reserve_by_class:[tiny:0.05,big:40G,bad:x]", nullptr, Ok, VE,
     "", Key::ExpandableSegmentsReserveByClass, "[big:40G,tiny:0.05]"},
    // Without '[' the class loop reads past the end: the index assert at the first allocation.
    {"2.15.0a0", "expandable_segments_reserve_by_class:0.5", nullptr, Exc, RE,
     "Index out of bounds in ConfigTokenizer", Key::ExpandableSegmentsReserveByClass, "[]"},
};

}  // namespace

TEST_CASE("releases: a table of vectors per modelled release", "[torch_releases]") {
  for (const Vec &t : kVectors) {
    Env e;
    if (t.cuda) e.cuda = t.cuda;
    if (t.alloc) e.alloc = t.alloc;
    const Judgement j = judge(e, v(t.release), "test");
    const Outcome &o = j.outcome;
    INFO(t.release << " CUDA=" << (t.cuda ? t.cuda : "(unset)")
                   << " ALLOC=" << (t.alloc ? t.alloc : "(unset)") << " -> " << outcome_name(o.cls)
                   << " " << (o.error ? o.error->python() : ""));
    CHECK(o.cls == t.cls);
    if (t.cls == Ok) {
      CHECK_FALSE(o.error);
    } else {
      REQUIRE(o.error);
      CHECK(o.error->type == t.type);
      CHECK(o.error->what().find(t.what) != std::string::npos);
    }
    CHECK(effective_text(o.settings, t.key) == t.value);
  }
}

TEST_CASE("releases: each key's first release is where its parser starts", "[torch_releases]") {
  for (const KeyInfo &k : keys()) {
    INFO(k.name);
    const TorchVersion first = torch_version(k.first);
    CHECK_FALSE(k.source.empty());
    CHECK(grammar_for(first).knows(k.key));
    // The release before the first one does not parse it (2.0 is the oldest row).
    if (first > v("2.0.0")) {
      const TorchVersion before{first.major, first.minor - 1, 0, ""};
      CHECK_FALSE(grammar_for(before).knows(k.key));
    }
    if (!k.last.empty()) {
      const TorchVersion last = torch_version(k.last);
      CHECK_FALSE(grammar_for(TorchVersion{last.major, last.minor + 1, 0, ""}).knows(k.key));
    }
  }
  CHECK(std::string(key_info(Key::ExpandableSegments).first) == "2.1");
  CHECK(std::string(key_info(Key::ThrowOnCudamallocOom).first) == "2.12");
  CHECK(std::string(key_info(Key::ExpandableSegmentsReserve).first) == "2.15");
  CHECK_FALSE(newest_grammar().released);  // the next release's keys, marked as such
  CHECK(newest_grammar().release == "2.15");
}

TEST_CASE("releases: the variables each release reads", "[torch_releases]") {
  Env e;
  e.alloc = "expandable_segments:True";
  e.hip = "max_split_size_mb:64";
  // Legacy: PYTORCH_CUDA_ALLOC_CONF only.
  const Outcome o27 = evaluate(e, grammar_for(v("2.7.1")));
  CHECK(o27.cuda.var == Var::None);
  CHECK(o27.accel.var == Var::None);
  CHECK_FALSE(o27.settings.expandable_segments);
  // 2.10+: CUDA, then HIP for parser A even on a CUDA build, then the unified variable (the code,
  // measured on 2.11; the header comment says the opposite).
  const Outcome o12 = evaluate(e, grammar_for(v("2.12.0")));
  CHECK(o12.accel.var == Var::Hip);
  CHECK(o12.cuda.var == Var::Alloc);
  CHECK(o12.settings.max_split_size == 64ull << 20);
  CHECK_FALSE(o12.settings.expandable_segments);
  // The legacy release says why the unified variable did nothing.
  bool said = false;
  for (const Problem &p : diagnose(e, o27))
    said = said || p.text.find(
                       "PYTORCH_ALLOC_CONF='expandable_segments:True' is ignored: torch "
                       "2.7 reads only PYTORCH_CUDA_ALLOC_CONF") != std::string::npos;
  CHECK(said);
}

TEST_CASE("releases: the setter and its warning per release", "[torch_releases]") {
  CHECK(grammar_for(v("2.9.1")).setter_name() == "torch.cuda.memory._set_allocator_settings");
  CHECK(grammar_for(v("2.10.0")).setter_name() == "torch._C._accelerator_setAllocatorSettings");
  CHECK(grammar_for(v("2.2.2")).setter_name() == "torch.cuda.memory._set_allocator_settings");
  for (const char *rel : {"2.2.2", "2.9.1", "2.11.0", "2.12.0"}) {
    INFO(rel);
    Runtime rt = runtime_from(evaluate(Env{}, grammar_for(v(rel))));
    const SetResult r =
        set_allocator_settings(rt, "expandable_segments:True", SetterApi::DeprecatedCuda);
    CHECK_FALSE(r.error);
    CHECK(rt.settings.expandable_segments);
    const bool warned = !r.warnings.empty() && r.warnings[0].find("FutureWarning") == 0;
    CHECK(warned == grammar_for(v(rel)).accelerator_setter);
  }
  // The legacy setter resets the same three fields and raises RuntimeError for an unknown key.
  Runtime rt = runtime_from(evaluate(Env{}, grammar_for(v("2.5.1"))));
  REQUIRE_FALSE(set_allocator_settings(rt, "max_split_size_mb:64,expandable_segments:True").error);
  const SetResult bad = set_allocator_settings(rt, "throw_on_cudamalloc_oom:True");
  REQUIRE(bad.error);
  CHECK(bad.error->python() ==
        "RuntimeError: Unrecognized CachingAllocator option: throw_on_cudamalloc_oom");
  CHECK(rt.settings.max_split_size == UINT64_MAX);  // reset before the key was read
  CHECK(rt.settings.expandable_segments);           // not reset
}

TEST_CASE("releases: a future release, and one older than the oldest row", "[torch_releases]") {
  Env e;
  e.cuda = "expandable_segments:True,cache_budget_mb:512";
  const Judgement future = judge(e, v("2.17.0"), "--torch-version");
  CHECK(future.grammar.fit == Fit::Newer);
  CHECK_FALSE(future.exact);
  CHECK(future.summary() ==
        "torch 2.17.0 (--torch-version): newer than every modelled release: judged with the "
        "newest grammar known (2.15, the main branch after 2.14); keys it does not know are kept "
        "and not judged");
  REQUIRE(future.outcome.cls == Ok);
  CHECK(future.outcome.settings.expandable_segments);
  REQUIRE(future.outcome.warnings.size() == 1);
  CHECK(
      future.outcome.warnings[0] ==
      "cumemguard: 'cache_budget_mb' is not a key of any modelled release (newest: 2.15); kept as "
      "written and not judged");
  // The same key for a modelled release is PyTorch's error.
  CHECK(judge(e, v("2.14.0"), "t").outcome.error->python() ==
        "ValueError: Unrecognized key 'cache_budget_mb' in CUDA allocator config.");

  const Judgement old = judge(e, v("1.13.1"), "--torch-version");
  CHECK(old.grammar.fit == Fit::Older);
  CHECK(old.summary() ==
        "torch 1.13.1 (--torch-version): older than the oldest modelled release (2.0): judged with "
        "the 2.0 grammar; that release's own keys, messages and variables are not modelled");
  const Judgement next = judge(e, v("2.15.0a0+git1234"), "t");
  CHECK(next.summary().find("not released: the keys of the main branch after 2.14") !=
        std::string::npos);
  CHECK(judge(Env{}, v("2.12.0"), "t").summary() ==
        "torch 2.12.0 (t): the 2.12 grammar and its known problems");
}

TEST_CASE("releases: the scoped rewrite keeps every key of the release it runs under",
          "[torch_releases][torch_rewrite]") {
  Env e;
  e.cuda =
      "per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True,expandable_segments:True,"
      "pinned_free_catch_all:True";
  RewriteRequest q;
  q.overrides = "expandable_segments:False";
  q.version = v("2.12.0");
  q.version_source = "torch.__version__";
  const Rewrite r = rewrite(e, q);
  INFO(r.error);
  REQUIRE(r.error.empty());
  CHECK(r.expandable_before);
  CHECK_FALSE(r.expandable_after);
  CHECK(r.result ==
        "per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True,expandable_segments:False,"
        "pinned_free_catch_all:True");
  CHECK(r.restore == *e.cuda);
  CHECK(r.setter == "torch._C._accelerator_setAllocatorSettings");
  CHECK(rewrite_json(r).find("\"setter\":\"torch._C._accelerator_setAllocatorSettings\"") !=
        std::string::npos);
  // The same environment under 2.11 already fails: PyTorch 2.11 has no throw_on_cudamalloc_oom.
  q.version = v("2.11.0");
  const Rewrite r11 = rewrite(e, q);
  CHECK(r11.error.find("Unrecognized key 'throw_on_cudamalloc_oom'") != std::string::npos);
  // A release newer than every row keeps a key no row knows, byte for byte.
  Env f;
  f.cuda = "cache_budget_mb:512, expandable_segments:True";
  q.version = v("2.17.0");
  const Rewrite r17 = rewrite(f, q);
  REQUIRE(r17.error.empty());
  CHECK(r17.result == "cache_budget_mb:512, expandable_segments:False");
  CHECK(r17.restore == *f.cuda);
  // Under 2.9 the setter is the cuda one.
  q.version = v("2.9.1");
  Env g;
  g.cuda = "expandable_segments:True,max_split_size_mb:256";
  const Rewrite r9 = rewrite(g, q);
  REQUIRE(r9.error.empty());
  CHECK(r9.setter == "torch.cuda.memory._set_allocator_settings");
  CHECK(r9.result == "expandable_segments:False,max_split_size_mb:256");
}

TEST_CASE("releases: what can be said before the release is known", "[torch_releases]") {
  auto cuda = [](const char *s) {
    Env e;
    e.cuda = s;
    return e;
  };
  CHECK(fails_in_every_release(cuda("foo:bar")));
  CHECK(fails_in_every_release(cuda("expandable_segments=True")));  // abort, or RuntimeError
  CHECK(fails_in_every_release(cuda("backend:foo")));
  CHECK_FALSE(fails_in_every_release(cuda("throw_on_cudamalloc_oom:True")));  // 2.12+ accept it
  CHECK_FALSE(fails_in_every_release(cuda("expandable_segments:True")));      // 2.0 alone fails
  CHECK_FALSE(fails_in_every_release(Env{}));
}

TEST_CASE("releases: TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC in the diagnosis", "[torch_releases]") {
  Env e;
  e.cuda = "expandable_segments:True";
  e.expandable_ipc = "0";
  auto has = [](const std::vector<Problem> &ps, const std::string &text) {
    for (const Problem &p : ps)
      if (p.text.find(text) != std::string::npos) return true;
    return false;
  };
  CHECK(has(diagnose(e),
            "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=0 with expandable segments on: "
            "PyTorch makes its segments without a shareable handle type"));
  e.expandable_ipc = "yes";
  CHECK(has(diagnose(e), "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC='yes': PyTorch accepts only 0 or 1"));
  e.expandable_ipc = "1";
  CHECK_FALSE(has(diagnose(e), "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC"));
  char a[] = "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=0";
  char *envp[] = {a, nullptr};
  CHECK(Env::from_envp(envp).expandable_ipc == std::optional<std::string>("0"));
}
