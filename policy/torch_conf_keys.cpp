// SPDX-License-Identifier: Apache-2.0
// The vocabulary of the PyTorch allocator-config model: the three variables and which one each
// parser reads (precedence, reference §2), the key table with owners, units and defaults (§4), the
// effective values as Python prints them, and the names of errors and outcomes (§7).
#include <cstdlib>
#include <string>

#include "torch_conf_impl.h"

namespace cmg::torchconf {
using namespace impl;
namespace {

// clang-format off
constexpr std::array<KeyInfo, kKeyCount> kKeys = {{
#define TORCH_KEY(e, name, alias, owner, kind, setting, snap, unit, first, last, source, help) \
  {Key::e, name, alias, Parser::owner, ValueKind::kind, setting, snap, unit, first, last, source, \
   help},
#include "torch_releases.def"
#undef TORCH_KEY
}};
// clang-format on

constexpr std::string_view kLegacySource =
    "the legacy CUDAAllocatorConfig.cpp (lexArgs, consumeToken) as stored from a 2.2-era tree";
constexpr std::string_view kLegacyNotModelled =
    "message texts are those of that stored source; other legacy releases may word them "
    "differently";

constexpr Grammar kGrammars[] = {
#define TORCH_RELEASE(version, family, prepass, reset, accel, released, source, not_modelled) \
  {version, Family::family, prepass, reset, accel, released, source, not_modelled},
#include "torch_releases.def"
#undef TORCH_RELEASE
};

const Grammar &row(std::string_view release) {
  for (const Grammar &g : kGrammars)
    if (g.release == release) return g;
  std::abort();  // a literal of this file names a row that the table lacks
}

}  // namespace

// ---- public: environment and readers

std::string_view var_name(Var v) {
  switch (v) {
    case Var::Cuda:
      return "PYTORCH_CUDA_ALLOC_CONF";
    case Var::Hip:
      return "PYTORCH_HIP_ALLOC_CONF";
    case Var::Alloc:
      return "PYTORCH_ALLOC_CONF";
    case Var::None:
      break;
  }
  return "";
}

const std::optional<std::string> &Env::get(Var v) const {
  // Never destroyed: no exit handler is registered for it (glibc frees its own list of them at
  // exit on the exiting thread once there are more than 32, and the shim reads this at load).
  static const std::optional<std::string> &none = *new std::optional<std::string>;
  switch (v) {
    case Var::Cuda:
      return cuda;
    case Var::Hip:
      return hip;
    case Var::Alloc:
      return alloc;
    case Var::None:
      break;
  }
  return none;
}

std::optional<std::string> &Env::get(Var v) {
  switch (v) {
    case Var::Hip:
      return hip;
    case Var::Alloc:
      return alloc;
    default:
      return cuda;
  }
}

Env Env::from_lookup(const std::function<std::optional<std::string>(std::string_view)> &get) {
  Env e;
  for (Var v : kVars) e.get(v) = get(var_name(v));
  e.no_caching = get(kNoCachingVar);
  e.expandable_ipc = get(kExpandableIpcVar);
  return e;
}

Env Env::from_envp(char *const *envp) {
  Env e;
  for (char *const *p = envp; p && *p; ++p) {
    std::string_view kv(*p);
    const std::size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    for (Var v : kVars)
      if (kv.substr(0, eq) == var_name(v)) e.get(v) = std::string(kv.substr(eq + 1));
    if (kv.substr(0, eq) == kNoCachingVar) e.no_caching = std::string(kv.substr(eq + 1));
    if (kv.substr(0, eq) == kExpandableIpcVar) e.expandable_ipc = std::string(kv.substr(eq + 1));
  }
  return e;
}

std::string_view parser_name(Parser p) {
  switch (p) {
    case Parser::Load:
      return "L";
    case Parser::Cuda:
      return "C";
    case Parser::Accel:
      return "A";
  }
  return "?";
}

std::string_view parser_title(Parser p) {
  switch (p) {
    case Parser::Load:
      return "backend at import (BackendStaticInitializer)";
    case Parser::Cuda:
      return "CUDA keys at the first allocation (CUDAAllocatorConfig)";
    case Parser::Accel:
      return "common keys at the first allocation (AcceleratorAllocatorConfig)";
  }
  return "?";
}

Read reader(Parser p, const Env &env) {
  return reader(p, env, default_grammar());
}

// Reference §2: CUDA -> (HIP, parser A only on a CUDA build) -> ALLOC; a present variable wins even
// when empty, and nothing is merged. The legacy parser reads PYTORCH_CUDA_ALLOC_CONF only
// (CUDAAllocatorConfig::instance() before the split: getenv("PYTORCH_CUDA_ALLOC_CONF")).
Read reader(Parser p, const Env &env, const Grammar &g) {
  if (g.family == Family::Legacy) {
    // Said, not listed as if it read something (config printed "A ... no variable set").
    if (p == Parser::Accel)
      return {Var::None, "none in this release: parser A came with 2.8; before, C parses every key"};
    if (env.cuda)
      return {Var::Cuda, "PYTORCH_CUDA_ALLOC_CONF is the only variable this release reads"};
    return {Var::None, env.alloc || env.hip
                           ? "this release reads only PYTORCH_CUDA_ALLOC_CONF, which is not set: "
                             "defaults"
                           : "no variable this parser reads is set: defaults"};
  }
  if (env.cuda)
    return {Var::Cuda,
            env.cuda->empty()
                ? "PYTORCH_CUDA_ALLOC_CONF is set (empty, which still counts) and is read first"
                : "PYTORCH_CUDA_ALLOC_CONF is set and is read first"};
  if (p == Parser::Accel && env.hip)
    return {Var::Hip,
            "PYTORCH_CUDA_ALLOC_CONF is not set; this parser reads PYTORCH_HIP_ALLOC_CONF next, "
            "even on a CUDA build"};
  if (env.alloc)
    return {Var::Alloc,
            p == Parser::Accel
                ? "neither PYTORCH_CUDA_ALLOC_CONF nor PYTORCH_HIP_ALLOC_CONF is set"
                : (env.hip ? "PYTORCH_CUDA_ALLOC_CONF is not set; PYTORCH_HIP_ALLOC_CONF "
                             "is read only by ROCm builds here"
                           : "PYTORCH_CUDA_ALLOC_CONF is not set")};
  return {Var::None,
          p == Parser::Accel || !env.hip
              ? "no variable this parser reads is set: defaults"
              : "no variable this parser reads is set (PYTORCH_HIP_ALLOC_CONF is read only "
                "by ROCm builds here): defaults"};
}

// ---- public: keys

std::span<const KeyInfo> keys() {
  return kKeys;
}
const KeyInfo &key_info(Key k) {
  return kKeys[key_slot(k)];
}

std::optional<Key> find_key(std::string_view name) {
  for (const KeyInfo &k : kKeys)
    if (k.name == name || (!k.alias.empty() && k.alias == name)) return k.key;
  return std::nullopt;
}

std::optional<Key> find_key(std::string_view name, const Grammar &g) {
  std::optional<Key> k = find_key(name);
  if (k && !g.knows(*k)) return std::nullopt;
  return k;
}

// ---- public: releases

TorchVersion Grammar::version() const {
  return torch_version(release);
}

bool Grammar::knows(Key k) const {
  const KeyInfo &i = key_info(k);
  const TorchVersion v = version();
  return v >= torch_version(i.first) && (i.last.empty() || v <= torch_version(i.last));
}

std::string_view Grammar::setter_name() const {
  return accelerator_setter ? "torch._C._accelerator_setAllocatorSettings"
                            : "torch.cuda.memory._set_allocator_settings";
}

std::span<const Grammar> grammars() {
  return kGrammars;
}

const Grammar &default_grammar() {
  return row("2.11");
}

const Grammar &newest_grammar() {
  return kGrammars[std::size(kGrammars) - 1];
}

Grammar grammar_for(const TorchVersion &v) {
  const TorchVersion release{v.major, v.minor, 0, ""};
  if (release < kGrammars[0].version()) {
    Grammar g = kGrammars[0];
    g.fit = Fit::Older;
    return g;
  }
  for (const Grammar &g : kGrammars)
    if (g.version() == release) return g;
  Grammar g = newest_grammar();
  g.fit = Fit::Newer;
  g.opaque_unknown = true;
  return g;
}

std::string_view backend_name(Backend b) {
  return b == Backend::Native ? "native" : kAsyncToken;
}

std::int64_t snapshot_max_split_size(const Settings &s) {
  return static_cast<std::int64_t>(s.max_split_size);
}

std::string effective_text(const Settings &s, Key k) {
  switch (k) {
    case Key::LargeSegmentSizeMb:
      return std::to_string(s.large_segment_size);
    case Key::MaxSplitSizeMb:
      return std::to_string(snapshot_max_split_size(s));
    case Key::MaxNonSplitRoundingMb:
      return std::to_string(s.max_non_split_rounding_size);
    case Key::GarbageCollectionThreshold:
      return py_float(s.garbage_collection_threshold);
    case Key::RoundupPower2Divisions: {
      std::string r = "[";
      for (std::size_t i = 0; i < s.roundup_power2_divisions.size(); ++i) {
        if (i) r += ", ";
        r += std::to_string(s.roundup_power2_divisions[i]);
      }
      return r + "]";
    }
    case Key::ExpandableSegments:
      return py_bool(s.expandable_segments);
    case Key::PinnedUseBackgroundThreads:
      return py_bool(s.pinned_use_background_threads);
    case Key::Backend:
      return std::string(backend_name(s.backend));
    case Key::ReleaseLockOnCudamalloc:
      return py_bool(s.release_lock_on_cudamalloc);
    case Key::PinnedUseCudaHostRegister:
      return py_bool(s.pinned_use_cuda_host_register);
    case Key::PinnedNumRegisterThreads:
      return std::to_string(s.pinned_num_register_threads);
    case Key::PinnedReserveSegmentSizeMb:
      return std::to_string(s.pinned_reserve_segment_size_mb);
    case Key::GraphCaptureRecordStreamReuse:
      return py_bool(s.graph_capture_record_stream_reuse);
    case Key::PerProcessMemoryFraction:
      return py_float(s.per_process_memory_fraction);
    case Key::ThrowOnCudamallocOom:
      return py_bool(s.throw_on_cudamalloc_oom);
    case Key::PinnedFreeCatchAll:
      return py_bool(s.pinned_free_catch_all);
    case Key::ExpandableSegmentsReserve:
      return s.expandable_segments_reserve.empty() ? "default" : s.expandable_segments_reserve;
    case Key::ExpandableSegmentsReserveByClass:
      return s.expandable_segments_reserve_by_class.empty()
                 ? "[]"
                 : s.expandable_segments_reserve_by_class;
    case Key::RoundupBypassThresholdMb:
      return std::to_string(s.roundup_bypass_threshold);
  }
  return "";
}

// ---- public: errors and outcomes

std::string_view error_type_name(ErrorType t) {
  return t == ErrorType::ValueError ? "ValueError" : "RuntimeError";
}

std::string TorchError::what() const {
  if (!internal_assert) return message;
  std::string r = assert_condition.empty() ? "…" : assert_condition;
  r += " INTERNAL ASSERT FAILED at ";
  r += assert_site.empty() ? "…" : assert_site;
  r += ", please report a bug to PyTorch. ";
  r += message;
  return r;
}

std::string TorchError::python() const {
  std::string r(error_type_name(type));
  r += ": ";
  r += what();
  return r;
}

std::string_view outcome_name(OutcomeClass c) {
  switch (c) {
    case OutcomeClass::Ok:
      return "ok";
    case OutcomeClass::Exception:
      return "exception";
    case OutcomeClass::ImportAbort:
      return "import-abort";
  }
  return "?";
}

const Read &Outcome::read(Parser p) const {
  return p == Parser::Load ? load : p == Parser::Cuda ? cuda : accel;
}
}  // namespace cmg::torchconf
