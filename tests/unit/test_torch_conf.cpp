// SPDX-License-Identifier: Apache-2.0
// policy/torch_conf: every alloc-conf-vectors.md row, P20-P22, quirks, merge, plan, properties.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "torch_conf.h"

using namespace cmg::torchconf;

namespace {

constexpr std::uint64_t MiB = 1ull << 20;

Env cuda_env(std::string v) {
  Env e;
  e.cuda = std::move(v);
  return e;
}

Outcome cuda(std::string v) {
  return evaluate(cuda_env(std::move(v)));
}

std::string eff(const Outcome &o, Key k) {
  return effective_text(o.settings, k);
}

#define REQUIRE_OK(o)                                                  \
  do {                                                                 \
    INFO(((o).error ? (o).error->python() : std::string("no error"))); \
    REQUIRE((o).cls == OutcomeClass::Ok);                              \
  } while (0)

void require_error(const Outcome &o, OutcomeClass cls, ErrorType type, const std::string &msg) {
  INFO("outcome " << outcome_name(o.cls) << (o.error ? ": " + o.error->python() : std::string()));
  REQUIRE(o.cls == cls);
  REQUIRE(o.error.has_value());
  CHECK(o.error->type == type);
  CHECK(o.error->message == msg);
}

void require_exception(const std::string &v, ErrorType type, const std::string &msg) {
  require_error(cuda(v), OutcomeClass::Exception, type, msg);
}

bool has_problem(const std::vector<Problem> &ps, Severity s, const std::string &needle) {
  for (const Problem &p : ps)
    if (p.severity == s && p.text.find(needle) != std::string::npos) return true;
  return false;
}

std::string dump(const std::vector<Problem> &ps) {
  std::string r;
  for (const Problem &p : ps) r += std::string(severity_name(p.severity)) + ": " + p.text + "\n";
  return r;
}

const std::string kDefaultsRp = "[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]";

}  // namespace

TEST_CASE("tokenizer: , : [ ] are tokens, every space is dropped, even inside a word",
          "[torchconf]") {
  CHECK(tokenize("") == std::vector<std::string>{});
  CHECK(tokenize("expand able_segments :\tTrue ,") ==
        std::vector<std::string>{"expandable_segments", ":", "True", ","});
  CHECK(tokenize("a:[1:2,>:4]") ==
        std::vector<std::string>{"a", ":", "[", "1", ":", "2", ",", ">", ":", "4", "]"});
  CHECK(tokenize("k=v;x") == std::vector<std::string>{"k=v;x"});  // ; and = are ordinary
  CHECK(tokenize(",,") == std::vector<std::string>{",", ","});
  auto spans = tokenize_spans(" ab c:d");
  REQUIRE(spans.size() == 3);
  CHECK(spans[0].text == "abc");
  CHECK(spans[0].begin == 1);
  CHECK(spans[0].end == 5);
}

TEST_CASE("vector 1: empty string gives the defaults", "[torchconf][vectors]") {
  Outcome o = cuda("");
  REQUIRE_OK(o);
  CHECK(o.settings.max_split_size == UINT64_MAX);
  CHECK(eff(o, Key::MaxSplitSizeMb) == "-1");
  CHECK(eff(o, Key::GarbageCollectionThreshold) == "0.0");
  CHECK(eff(o, Key::ExpandableSegments) == "False");
  CHECK(eff(o, Key::PinnedNumRegisterThreads) == "1");
  CHECK(eff(o, Key::RoundupPower2Divisions) == kDefaultsRp);
  CHECK(eff(o, Key::Backend) == "native");
  CHECK(eff(o, Key::PerProcessMemoryFraction) == "1.0");
  CHECK(o.settings == Settings{});
  for (Var v : o.source) CHECK(v == Var::None);
}

TEST_CASE("vectors 2-7: expandable_segments", "[torchconf][vectors]") {
  Outcome o2 = cuda("expandable_segments:True");
  REQUIRE_OK(o2);
  CHECK(o2.settings.expandable_segments);
  CHECK(o2.source[static_cast<std::size_t>(Key::ExpandableSegments)] == Var::Cuda);
  Outcome o3 = cuda("expandable_segments:False");
  REQUIRE_OK(o3);
  CHECK_FALSE(o3.settings.expandable_segments);
  CHECK(o3.source[static_cast<std::size_t>(Key::ExpandableSegments)] == Var::Cuda);
  // 5
  require_exception("expandable_segments:1", ErrorType::ValueError,
                    "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got '1'");
  CHECK(cuda("expandable_segments:1").error->python() ==
        "ValueError: Expected 'True' or 'False' at index 2 in ConfigTokenizer but got '1'");
  CHECK(cuda("expandable_segments:1").error_parser == Parser::Accel);
  // 7: C parses first at the first allocation, so its message is the one seen
  require_exception("Expandable_Segments:True", ErrorType::ValueError,
                    "Unrecognized key 'Expandable_Segments' in CUDA allocator config.");
}

TEST_CASE("vectors 8-13: max_split_size_mb, max_non_split_rounding_mb", "[torchconf][vectors]") {
  Outcome o8 = cuda("max_split_size_mb:512");
  REQUIRE_OK(o8);
  CHECK(eff(o8, Key::MaxSplitSizeMb) == "536870912");
  Outcome o9 = cuda("max_split_size_mb:20");
  REQUIRE_OK(o9);
  CHECK(o9.settings.max_split_size == 20971520);
  require_exception("max_split_size_mb:19", ErrorType::ValueError,
                    "CachingAllocator option max_split_size_mb too small, must be >= 20");
  require_exception("max_split_size_mb:abc", ErrorType::RuntimeError, "stoull");
  CHECK(cuda("max_split_size_mb:abc").error->python() == "RuntimeError: stoull");
  Outcome o13 = cuda("max_non_split_rounding_mb:40");
  REQUIRE_OK(o13);
  CHECK(o13.settings.max_non_split_rounding_size == 40 * MiB);
  CHECK_FALSE(key_info(Key::MaxNonSplitRoundingMb).in_snapshot);
  require_exception("max_non_split_rounding_mb:19", ErrorType::ValueError,
                    "CachingAllocator option max_non_split_rounding_mb too small, must be >= 20");
}

TEST_CASE("vectors 14-17: garbage_collection_threshold", "[torchconf][vectors]") {
  Outcome o = cuda("garbage_collection_threshold:0.8");
  REQUIRE_OK(o);
  CHECK(o.settings.garbage_collection_threshold == 0.8);
  CHECK(eff(o, Key::GarbageCollectionThreshold) == "0.8");
  const std::string msg = "garbage_collect_threshold is invalid, set it in (0.0, 1.0)";
  require_exception("garbage_collection_threshold:1.0", ErrorType::ValueError, msg);
  require_exception("garbage_collection_threshold:0", ErrorType::ValueError, msg);
  require_exception("garbage_collection_threshold:abc", ErrorType::RuntimeError, "stod");
  require_exception("garbage_collection_threshold:nan", ErrorType::ValueError, msg);
  require_exception("garbage_collection_threshold:inf", ErrorType::ValueError, msg);
}

TEST_CASE("vectors 18-25: roundup_power2_divisions", "[torchconf][vectors]") {
  Outcome o18 = cuda("roundup_power2_divisions:4");
  REQUIRE_OK(o18);
  for (auto v : o18.settings.roundup_power2_divisions) CHECK(v == 4);
  require_exception("roundup_power2_divisions:3", ErrorType::ValueError,
                    "For roundups, the divisions has to be power of 2 ");
  Outcome o20 = cuda("roundup_power2_divisions:[256:1,512:2,>:4]");
  REQUIRE_OK(o20);
  for (std::size_t i = 0; i <= 8; ++i) CHECK(o20.settings.roundup_power2_divisions[i] == 1);
  CHECK(o20.settings.roundup_power2_divisions[9] == 2);
  for (std::size_t i = 10; i < 16; ++i) CHECK(o20.settings.roundup_power2_divisions[i] == 4);
  require_exception("roundup_power2_divisions:[256:3]", ErrorType::ValueError,
                    "For roundups, the divisions has to be power of 2 or 0 to disable roundup ");
  require_exception("roundup_power2_divisions:[300:2]", ErrorType::ValueError,
                    "For roundups, the intervals have to be power of 2 ");
  // 25: parser L's skipKey runs off the end during import torch
  Outcome o25 = cuda("roundup_power2_divisions:[256:1,512:2");
  require_error(o25, OutcomeClass::ImportAbort, ErrorType::RuntimeError,
                "Expected closing bracket ']' in ConfigTokenizer but reached end of config");
  CHECK(o25.error_parser == Parser::Load);
}

TEST_CASE("roundup list: gaps are 0, '>' never touches index 0, clamp to 15", "[torchconf]") {
  Outcome gaps = cuda("roundup_power2_divisions:[2:4,64:8]");
  REQUIRE_OK(gaps);
  const auto &d = gaps.settings.roundup_power2_divisions;
  CHECK(d[0] == 4);  // first-fill [0,1)
  CHECK(d[1] == 4);
  for (std::size_t i = 2; i < 6; ++i) CHECK(d[i] == 0);  // gaps stay 0, not inherited
  CHECK(d[6] == 8);
  Outcome lead = cuda("roundup_power2_divisions:[>:8]");
  REQUIRE_OK(lead);
  CHECK(lead.settings.roundup_power2_divisions[0] == 0);
  for (std::size_t i = 1; i < 16; ++i) CHECK(lead.settings.roundup_power2_divisions[i] == 8);
  Outcome big = cuda("roundup_power2_divisions:[1048576:2]");  // log2 = 20 -> clamped to 15
  REQUIRE_OK(big);
  for (std::size_t i = 0; i < 16; ++i) CHECK(big.settings.roundup_power2_divisions[i] == 2);
  Outcome zero = cuda("roundup_power2_divisions:[1:0,>:2]");
  REQUIRE_OK(zero);
  CHECK(zero.settings.roundup_power2_divisions[0] == 0);
  CHECK(zero.settings.roundup_power2_divisions[1] == 2);
}

TEST_CASE("vectors 27-31: backend", "[torchconf][vectors]") {
  Outcome o27 = cuda("backend:native");
  REQUIRE_OK(o27);
  CHECK(o27.settings.backend == Backend::Native);
  Outcome o28 = cuda("backend:cudaMallocAsync");
  REQUIRE_OK(o28);
  CHECK(o28.load_backend == Backend::CudaMallocAsync);
  CHECK(eff(o28, Key::Backend) == "cudaMallocAsync");
  CHECK(o28.source[static_cast<std::size_t>(Key::Backend)] == Var::Cuda);
  CHECK(o28.deferred);
  CHECK_FALSE(o28.error);
  require_exception("backend:foo", ErrorType::ValueError,
                    "Unknown allocator backend, options are native and cudaMallocAsync");
  // hipMallocAsync is a ROCm spelling: unknown on a CUDA build
  require_exception("backend:hipMallocAsync", ErrorType::ValueError,
                    "Unknown allocator backend, options are native and cudaMallocAsync");
  Outcome o30 = cuda("backend:cudaMallocAsync,max_split_size_mb:64");
  REQUIRE_OK(o30);
  CHECK(o30.warnings.empty());  // max_split is A-owned in 2.11: no warning
  CHECK(o30.settings.max_split_size == 64 * MiB);
  require_exception("foo:bar", ErrorType::ValueError,
                    "Unrecognized key 'foo' in CUDA allocator config.");
}

TEST_CASE("vectors 32-39: CUDA-owned keys", "[torchconf][vectors]") {
  Outcome o32 = cuda("release_lock_on_cudamalloc:True");
  REQUIRE_OK(o32);
  CHECK(o32.settings.release_lock_on_cudamalloc);
  CHECK(o32.source[static_cast<std::size_t>(Key::ReleaseLockOnCudamalloc)] == Var::Cuda);
  Outcome hipname = cuda("release_lock_on_hipmalloc:True");
  REQUIRE_OK(hipname);
  CHECK(hipname.settings.release_lock_on_cudamalloc);
  Outcome o33 = cuda("pinned_use_cuda_host_register:True,pinned_num_register_threads:8");
  REQUIRE_OK(o33);
  CHECK(o33.settings.pinned_use_cuda_host_register);
  CHECK(o33.settings.pinned_num_register_threads == 8);
  require_exception("pinned_num_register_threads:3", ErrorType::ValueError,
                    "Number of register threads has to be power of 2, got 3");
  require_exception("pinned_num_register_threads:256", ErrorType::ValueError,
                    "Number of register threads should be less than or equal to 128, got 256");
  Outcome o36 = cuda("pinned_use_background_threads:True");
  REQUIRE_OK(o36);
  CHECK(o36.settings.pinned_use_background_threads);
  require_exception("pinned_use_background_threads:true", ErrorType::ValueError,
                    "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'");
  Outcome o37 = cuda("pinned_reserve_segment_size_mb:64");
  REQUIRE_OK(o37);
  CHECK(o37.settings.pinned_reserve_segment_size_mb == 64);
  require_exception("pinned_reserve_segment_size_mb:0", ErrorType::ValueError,
                    "Pinned reserve segment size has to be greater than 0");
  Outcome o38 = cuda("graph_capture_record_stream_reuse:True");
  REQUIRE_OK(o38);
  CHECK(o38.settings.graph_capture_record_stream_reuse);
  Outcome o39 = cuda("per_process_memory_fraction:0.5");
  REQUIRE_OK(o39);
  CHECK(o39.settings.per_process_memory_fraction == 0.5);
  require_exception("per_process_memory_fraction:1.5", ErrorType::ValueError,
                    "per_process_memory_fraction is invalid, set it in [0.0, 1.0]");
  Outcome closed = cuda("per_process_memory_fraction:1,");  // closed interval: 1 and 0 accepted
  REQUIRE_OK(closed);
  REQUIRE_OK(cuda("per_process_memory_fraction:0"));
}

TEST_CASE("vectors 40-41: large_segment_size_mb pre-pass", "[torchconf][vectors]") {
  require_exception("large_segment_size_mb:64,max_split_size_mb:32", ErrorType::ValueError,
                    "CachingAllocator option max_split_size_mb too small, must be >= 64");
  // the pre-pass reads it first, wherever it stands
  require_exception("max_split_size_mb:32,large_segment_size_mb:64", ErrorType::ValueError,
                    "CachingAllocator option max_split_size_mb too small, must be >= 64");
  require_exception("large_segment_size_mb:10", ErrorType::ValueError,
                    "CachingAllocator option large_segment_size_mb must be > 10 MB");
  Outcome ok = cuda("large_segment_size_mb:11,max_split_size_mb:11");
  REQUIRE_OK(ok);
  CHECK(ok.settings.large_segment_size == 11 * MiB);
  CHECK(ok.settings.max_split_size == 11 * MiB);
}

TEST_CASE("vectors 43-48: separators, structure, duplicates", "[torchconf][vectors]") {
  Outcome o43 = cuda("expandable_segments:True,");
  REQUIRE_OK(o43);
  CHECK(o43.settings.expandable_segments);
  require_exception("expandable_segments:True,,max_split_size_mb:64", ErrorType::ValueError,
                    "Unrecognized key ',' in CUDA allocator config.");
  Outcome o47 = cuda("expandable_segments=True");
  require_error(o47, OutcomeClass::ImportAbort, ErrorType::RuntimeError,
                "Index out of bounds in ConfigTokenizer");
  CHECK(o47.error->what() ==
        "i < config_.size() INTERNAL ASSERT FAILED at \"/pytorch/c10/core/AllocatorConfig.h\":124, "
        "please report a bug to PyTorch. Index out of bounds in ConfigTokenizer");
  Outcome o48 = cuda("expandable_segments:True,expandable_segments:False");
  REQUIRE_OK(o48);
  CHECK_FALSE(o48.settings.expandable_segments);
}

TEST_CASE("vectors 53-60: which variable each parser reads", "[torchconf][vectors][env]") {
  Env e53;
  e53.cuda = "expandable_segments:True";
  e53.alloc = "max_split_size_mb:256";
  Outcome o53 = evaluate(e53);
  REQUIRE_OK(o53);
  CHECK(o53.settings.expandable_segments);
  CHECK(o53.settings.max_split_size == UINT64_MAX);  // no merge
  CHECK(o53.load.var == Var::Cuda);
  CHECK(o53.cuda.var == Var::Cuda);
  CHECK(o53.accel.var == Var::Cuda);

  Env e55;
  e55.alloc = "expandable_segments:True";
  Outcome o55 = evaluate(e55);
  REQUIRE_OK(o55);
  CHECK(o55.settings.expandable_segments);
  CHECK(o55.settings.last_allocator_settings == "expandable_segments:True");  // snapshot string
  CHECK(o55.accel.var == Var::Alloc);
  CHECK(o55.source[static_cast<std::size_t>(Key::ExpandableSegments)] == Var::Alloc);

  Env e58;
  e58.cuda = "expandable_segments:True";
  e58.hip = "max_split_size_mb:64";
  Outcome o58 = evaluate(e58);
  REQUIRE_OK(o58);
  CHECK(o58.settings.expandable_segments);
  CHECK(o58.settings.max_split_size == UINT64_MAX);

  Env e60;
  e60.alloc = "release_lock_on_cudamalloc:True";
  Outcome o60 = evaluate(e60);
  REQUIRE_OK(o60);
  CHECK(o60.settings.release_lock_on_cudamalloc);
  CHECK(o60.cuda.var == Var::Alloc);
}

TEST_CASE("reference §2: presence wins, HIP feeds parser A only", "[torchconf][env]") {
  Env empty_hides;
  empty_hides.cuda = "";
  empty_hides.alloc = "expandable_segments:True";
  Outcome o = evaluate(empty_hides);
  REQUIRE_OK(o);
  CHECK_FALSE(o.settings.expandable_segments);
  CHECK(o.accel.var == Var::Cuda);
  auto ps = diagnose(empty_hides, o);
  CHECK(has_problem(ps, Severity::Warning,
                    "PYTORCH_CUDA_ALLOC_CONF is set but empty: it hides "
                    "PYTORCH_ALLOC_CONF='expandable_segments:True'"));

  Env hip;
  hip.hip = "release_lock_on_cudamalloc:True,max_split_size_mb:64";
  Outcome h = evaluate(hip);
  REQUIRE_OK(h);
  CHECK(h.settings.max_split_size == 64 * MiB);
  CHECK_FALSE(h.settings.release_lock_on_cudamalloc);
  CHECK(h.load.var == Var::None);
  CHECK(h.cuda.var == Var::None);
  CHECK(h.accel.var == Var::Hip);
  auto hp = diagnose(hip, h);
  INFO(dump(hp));
  CHECK(has_problem(hp, Severity::Warning,
                    "'release_lock_on_cudamalloc:True': ignored on a CUDA build"));

  Env hip2;
  hip2.hip = "max_split_size_mb:64";
  hip2.alloc = "expandable_segments:True";
  Outcome h2 = evaluate(hip2);
  REQUIRE_OK(h2);
  CHECK(h2.settings.max_split_size == 64 * MiB);
  CHECK_FALSE(h2.settings.expandable_segments);
  CHECK(h2.cuda.var == Var::Alloc);
  auto hp2 = diagnose(hip2, h2);
  INFO(dump(hp2));
  CHECK(has_problem(hp2, Severity::Warning,
                    "PYTORCH_ALLOC_CONF: 'expandable_segments:True': ignored"));

  // a structural error in the HIP variable is not seen at import on a CUDA build
  Env hip_bad;
  hip_bad.hip = "expandable_segments";
  require_error(evaluate(hip_bad), OutcomeClass::Exception, ErrorType::RuntimeError,
                "Index out of bounds in ConfigTokenizer");
}

TEST_CASE("setter S4-S8 and reset semantics (§5, §6)", "[torchconf][setter]") {
  SECTION("S4: A raises before the C hook runs") {
    Runtime rt = runtime_from(cuda("release_lock_on_cudamalloc:True"));
    REQUIRE(rt.settings.release_lock_on_cudamalloc);
    SetResult r = set_allocator_settings(rt, "release_lock_on_cudamalloc:False,foo:1");
    REQUIRE(r.error);
    CHECK(r.error->python() ==
          "ValueError: Unrecognized key 'foo' in Accelerator allocator config.");
    CHECK(rt.settings.release_lock_on_cudamalloc);
  }
  SECTION("S5: partial application") {
    Runtime rt = runtime_from(cuda(""));
    SetResult r = set_allocator_settings(rt, "max_split_size_mb:64,garbage_collection_threshold:2");
    REQUIRE(r.error);
    CHECK(r.error->type == ErrorType::ValueError);
    CHECK(r.error->message == "garbage_collect_threshold is invalid, set it in (0.0, 1.0)");
    CHECK(rt.settings.max_split_size == 64 * MiB);
  }
  SECTION("S6: backend differs from the one chosen at load") {
    Runtime rt = runtime_from(cuda(""));
    SetResult r = set_allocator_settings(rt, "backend:cudaMallocAsync");
    REQUIRE(r.error);
    CHECK(r.error->type == ErrorType::RuntimeError);
    CHECK(r.error->internal_assert);
    CHECK(r.error->message ==
          "Allocator backend parsed at runtime != allocator backend parsed at load time, "
          "cudaMallocAsync != native");
    CHECK(r.error->python().find("INTERNAL ASSERT FAILED at "
                                 "\"/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":44") !=
          std::string::npos);
    CHECK(rt.settings.backend == Backend::Native);
  }
  SECTION("S7: unknown key from the setter names the Accelerator parser") {
    Runtime rt = runtime_from(cuda(""));
    SetResult r = set_allocator_settings(rt, "foo:1");
    REQUIRE(r.error);
    CHECK(r.error->python() ==
          "ValueError: Unrecognized key 'foo' in Accelerator allocator config.");
  }
  SECTION("S8: the deprecated wrapper warns and behaves identically") {
    for (std::string s : {"foo:1", "max_split_size_mb:64,garbage_collection_threshold:2",
                          "expandable_segments:True,pinned_num_register_threads:4"}) {
      Runtime a = runtime_from(cuda("")), b = a;
      SetResult ra = set_allocator_settings(a, s, SetterApi::Accelerator);
      SetResult rb = set_allocator_settings(b, s, SetterApi::DeprecatedCuda);
      CHECK(ra.error == rb.error);
      CHECK(a.settings == b.settings);
      REQUIRE_FALSE(rb.warnings.empty());
      CHECK(rb.warnings.front() ==
            "FutureWarning: torch.cuda._set_allocator_settings is deprecated. Use "
            "torch._C._accelerator_setAllocatorSettings instead.");
      CHECK(ra.warnings.empty());
    }
  }
  SECTION("reset: only max_split, roundup, gc (and max_non_split) go back to defaults") {
    Runtime rt = runtime_from(cuda(""));
    REQUIRE_FALSE(set_allocator_settings(rt,
                                         "expandable_segments:True,release_lock_on_cudamalloc:True,"
                                         "max_split_size_mb:64,garbage_collection_threshold:0.5,"
                                         "roundup_power2_divisions:4,max_non_split_rounding_mb:64")
                      .error);
    REQUIRE_FALSE(set_allocator_settings(rt, "").error);
    CHECK(rt.settings.expandable_segments);
    CHECK(rt.settings.release_lock_on_cudamalloc);
    CHECK(rt.settings.last_allocator_settings.empty());
    CHECK(rt.settings.max_split_size == UINT64_MAX);
    CHECK(rt.settings.garbage_collection_threshold == 0.0);
    CHECK(rt.settings.roundup_power2_divisions[3] == 0);
    CHECK(rt.settings.max_non_split_rounding_size == rt.settings.large_segment_size);
  }
  SECTION("not transactional: fields before the error stay applied") {
    Runtime rt = runtime_from(cuda("expandable_segments:True"));
    SetResult r = set_allocator_settings(rt, "expandable_segments:False,max_split_size_mb:1");
    REQUIRE(r.error);
    CHECK(r.error->message == "CachingAllocator option max_split_size_mb too small, must be >= 20");
    CHECK_FALSE(rt.settings.expandable_segments);
    CHECK(rt.settings.last_allocator_settings == "expandable_segments:False,max_split_size_mb:1");
  }
  SECTION("cudaMallocAsync process: C-owned native options warn") {
    Runtime rt = runtime_from(cuda("backend:cudaMallocAsync"));
    SetResult r =
        set_allocator_settings(rt, "backend:cudaMallocAsync,release_lock_on_cudamalloc:True");
    CHECK_FALSE(r.error);
    REQUIRE(r.warnings.size() == 1);
    CHECK(
        r.warnings[0] ==
        "Warning: backend:cudaMallocAsync ignores max_split_size_mb,roundup_power2_divisions, and "
        "garbage_collect_threshold. (function parseArgs)");
  }
}

TEST_CASE("quirks: stoull/stod, checkToken, whitespace, backend duplicates",
          "[torchconf][quirks]") {
  SECTION("the separator after a key is not checked") {
    Outcome o = cuda("max_split_size_mb,512");
    REQUIRE_OK(o);
    CHECK(o.settings.max_split_size == 512 * MiB);
    auto ps = diagnose(cuda_env("max_split_size_mb,512"), o);
    CHECK(has_problem(ps, Severity::Warning, "stands where ':' belongs"));
  }
  SECTION("the token after a value is consumed whatever it is") {
    Outcome o = cuda("expandable_segments:True:max_split_size_mb:64");
    REQUIRE_OK(o);
    CHECK(o.settings.expandable_segments);
    CHECK(o.settings.max_split_size == 64 * MiB);
  }
  SECTION("stoull: sign accepted, trailing garbage ignored, overflow") {
    Outcome neg = cuda("max_split_size_mb:-1");
    REQUIRE_OK(neg);
    CHECK(neg.settings.max_split_size == (UINT64_MAX / MiB) * MiB);  // clamped, not SIZE_MAX
    CHECK(eff(neg, Key::MaxSplitSizeMb) == "-1048576");
    Outcome mb = cuda("max_split_size_mb:64MB");
    REQUIRE_OK(mb);
    CHECK(mb.settings.max_split_size == 64 * MiB);
    auto ps = diagnose(cuda_env("max_split_size_mb:64MB"), mb);
    CHECK(has_problem(ps, Severity::Warning, "std::stoull ignores 'MB'"));
    Outcome plus = cuda("pinned_num_register_threads:+4");
    REQUIRE_OK(plus);
    CHECK(plus.settings.pinned_num_register_threads == 4);
    require_exception("max_split_size_mb:99999999999999999999", ErrorType::RuntimeError, "stoull");
    require_exception("max_split_size_mb:0x40", ErrorType::ValueError,  // stoull reads "0"
                      "CachingAllocator option max_split_size_mb too small, must be >= 20");
  }
  SECTION("stod: trailing garbage ignored") {
    Outcome o = cuda("garbage_collection_threshold:0.5x");
    REQUIRE_OK(o);
    CHECK(o.settings.garbage_collection_threshold == 0.5);
  }
  SECTION("whitespace is dropped even inside a word") {
    Outcome o = cuda(" expand able_segments : True ");
    REQUIRE_OK(o);
    CHECK(o.settings.expandable_segments);
  }
  SECTION("backend: the first occurrence decides at import, each one is checked at runtime") {
    Outcome a = cuda("backend:native,backend:cudaMallocAsync");
    require_error(a, OutcomeClass::Exception, ErrorType::RuntimeError,
                  "Allocator backend parsed at runtime != allocator backend parsed at load time, "
                  "cudaMallocAsync != native");
    CHECK(a.error->what() ==
          "tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at "
          "\"/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":44, please report a bug to PyTorch. "
          "Allocator backend parsed at runtime != allocator backend parsed at load time, "
          "cudaMallocAsync != native");
    // async chosen at import: allocations work, the settings call fails later (torch 2.11)
    Outcome b = cuda("backend:cudaMallocAsync,backend:native");
    require_error(b, OutcomeClass::Ok, ErrorType::RuntimeError,
                  "Allocator backend parsed at runtime != allocator backend parsed at load time, "
                  "native != cudaMallocAsync");
    CHECK(b.deferred);
  }
  SECTION("parser L stops at the first backend: later structural errors are seen at runtime") {
    require_error(cuda("backend:native,expandable_segments"), OutcomeClass::Exception,
                  ErrorType::RuntimeError, "Index out of bounds in ConfigTokenizer");
    // ',' is taken as the ':' and 'backend' as the value, ':' as the separator, then 'native' is a
    // key without a value: L never sees a backend key and runs off the end
    require_error(cuda("expandable_segments,backend:native"), OutcomeClass::ImportAbort,
                  ErrorType::RuntimeError, "Index out of bounds in ConfigTokenizer");
    require_error(cuda("expandable_segments,backend,max_split_size_mb:64"), OutcomeClass::Exception,
                  ErrorType::ValueError,
                  "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'backend'");
    require_error(cuda("max_split_size_mb:64,backend"), OutcomeClass::ImportAbort,
                  ErrorType::RuntimeError, "Index out of bounds in ConfigTokenizer");
  }
  SECTION("C parses before A at the first allocation") {
    Outcome o = cuda("max_split_size_mb:1,foo:1");
    require_error(o, OutcomeClass::Exception, ErrorType::ValueError,
                  "Unrecognized key 'foo' in CUDA allocator config.");
    CHECK(o.error_parser == Parser::Cuda);
    auto ps = diagnose(cuda_env("max_split_size_mb:1,foo:1"), o);
    INFO(dump(ps));
    CHECK(has_problem(ps, Severity::Error, "max_split_size_mb too small, must be >= 20"));
  }
  SECTION("single tokens that cannot be walked abort the import") {
    for (std::string s : {":", ",", "foo", "max_split_size_mb:", "roundup_power2_divisions:["})
      CHECK(cuda(s).cls == OutcomeClass::ImportAbort);
  }
  SECTION("a leading comma is read as a key") {
    require_exception(",expandable_segments:True", ErrorType::ValueError,
                      "Unrecognized key ',' in CUDA allocator config.");
  }
}

TEST_CASE("cudaMallocAsync: A and C are read at the first settings call, A first", "[torchconf]") {
  // measured on torch 2.11: these allocate fine; the first _accelerator_setAllocatorSettings raises
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"backend:cudaMallocAsync,foo:1", "Unrecognized key 'foo' in Accelerator allocator config."},
      {"backend:cudaMallocAsync,max_split_size_mb:1",
       "CachingAllocator option max_split_size_mb too small, must be >= 20"},
      {"backend:cudaMallocAsync,pinned_num_register_threads:3",
       "Number of register threads has to be power of 2, got 3"},
      {"backend:cudaMallocAsync,expandable_segments:true",
       "Expected 'True' or 'False' at index 6 in ConfigTokenizer but got 'true'"}};
  for (const auto &[v, msg] : cases) {
    INFO(v);
    Outcome o = cuda(v);
    CHECK(o.cls == OutcomeClass::Ok);
    CHECK(o.deferred);
    REQUIRE(o.error);
    CHECK(o.error->message == msg);
    auto ps = diagnose(cuda_env(v), o);
    CHECK(has_problem(ps, Severity::Error, "the first call that reads the allocator settings"));
    // refused unless the override repairs the value
    CHECK(plan(cuda_env(v), "expandable_segments:False").action ==
          (v.find("expandable_segments") != std::string::npos ? PlanAction::Write
                                                              : PlanAction::Refuse));
  }
  Outcome w = cuda("backend:cudaMallocAsync,release_lock_on_cudamalloc:True");
  CHECK_FALSE(w.error);
  REQUIRE(w.warnings.size() == 1);
  CHECK(w.warnings[0] ==
        "Warning: backend:cudaMallocAsync ignores max_split_size_mb,roundup_power2_divisions, and "
        "garbage_collect_threshold. (function parseArgs)");
  // P21 the other way round: async at import, native afterwards is never compared at allocations
  Outcome o = evaluate(cuda_env("backend:cudaMallocAsync"), cuda_env("backend:native"));
  CHECK(o.cls == OutcomeClass::Ok);
  CHECK(o.load_backend == Backend::CudaMallocAsync);
  REQUIRE(o.error);
  CHECK(o.error->message ==
        "Allocator backend parsed at runtime != allocator backend parsed at load time, "
        "native != cudaMallocAsync");
}

TEST_CASE("P20: expandable_segments without a value aborts import torch", "[torchconf][P20]") {
  Env e = cuda_env("expandable_segments");
  Outcome o = evaluate(e);
  require_error(o, OutcomeClass::ImportAbort, ErrorType::RuntimeError,
                "Index out of bounds in ConfigTokenizer");
  CHECK(o.error_var == Var::Cuda);
  auto ps = diagnose(e, o);
  INFO(dump(ps));
  REQUIRE_FALSE(ps.empty());
  CHECK(ps[0].severity == Severity::Error);
  CHECK(ps[0].text.rfind("PYTORCH_CUDA_ALLOC_CONF='expandable_segments': import torch would abort",
                         0) == 0);
  CHECK(ps[0].text.find("'expandable_segments' has no ':' and value") != std::string::npos);
  // the same through PYTORCH_ALLOC_CONF names that variable
  Env a;
  a.alloc = "expandable_segments";
  auto pa = diagnose(a);
  REQUIRE_FALSE(pa.empty());
  CHECK(pa[0].text.rfind("PYTORCH_ALLOC_CONF='expandable_segments': import torch would abort", 0) ==
        0);
  // and the shim refuses to rewrite it
  Plan p = plan(e, "expandable_segments:False");
  CHECK(p.action == PlanAction::Refuse);
  CHECK(p.reason.find("would already abort import torch") != std::string::npos);
}

TEST_CASE("P21: the variable changes after import torch", "[torchconf][P21]") {
  Env at_import, later;
  later.cuda = "backend:cudaMallocAsync";
  Outcome o = evaluate(at_import, later);
  require_error(o, OutcomeClass::Exception, ErrorType::RuntimeError,
                "Allocator backend parsed at runtime != allocator backend parsed at load time, "
                "cudaMallocAsync != native");
  auto ps = diagnose_change(at_import, later);
  INFO(dump(ps));
  CHECK(has_problem(ps, Severity::Warning, "PYTORCH_CUDA_ALLOC_CONF changed after import torch"));
  CHECK(has_problem(ps, Severity::Error, "INTERNAL ASSERT FAILED"));
  CHECK(diagnose_change(later, later).empty());
}

TEST_CASE("diagnostics: one line per problem", "[torchconf][diagnose]") {
  SECTION("lower-case true") {
    auto ps = diagnose(cuda_env("expandable_segments:true"));
    INFO(dump(ps));
    CHECK(has_problem(ps, Severity::Error, "ValueError: Expected 'True' or 'False' at index 2"));
    CHECK(has_problem(ps, Severity::Note, "case matters: write True"));
  }
  SECTION("unknown key with the case hint") {
    auto ps = diagnose(cuda_env("max_split_size_mb:64,Expandable_Segments:True"));
    INFO(dump(ps));
    CHECK(has_problem(ps, Severity::Error, "Unrecognized key 'Expandable_Segments'"));
    CHECK(has_problem(ps, Severity::Note, "keys are case-sensitive: expandable_segments"));
  }
  SECTION("every error is listed, not only the first") {
    auto ps = diagnose(cuda_env("max_split_size_mb:1,garbage_collection_threshold:2,foo:1"));
    INFO(dump(ps));
    CHECK(has_problem(ps, Severity::Error, "Unrecognized key 'foo' in CUDA allocator config."));
    CHECK(has_problem(ps, Severity::Error, "max_split_size_mb too small"));
    CHECK(has_problem(ps, Severity::Error, "garbage_collect_threshold is invalid"));
  }
  SECTION("two variables set differently") {
    Env e;
    e.cuda = "expandable_segments:True";
    e.alloc = "max_split_size_mb:256";
    auto ps = diagnose(e);
    CHECK(has_problem(ps, Severity::Warning,
                      "PYTORCH_ALLOC_CONF='max_split_size_mb:256' is ignored"));
    e.alloc = e.cuda;
    CHECK_FALSE(has_problem(diagnose(e), Severity::Warning, "is ignored"));
  }
  SECTION("duplicates and cudaMallocAsync") {
    auto ps = diagnose(
        cuda_env("backend:cudaMallocAsync,expandable_segments:True,expandable_segments:False"));
    INFO(dump(ps));
    CHECK(has_problem(ps, Severity::Note,
                      "expandable_segments is given 2 times; the last ('False') wins"));
    CHECK(has_problem(ps, Severity::Warning, "no effect with backend:cudaMallocAsync"));
  }
  SECTION("a clean environment has no problem") {
    CHECK(diagnose(cuda_env("max_split_size_mb:512,expandable_segments:True")).empty());
    CHECK(diagnose(Env{}).empty());
  }
}

TEST_CASE("merge", "[torchconf][merge]") {
  SECTION("P22: exact result") {
    MergeResult m =
        merge("max_split_size_mb:512,garbage_collection_threshold:0.8,expandable_segments:True",
              "expandable_segments:False");
    REQUIRE(m.ok());
    CHECK(m.value ==
          "max_split_size_mb:512,garbage_collection_threshold:0.8,expandable_segments:False");
  }
  SECTION("empty overrides return the original byte for byte, even malformed") {
    for (std::string s :
         {"", " ", "expandable_segments", "a:[1,", " x : y ,, z", "max_split_size_mb:512,"})
      CHECK(merge(s, "").value == s);
    CHECK(merge("expandable_segments", " , ").value == "expandable_segments");
  }
  SECTION("absent key is appended") {
    CHECK(merge("max_split_size_mb:512", "expandable_segments:True").value ==
          "max_split_size_mb:512,expandable_segments:True");
    CHECK(merge("max_split_size_mb:512,", "expandable_segments:True").value ==
          "max_split_size_mb:512,expandable_segments:True");
    CHECK(merge("max_split_size_mb:512 ", "expandable_segments:True").value ==
          "max_split_size_mb:512,expandable_segments:True ");
    CHECK(merge("", "expandable_segments:True").value == "expandable_segments:True");
  }
  SECTION("other tokens stay verbatim: spaces, lists, odd separators") {
    CHECK(merge(" expandable_segments : True , roundup_power2_divisions:[256:1, 512:2,>:4] ",
                "expandable_segments:False")
              .value ==
          " expandable_segments : False , roundup_power2_divisions:[256:1, 512:2,>:4] ");
    CHECK(merge("max_split_size_mb,512", "max_split_size_mb:256").value == "max_split_size_mb,256");
    CHECK(merge("expand able_segments:True", "expandable_segments:False").value ==
          "expand able_segments:False");
    CHECK(merge("roundup_power2_divisions:[256:1,>:4],expandable_segments:True",
                "roundup_power2_divisions:[ 1:2 , >:8 ]")
              .value == "roundup_power2_divisions:[1:2,>:8],expandable_segments:True");
  }
  SECTION("every occurrence of a duplicated key gets the value") {
    CHECK(merge("expandable_segments:True,max_split_size_mb:512,expandable_segments:True",
                "expandable_segments:False")
              .value ==
          "expandable_segments:False,max_split_size_mb:512,expandable_segments:False");
    CHECK(merge("backend:native,backend:native", "backend:cudaMallocAsync").value ==
          "backend:cudaMallocAsync,backend:cudaMallocAsync");
  }
  SECTION("aliases are the same key") {
    CHECK(merge("release_lock_on_hipmalloc:True", "release_lock_on_cudamalloc:False").value ==
          "release_lock_on_hipmalloc:False");
  }
  SECTION("removal") {
    CHECK(merge("max_split_size_mb:512, expandable_segments:True", "-max_split_size_mb").value ==
          "expandable_segments:True");
    CHECK(merge("max_split_size_mb:512, expandable_segments:True", "-expandable_segments").value ==
          "max_split_size_mb:512");
    CHECK(
        merge("a:1,expandable_segments:True,b:2,expandable_segments:False,", "-expandable_segments")
            .value == "a:1,b:2,");
    CHECK(merge("expandable_segments:True", "-expandable_segments").value == "");
    CHECK(merge("max_split_size_mb:512", "-expandable_segments").value == "max_split_size_mb:512");
  }
  SECTION("several overrides, in order") {
    CHECK(merge("max_split_size_mb:512,expandable_segments:True",
                "expandable_segments:False, -max_split_size_mb, garbage_collection_threshold:0.5")
              .value == "expandable_segments:False,garbage_collection_threshold:0.5");
  }
  SECTION("errors") {
    CHECK_FALSE(merge("x:1", "expandable_segments").ok());
    CHECK_FALSE(merge("x:1", "-").ok());
    CHECK_FALSE(merge("x:1", "-expandable_segments:True").ok());
    CHECK_FALSE(merge("x:1", "a:[1:2").ok());
    CHECK_FALSE(merge("x:1", "a:1;b:2:c").ok());
    MergeResult bad = merge("expandable_segments", "expandable_segments:False");
    CHECK_FALSE(bad.ok());
    CHECK(bad.value == "expandable_segments");
  }
}

TEST_CASE("plan for the shim", "[torchconf][plan]") {
  SECTION("P22") {
    Env e =
        cuda_env("max_split_size_mb:512,garbage_collection_threshold:0.8,expandable_segments:True");
    Plan p = plan(e, "expandable_segments:False");
    REQUIRE(p.action == PlanAction::Write);
    REQUIRE(p.writes.size() == 1);
    CHECK(p.writes[0].var == Var::Cuda);
    CHECK_FALSE(p.writes[0].create);
    CHECK(p.writes[0].new_value ==
          "max_split_size_mb:512,garbage_collection_threshold:0.8,expandable_segments:False");
    REQUIRE(p.after);
    CHECK_FALSE(p.after->settings.expandable_segments);
    CHECK(p.after->settings.max_split_size == 512 * MiB);
    CHECK(apply(e, p).cuda == p.writes[0].new_value);
  }
  SECTION("not set: nothing to do") {
    Plan p = plan(cuda_env("expandable_segments:True"), "");
    CHECK(p.action == PlanAction::None);
    CHECK(p.reason == "CUMEMGUARD_TORCH_ALLOC_CONF is not set");
  }
  SECTION("no variable present: create PYTORCH_CUDA_ALLOC_CONF") {
    Plan p = plan(Env{}, "expandable_segments:True");
    REQUIRE(p.action == PlanAction::Write);
    CHECK(p.writes[0].var == Var::Cuda);
    CHECK(p.writes[0].create);
    CHECK(p.writes[0].new_value == "expandable_segments:True");
    CHECK(plan(Env{}, "-expandable_segments").action == PlanAction::None);
  }
  SECTION("only PYTORCH_ALLOC_CONF: rewrite it") {
    Env e;
    e.alloc = "max_split_size_mb:512,expandable_segments:True";
    Plan p = plan(e, "expandable_segments:False");
    REQUIRE(p.action == PlanAction::Write);
    CHECK(p.writes[0].var == Var::Alloc);
    CHECK(p.writes[0].new_value == "max_split_size_mb:512,expandable_segments:False");
  }
  SECTION("empty PYTORCH_CUDA_ALLOC_CONF is the one PyTorch reads") {
    Env e;
    e.cuda = "";
    e.alloc = "expandable_segments:True";
    Plan p = plan(e, "max_split_size_mb:256");
    REQUIRE(p.action == PlanAction::Write);
    CHECK(p.writes[0].var == Var::Cuda);
    CHECK(p.writes[0].new_value == "max_split_size_mb:256");
  }
  SECTION("only the HIP variable: common keys there, CUDA keys in PYTORCH_ALLOC_CONF") {
    Env e;
    e.hip = "max_split_size_mb:64";
    Plan p = plan(e, "expandable_segments:True,release_lock_on_cudamalloc:True");
    REQUIRE(p.action == PlanAction::Write);
    REQUIRE(p.writes.size() == 2);
    CHECK(p.writes[0].var == Var::Hip);
    CHECK(p.writes[0].new_value == "max_split_size_mb:64,expandable_segments:True");
    CHECK(p.writes[1].var == Var::Alloc);
    CHECK(p.writes[1].create);
    CHECK(p.writes[1].new_value == "release_lock_on_cudamalloc:True");
    REQUIRE(p.after);
    CHECK(p.after->settings.expandable_segments);
    CHECK(p.after->settings.release_lock_on_cudamalloc);
    CHECK(p.after->settings.max_split_size == 64 * MiB);
  }
  SECTION("refusals keep the original") {
    Env e = cuda_env("expandable_segments:True");
    Plan lower = plan(e, "expandable_segments:true");
    CHECK(lower.action == PlanAction::Refuse);
    CHECK(lower.reason.find("Expected 'True' or 'False'") != std::string::npos);
    CHECK(lower.writes.empty());
    CHECK(apply(e, lower) == e);
    Plan unknown = plan(e, "expandable_segment:False");
    CHECK(unknown.action == PlanAction::Refuse);
    CHECK(unknown.reason.find("did you mean expandable_segments?") != std::string::npos);
    Plan small = plan(e, "max_split_size_mb:10");
    CHECK(small.action == PlanAction::Refuse);
    CHECK(small.reason.find("max_split_size_mb too small, must be >= 20") != std::string::npos);
    Plan syntax = plan(e, "expandable_segments");
    CHECK(syntax.action == PlanAction::Refuse);
    Plan backend = plan(e, "backend:cudaMallocAsync");
    CHECK(backend.action == PlanAction::Write);  // set before import: L and C both see it
  }
  SECTION("already in effect") {
    Plan p = plan(cuda_env("expandable_segments:False"), "expandable_segments:False");
    CHECK(p.action == PlanAction::None);
    CHECK(p.reason == "the overrides are already in effect");
  }
  SECTION("an override may repair a value PyTorch would reject") {
    Plan p = plan(cuda_env("max_split_size_mb:1,expandable_segments:True"), "max_split_size_mb:64");
    CHECK(p.before.cls == OutcomeClass::Exception);
    REQUIRE(p.action == PlanAction::Write);
    CHECK(p.writes[0].new_value == "max_split_size_mb:64,expandable_segments:True");
    CHECK(has_problem(p.problems, Severity::Error, "max_split_size_mb too small"));
  }
}

// ---- property test

namespace {

struct Gen {
  std::mt19937 rng;
  explicit Gen(unsigned seed) : rng(seed) {}
  std::size_t pick(std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  }
  bool coin(int percent) { return static_cast<int>(pick(100)) < percent; }
  std::string any(std::initializer_list<const char *> xs) {
    return *(xs.begin() + static_cast<std::ptrdiff_t>(pick(xs.size())));
  }

  // A valid value for the key; bounds chosen so every combination stays valid (max_split >= 64 >=
  // large_segment).
  std::string value(Key k) {
    switch (k) {
      case Key::LargeSegmentSizeMb:
        return std::to_string(11 + pick(54));
      case Key::MaxSplitSizeMb:
      case Key::MaxNonSplitRoundingMb:
        return std::to_string(64 + pick(4000));
      case Key::GarbageCollectionThreshold:
        return any({"0.5", "0.8", "0.25", "0.999"});
      case Key::RoundupPower2Divisions:
        return any({"4", "8", "1", "[256:1,512:2,>:4]", "[1:2, 64:4]", "[>:8]", "[2:4,1024:0,>:16]",
                    "[ 64 : 8 , > : 2 ]"});
      case Key::Backend:
        return "native";
      case Key::PinnedNumRegisterThreads:
        return any({"1", "2", "8", "128"});
      case Key::PinnedReserveSegmentSizeMb:
        return any({"1", "64", "1024"});
      case Key::PerProcessMemoryFraction:
        return any({"0.5", "1.0", "0", "0.125"});
      default:
        return any({"True", "False"});
    }
  }
  // A key of the 2.11 grammar the vectors are measured with (the table has keys of other releases).
  Key key() {
    for (;;)
      if (const Key k = static_cast<Key>(pick(kKeyCount)); default_grammar().knows(k)) return k;
  }
  std::string name(Key k) {
    const KeyInfo &i = key_info(k);
    return !i.alias.empty() && coin(20) ? std::string(i.alias) : std::string(i.name);
  }
  std::string spaces() { return coin(70) ? "" : any({" ", "  ", "\t", " \n"}); }
  // Occasionally split a word with a space (PyTorch drops it).
  std::string word(std::string w) {
    if (w.size() > 2 && coin(15)) w.insert(1 + pick(w.size() - 2), " ");
    return w;
  }
  std::string config() {
    std::string s = spaces();
    const std::size_t n = pick(7);
    for (std::size_t i = 0; i < n; ++i) {
      Key k = key();
      if (i) s += "," + spaces();
      s += word(name(k)) + spaces() + ":" + spaces() + value(k) + spaces();
    }
    if (n && coin(25)) s += "," + spaces();
    return s;
  }
};

void require_same_except(const Outcome &a, const Outcome &b, std::optional<Key> except) {
  for (const KeyInfo &k : keys()) {
    if (except && k.key == *except) continue;
    INFO("key " << k.name);
    CHECK(effective_text(a.settings, k.key) == effective_text(b.settings, k.key));
  }
}

}  // namespace

TEST_CASE("property: merge round-trips and changes only the overridden key",
          "[torchconf][property]") {
  Gen g(20260511);
  for (int iter = 0; iter < 1500; ++iter) {
    const std::string s = g.config();
    INFO("original: '" << s << "'");
    REQUIRE(merge(s, "").value == s);
    const Outcome before = cuda(s);
    REQUIRE_OK(before);

    const Key k = g.key();
    const std::string v = g.value(k);
    const std::string ov = g.name(k) + ":" + v;
    INFO("override: '" << ov << "'");
    MergeResult m = merge(s, ov);
    REQUIRE(m.ok());
    const Outcome after = cuda(m.value);
    REQUIRE_OK(after);
    require_same_except(before, after, k);
    // the key has the value the override alone gives it
    const Outcome alone =
        cuda("large_segment_size_mb:" + std::to_string(after.settings.large_segment_size >> 20) +
             "," + ov);
    REQUIRE_OK(alone);
    CHECK(effective_text(after.settings, k) == effective_text(alone.settings, k));
    // the plan writes the same text
    Plan p = plan(cuda_env(s), ov);
    REQUIRE(p.action != PlanAction::Refuse);
    if (p.action == PlanAction::Write) CHECK(p.writes.at(0).new_value == m.value);

    // removal: the key is back to its default, the others unchanged
    MergeResult r = merge(s, "-" + std::string(key_info(k).name));
    REQUIRE(r.ok());
    const Outcome removed = cuda(r.value);
    REQUIRE_OK(removed);
    require_same_except(before, removed, k);
    CHECK(effective_text(removed.settings, k) == effective_text(Settings{}, k));
    CHECK(tokenize(r.value) == tokenize(merge(r.value, "-" + std::string(key_info(k).name)).value));
  }
}
TEST_CASE("property: arbitrary token soup never breaks the model", "[torchconf][property]") {
  Gen g(77);
  const std::vector<std::string> atoms = {",",
                                          ":",
                                          "[",
                                          "]",
                                          " ",
                                          "-",
                                          ">",
                                          "1",
                                          "0.5",
                                          "True",
                                          "true",
                                          "256",
                                          "native",
                                          "cudaMallocAsync",
                                          "expandable_segments",
                                          "max_split_size_mb",
                                          "backend",
                                          "roundup_power2_divisions",
                                          "large_segment_size_mb",
                                          "x"};
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    for (std::size_t n = g.pick(12); n > 0; --n) s += atoms[g.pick(atoms.size())];
    INFO("'" << s << "'");
    for (Var v : kVars) {
      Env e;
      e.get(v) = s;
      Outcome o = evaluate(e);
      if (!o.deferred) CHECK((o.cls == OutcomeClass::Ok) == !o.error.has_value());
      if (o.deferred) CHECK(o.cls == OutcomeClass::Ok);
      CHECK_NOTHROW(diagnose(e, o));
      if (o.cls == OutcomeClass::ImportAbort) CHECK(v != Var::Hip);  // L never reads HIP here
      Plan p = plan(e, "expandable_segments:False,-max_split_size_mb");
      if (p.action == PlanAction::Write) {
        REQUIRE(p.after);
        CHECK(p.after->cls == OutcomeClass::Ok);
        CHECK_FALSE(p.after->error);
        CHECK_FALSE(p.after->settings.expandable_segments);
        CHECK(p.after->settings.max_split_size == UINT64_MAX);
        CHECK(evaluate(apply(e, p)).settings == p.after->settings);
      }
    }
    CHECK(merge(s, "").value == s);
    MergeResult m = merge(s, "expandable_segments:False");
    if (!m.ok()) CHECK(m.value == s);
  }
}
