// SPDX-License-Identifier: Apache-2.0
// The vocabulary of the PyTorch allocator-config model: the three variables and which one each
// parser reads (precedence, reference §2), the key table with owners, units and defaults (§4), the
// effective values as Python prints them, and the names of errors and outcomes (§7).
#include <string>

#include "torch_conf_impl.h"

namespace cmg::torchconf {
using namespace impl;
namespace {

const std::array<KeyInfo, kKeyCount> kKeys = {{
    {Key::LargeSegmentSizeMb, "large_segment_size_mb", "", Parser::Accel, ValueKind::SizeMb,
     "large_segment_size", false, "bytes",
     "size of a large segment in MiB (> 10); also the lower bound of max_split_size_mb and "
     "max_non_split_rounding_mb; read before the other keys"},
    {Key::MaxSplitSizeMb, "max_split_size_mb", "", Parser::Accel, ValueKind::SizeMb,
     "max_split_size", true, "bytes",
     "blocks larger than this (MiB, >= large_segment_size_mb) are not split; snapshot shows -1 "
     "for unlimited"},
    {Key::MaxNonSplitRoundingMb, "max_non_split_rounding_mb", "", Parser::Accel, ValueKind::SizeMb,
     "max_non_split_rounding_size", false, "bytes",
     "how much larger a cached non-split block may be than the request (MiB)"},
    {Key::GarbageCollectionThreshold, "garbage_collection_threshold", "", Parser::Accel,
     ValueKind::Double, "garbage_collection_threshold", true, "",
     "reclaim cached blocks above this fraction of the memory limit; open interval (0, 1)"},
    {Key::RoundupPower2Divisions, "roundup_power2_divisions", "", Parser::Accel,
     ValueKind::Divisions, "roundup_power2_divisions", true, "",
     "divisions per power-of-two interval for rounding request sizes: N, or [MiB:N,...,>:N]"},
    {Key::ExpandableSegments, "expandable_segments", "", Parser::Accel, ValueKind::Bool,
     "expandable_segments", true, "",
     "allocate segments with the VMM API so they can grow (True/False)"},
    {Key::PinnedUseBackgroundThreads, "pinned_use_background_threads", "", Parser::Accel,
     ValueKind::Bool, "pinned_use_background_threads", false, "",
     "process pinned-memory events on a background thread (True/False)"},
    {Key::Backend, "backend", "", Parser::Cuda, ValueKind::Backend, "backend", false, "",
     "native or cudaMallocAsync; chosen at import (parser L) and checked again at runtime"},
    {Key::ReleaseLockOnCudamalloc, "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
     Parser::Cuda, ValueKind::Bool, "release_lock_on_cudamalloc", true, "",
     "release the allocator lock around cudaMalloc (True/False)"},
    {Key::PinnedUseCudaHostRegister, "pinned_use_cuda_host_register",
     "pinned_use_hip_host_register", Parser::Cuda, ValueKind::Bool, "pinned_use_cuda_host_register",
     true, "", "pinned memory via malloc + cudaHostRegister instead of cudaHostAlloc (True/False)"},
    {Key::PinnedNumRegisterThreads, "pinned_num_register_threads", "", Parser::Cuda,
     ValueKind::Count, "pinned_num_register_threads", true, "",
     "threads used by cudaHostRegister (power of 2, <= 128)"},
    {Key::PinnedReserveSegmentSizeMb, "pinned_reserve_segment_size_mb", "", Parser::Cuda,
     ValueKind::Count, "pinned_reserve_segment_size_mb", false, "MiB",
     "pinned memory reserved up front (MiB, > 0)"},
    {Key::GraphCaptureRecordStreamReuse, "graph_capture_record_stream_reuse", "", Parser::Cuda,
     ValueKind::Bool, "graph_capture_record_stream_reuse", true, "",
     "reuse blocks freed with record_stream during graph capture (True/False)"},
    {Key::PerProcessMemoryFraction, "per_process_memory_fraction", "", Parser::Cuda,
     ValueKind::Double, "per_process_memory_fraction", false, "",
     "fraction of device memory this process may use; closed interval [0, 1]"},
}};

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
  static const std::optional<std::string> none;
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

// Reference §2: CUDA -> (HIP, parser A only on a CUDA build) -> ALLOC; a present variable wins even
// when empty, and nothing is merged.
Read reader(Parser p, const Env &env) {
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
