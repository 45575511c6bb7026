// SPDX-License-Identifier: Apache-2.0
// PyTorch allocator-config model, its parsers transliterated token by token from c10's sources.
// Following c10/core/AllocatorConfig.h/.cpp and c10/cuda/CUDAAllocatorConfig.h/.cpp call by call
// is what makes every quirk (ignored separators, stoull/stod, skipKey running off the end) give
// torch's own result.
#include "torch_conf.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <map>
#include <stdexcept>
#include <utility>

#include "options.h"

namespace cmg::torchconf {
namespace {

// Constants of c10 (CachingAllocator.h / AllocatorConfig.h).
constexpr std::uint64_t kMB = 1ull << 20;
constexpr std::uint64_t kMinLargeAllocMb = 10;      // kMinLargeAlloc / kMB
constexpr std::uint64_t kMaxRegisterThreads = 128;  // pinned_max_register_threads(), header L89-94

constexpr std::string_view kAsyncToken = "cudaMallocAsync";

// ---- c10 errors as C++ exceptions inside this file only (never leave the public functions)

struct Raised {
  TorchError e;
};

[[noreturn]] void raise_value(std::string msg) {
  throw Raised{TorchError{ErrorType::ValueError, std::move(msg), false, {}, {}}};
}

// std::stoull / std::stod failures reach Python as RuntimeError with what() = "stoull" / "stod".
[[noreturn]] void raise_runtime(std::string msg) {
  throw Raised{TorchError{ErrorType::RuntimeError, std::move(msg), false, {}, {}}};
}

// ConfigTokenizer::checkIndex, the assert seen as "…AllocatorConfig.h":124 in the [I] abort (§7).
[[noreturn]] void raise_index() {
  throw Raised{TorchError{ErrorType::RuntimeError, "Index out of bounds in ConfigTokenizer", true,
                          "i < config_.size()", "\"/pytorch/c10/core/AllocatorConfig.h\":124"}};
}

// skipKey and the roundup list parser assert on an unterminated '['; their line is not recorded.
[[noreturn]] void raise_bracket(std::string_view file) {
  throw Raised{
      TorchError{ErrorType::RuntimeError,
                 "Expected closing bracket ']' in ConfigTokenizer but reached end of config", true,
                 "", std::string(file)}};
}

// Vector S6: the runtime backend must equal the allocator chosen at load time by parser L (torch
// 2.11 prints the condition "tokenizer[i] == get()->name()").
[[noreturn]] void raise_backend_mismatch(Backend runtime, Backend load) {
  std::string msg =
      "Allocator backend parsed at runtime != allocator backend parsed at load time, ";
  msg.append(backend_name(runtime));
  msg += " != ";
  msg.append(backend_name(load));
  throw Raised{TorchError{ErrorType::RuntimeError, std::move(msg), true,
                          "tokenizer[i] == get()->name()",
                          "\"/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":44"}};
}

bool is_space(char c) {
  return std::isspace(static_cast<unsigned char>(c)) != 0;
}

// llvm::isPowerOf2_64: 0 is not a power of 2.
bool is_power_of_2(std::uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

std::string quote(std::string_view s) {
  std::string r = "'";
  r.append(s);
  r += '\'';
  return r;
}

// ---- ConfigTokenizer

class Tokenizer {
 public:
  explicit Tokenizer(std::string_view s) : t_(tokenize(s)) {}
  std::size_t size() const { return t_.size(); }
  const std::string &operator[](std::size_t i) const {
    check(i);
    return t_[i];
  }
  // The result is ignored by every caller in PyTorch (§3): only the bound is checked.
  bool checkToken(std::size_t i, std::string_view tok) const {
    check(i);
    return t_[i] == tok;
  }
  std::uint64_t toSizeT(std::size_t i) const {
    check(i);
    try {
      return std::stoull(t_[i]);  // the same libstdc++ call: sign, trailing garbage, ERANGE
    } catch (const std::exception &e) {
      raise_runtime(e.what());
    }
  }
  double toDouble(std::size_t i) const {
    check(i);
    try {
      return std::stod(t_[i]);
    } catch (const std::exception &e) {
      raise_runtime(e.what());
    }
  }
  bool toBool(std::size_t i) const {  // L80-98
    check(i);
    if (t_[i] == "True") return true;
    if (t_[i] == "False") return false;
    raise_value("Expected 'True' or 'False' at index " + std::to_string(i) +
                " in ConfigTokenizer but got '" + t_[i] + "'");
  }
  // Returns the index of the value, or of the ']' closing a list value.
  std::size_t skipKey(std::size_t i) const {
    checkToken(++i, ":");
    ++i;
    check(i);
    if (t_[i] != "[") return i;
    while (++i < t_.size() && t_[i] != "]") {
    }
    if (i >= t_.size()) raise_bracket("\"/pytorch/c10/core/AllocatorConfig.h\":…");
    return i;
  }

 private:
  void check(std::size_t i) const {
    if (i >= t_.size()) raise_index();
  }
  std::vector<std::string> t_;
};

// ---- parse state

std::size_t key_slot(Key k) {
  return static_cast<std::size_t>(k);
}

struct Ctx {
  Settings *s;
  std::array<bool, kKeyCount> set{};  // keys assigned by this parse
  std::size_t key_index = 0;          // key being parsed (for diagnostics)
  std::vector<std::string> *warnings = nullptr;
  void mark(Key k) { set[key_slot(k)] = true; }
};

// ---- parser A: AcceleratorAllocatorConfig

std::size_t a_large_segment(const Tokenizer &t, std::size_t i, Ctx &c) {
  t.checkToken(++i, ":");
  std::uint64_t v = t.toSizeT(++i);
  if (!(v > kMinLargeAllocMb))
    raise_value("CachingAllocator option large_segment_size_mb must be > " +
                std::to_string(kMinLargeAllocMb) + " MB");
  v = std::min(v, UINT64_MAX / kMB);
  c.s->large_segment_size = v * kMB;
  c.mark(Key::LargeSegmentSizeMb);
  return i;
}

// max_split_size_mb and max_non_split_rounding_mb share the bound large_segment_size/MB (vector 40)
// and the clamp to SIZE_MAX/MB, so "-1" (stoull wraps it) ends as (SIZE_MAX/MB)*MB, not SIZE_MAX.
std::size_t a_split_size(const Tokenizer &t, std::size_t i, Ctx &c, Key k) {
  const bool split = k == Key::MaxSplitSizeMb;
  t.checkToken(++i, ":");
  const std::uint64_t min_mb = c.s->large_segment_size / kMB;
  std::uint64_t v = t.toSizeT(++i);
  if (!(v >= min_mb))
    raise_value(std::string("CachingAllocator option ") +
                (split ? "max_split_size_mb" : "max_non_split_rounding_mb") +
                " too small, must be >= " + std::to_string(min_mb));
  v = std::min(v, UINT64_MAX / kMB);
  (split ? c.s->max_split_size : c.s->max_non_split_rounding_size) = v * kMB;
  c.mark(k);
  return i;
}

std::size_t a_gc_threshold(const Tokenizer &t, std::size_t i, Ctx &c) {
  t.checkToken(++i, ":");
  double v = t.toDouble(++i);
  if (!(v > 0 && v < 1.0))  // open interval; NaN fails too
    raise_value("garbage_collect_threshold is invalid, set it in (0.0, 1.0)");
  c.s->garbage_collection_threshold = v;
  c.mark(Key::GarbageCollectionThreshold);
  return i;
}

// Reference §4 list semantics: first numeric entry also fills [0, idx); gaps keep the value of the
// reset (0); ">" fills (last_idx, 15] with last_idx starting at 0.
std::size_t a_roundup(const Tokenizer &t, std::size_t i, Ctx &c) {
  auto &div = c.s->roundup_power2_divisions;
  t.checkToken(++i, ":");
  bool first_value = true;
  if (t[++i] == "[") {
    std::size_t last_index = 0;
    while (++i < t.size() && t[i] != "]") {
      const std::size_t value_index = i;
      t.checkToken(++i, ":");
      const std::uint64_t value = t.toSizeT(++i);
      if (!(value == 0 || is_power_of_2(value)))
        raise_value("For roundups, the divisions has to be power of 2 or 0 to disable roundup ");
      if (t[value_index] == ">") {
        std::fill(div.begin() + static_cast<std::ptrdiff_t>(std::min(last_index + 1, div.size())),
                  div.end(), value);
      } else {
        const std::uint64_t boundary = t.toSizeT(value_index);
        if (!is_power_of_2(boundary))
          raise_value("For roundups, the intervals have to be power of 2 ");
        std::size_t index = static_cast<std::size_t>(63 - std::countl_zero(boundary));
        index = std::clamp(index, std::size_t{0}, div.size() - 1);
        if (first_value) {
          std::fill(div.begin(), div.begin() + static_cast<std::ptrdiff_t>(index), value);
          first_value = false;
        }
        div[index] = value;
        last_index = index;
      }
      if (t[i + 1] != "]") t.checkToken(++i, ",");
    }
    if (!(i < t.size())) raise_bracket("\"/pytorch/c10/core/AllocatorConfig.cpp\":…");
  } else {  // a single number: every interval (kept for backwards compatibility in PyTorch)
    const std::uint64_t value = t.toSizeT(i);
    if (!is_power_of_2(value)) raise_value("For roundups, the divisions has to be power of 2 ");
    div.fill(value);
  }
  c.mark(Key::RoundupPower2Divisions);
  return i;
}

std::size_t a_bool(const Tokenizer &t, std::size_t i, Ctx &c, Key k) {
  t.checkToken(++i, ":");
  bool v = t.toBool(++i);
  (k == Key::ExpandableSegments ? c.s->expandable_segments : c.s->pinned_use_background_threads) =
      v;
  c.mark(k);
  return i;
}

// One item of an A-owned key (large_segment_size_mb included: the main loop skips it, see below).
std::size_t a_known_item(const Tokenizer &t, std::size_t i, Ctx &c, Key k) {
  switch (k) {
    case Key::LargeSegmentSizeMb:
      return a_large_segment(t, i, c);
    case Key::MaxSplitSizeMb:
    case Key::MaxNonSplitRoundingMb:
      return a_split_size(t, i, c, k);
    case Key::GarbageCollectionThreshold:
      return a_gc_threshold(t, i, c);
    case Key::RoundupPower2Divisions:
      return a_roundup(t, i, c);
    case Key::ExpandableSegments:
    case Key::PinnedUseBackgroundThreads:
      return a_bool(t, i, c, k);
    default:
      return t.skipKey(i);
  }
}

bool a_owns(Key k) {
  return key_info(k).owner == Parser::Accel;
}

// A::parseArgs (reference §5): resets, records the string before validating, pre-pass for
// large_segment_size_mb, then the items in order.
void a_parse_args(std::string_view env, Ctx &c) {
  Settings &s = *c.s;
  s.max_split_size = UINT64_MAX;
  s.roundup_power2_divisions.fill(0);
  s.garbage_collection_threshold = 0;
  // PR #172056: reset to the large segment size in effect when the parse starts (before the
  // pre-pass below). Not observable through the snapshot.
  s.max_non_split_rounding_size = s.large_segment_size;
  s.last_allocator_settings.assign(env);

  const Tokenizer t(env);
  // Decision: the pre-pass scans every token for the key (last occurrence wins, each one
  // validated), and the main loop then skips the item, so
  // max_split_size_mb/max_non_split_rounding_mb are checked against the final large segment size
  // wherever the keys appear (vector 40).
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (t[i] == "large_segment_size_mb") {
      c.key_index = i;
      i = a_large_segment(t, i, c);
    }
  }
  for (std::size_t i = 0; i < t.size(); ++i) {
    c.key_index = i;
    const std::string &key = t[i];
    std::optional<Key> k = find_key(key);
    if (k && a_owns(*k) && *k != Key::LargeSegmentSizeMb) {
      i = a_known_item(t, i, c, *k);
    } else {
      // The CUDA hook is registered at static init, so A checks the union of both key sets.
      if (!k) raise_value("Unrecognized key '" + key + "' in Accelerator allocator config.");
      i = t.skipKey(i);
    }
    if (i + 1 < t.size()) t.checkToken(++i, ",");
  }
}

// ---- parser C: CUDAAllocatorConfig

// parseAllocatorConfig: value check first, then the comparison with the load-time backend
// (m_is_allocator_loaded is true for every runtime parse: the allocator was chosen by L at import).
std::size_t c_backend(const Tokenizer &t, std::size_t i, Ctx &c, std::optional<Backend> loaded) {
  t.checkToken(++i, ":");
  ++i;
  const std::string &v = t[i];
  if (!(v == "native" || v == kAsyncToken))
    raise_value("Unknown allocator backend, options are native and cudaMallocAsync");
  const Backend b = v == "native" ? Backend::Native : Backend::CudaMallocAsync;
  if (loaded && b != *loaded) raise_backend_mismatch(b, *loaded);
  c.s->backend = b;
  c.mark(Key::Backend);
  return i;
}

std::size_t c_known_item(const Tokenizer &t, std::size_t i, Ctx &c, Key k,
                         std::optional<Backend> loaded) {
  Settings &s = *c.s;
  switch (k) {
    case Key::Backend:
      return c_backend(t, i, c, loaded);
    case Key::ReleaseLockOnCudamalloc:
    case Key::PinnedUseCudaHostRegister:
    case Key::GraphCaptureRecordStreamReuse: {
      t.checkToken(++i, ":");
      bool v = t.toBool(++i);
      (k == Key::ReleaseLockOnCudamalloc     ? s.release_lock_on_cudamalloc
       : k == Key::PinnedUseCudaHostRegister ? s.pinned_use_cuda_host_register
                                             : s.graph_capture_record_stream_reuse) = v;
      break;
    }
    case Key::PinnedNumRegisterThreads: {
      t.checkToken(++i, ":");
      std::uint64_t v = t.toSizeT(++i);
      if (!is_power_of_2(v))
        raise_value("Number of register threads has to be power of 2, got " + std::to_string(v));
      if (!(v <= kMaxRegisterThreads))
        raise_value("Number of register threads should be less than or equal to " +
                    std::to_string(kMaxRegisterThreads) + ", got " + std::to_string(v));
      s.pinned_num_register_threads = v;
      break;
    }
    case Key::PinnedReserveSegmentSizeMb: {
      t.checkToken(++i, ":");
      std::uint64_t v = t.toSizeT(++i);
      if (!(v > 0)) raise_value("Pinned reserve segment size has to be greater than 0");
      s.pinned_reserve_segment_size_mb = v;
      break;
    }
    case Key::PerProcessMemoryFraction: {
      t.checkToken(++i, ":");
      double v = t.toDouble(++i);
      if (!(v >= 0.0 && v <= 1.0))  // closed interval
        raise_value("per_process_memory_fraction is invalid, set it in [0.0, 1.0]");
      s.per_process_memory_fraction = v;
      break;
    }
    default:
      return t.skipKey(i);
  }
  c.mark(k);
  return i;
}

// C::parseArgs: no reset; other parsers' keys skipped; unknown keys raise.
void c_parse_args(std::string_view env, Ctx &c, std::optional<Backend> loaded) {
  // Decision: every C-owned key except backend counts as a "native specific option" for the
  // warning; the reference only says the warning fires for C-owned native options (§4).
  bool native_specific = false;
  const Tokenizer t(env);
  for (std::size_t i = 0; i < t.size(); ++i) {
    c.key_index = i;
    const std::string &key = t[i];
    std::optional<Key> k = find_key(key);
    if (k && !a_owns(*k)) {
      i = c_known_item(t, i, c, *k, loaded);
      if (*k != Key::Backend) native_specific = true;
    } else {
      if (!k) raise_value("Unrecognized key '" + key + "' in CUDA allocator config.");
      i = t.skipKey(i);
    }
    if (i + 1 < t.size()) t.checkToken(++i, ",");
  }
  if (c.s->backend == Backend::CudaMallocAsync && native_specific && c.warnings)
    c.warnings->push_back(
        "Warning: backend:cudaMallocAsync ignores max_split_size_mb,roundup_power2_divisions, and "
        "garbage_collect_threshold. (function parseArgs)");
}

// ---- parser L: BackendStaticInitializer::parseEnvForBackend

// Decision: the first `backend` key decides and ends the scan (PyTorch returns the async allocator
// or breaks there, deferring checks to C); every earlier key is walked with skipKey, so a
// structural error before it aborts the import.
Backend l_parse(std::string_view env, Ctx &c) {
  const Tokenizer t(env);
  for (std::size_t i = 0; i < t.size(); ++i) {
    c.key_index = i;
    if (t[i] == "backend") {
      c.mark(Key::Backend);  // the allocator in use comes from here (get_allocator_backend())
      t.checkToken(++i, ":");
      ++i;
      if (t[i] == kAsyncToken) return Backend::CudaMallocAsync;
      break;
    }
    i = t.skipKey(i);
    if (i + 1 < t.size()) t.checkToken(++i, ",");
  }
  return Backend::Native;
}

// ---- key table

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

std::string py_float(double d) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, ec == std::errc() ? p : buf);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // Python repr of a whole float
  return s;
}

std::string py_bool(bool b) {
  return b ? "True" : "False";
}

}  // namespace

// ---- public: tokenizer

std::vector<Token> tokenize_spans(std::string_view s) {
  std::vector<Token> out;
  Token cur;
  bool open = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    if (ch == ',' || ch == ':' || ch == '[' || ch == ']') {
      if (open) out.push_back(std::move(cur)), cur = Token{}, open = false;
      out.push_back(Token{std::string(1, ch), i, i + 1});
    } else if (!is_space(ch)) {
      if (!open) cur.begin = i, open = true;
      cur.text += ch;
      cur.end = i + 1;
    }
  }
  if (open) out.push_back(std::move(cur));
  return out;
}

std::vector<std::string> tokenize(std::string_view s) {
  std::vector<std::string> out;
  for (Token &t : tokenize_spans(s)) out.push_back(std::move(t.text));
  return out;
}

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

Outcome evaluate(const Env &env) {
  return evaluate(env, env);
}

Outcome evaluate(const Env &at_import, const Env &at_first_allocation) {
  Outcome o;
  o.load = reader(Parser::Load, at_import);
  o.cuda = reader(Parser::Cuda, at_first_allocation);
  o.accel = reader(Parser::Accel, at_first_allocation);
  Ctx lc{&o.settings}, cc{&o.settings}, ac{&o.settings};
  cc.warnings = &o.warnings;

  auto finish = [&] {
    for (std::size_t k = 0; k < kKeyCount; ++k)
      o.source[k] = lc.set[k]   ? o.load.var
                    : cc.set[k] ? o.cuda.var
                    : ac.set[k] ? o.accel.var
                                : Var::None;
  };
  auto fail = [&](OutcomeClass c, Parser p, Var v, const Ctx &ctx, TorchError e) {
    o.cls = c;
    o.error = std::move(e);
    o.error_parser = p;
    o.error_var = v;
    o.error_key_index = ctx.key_index;
    finish();
  };

  if (o.load.var != Var::None) {
    try {
      o.load_backend = l_parse(*at_import.get(o.load.var), lc);
    } catch (Raised &r) {
      // A c10::Error escaping static initialisation: std::terminate, SIGABRT (§7).
      fail(OutcomeClass::ImportAbort, Parser::Load, o.load.var, lc, std::move(r.e));
      return o;
    }
  }
  // Vectors 7 and 31 show C's "in CUDA allocator config." message for an environment, so at the
  // first allocation C parses before A; when both would raise, C's error is the one seen (checked
  // on torch 2.11 with "max_split_size_mb:1,foo:1"). Under cudaMallocAsync nothing is parsed at
  // allocations; the first settings call instantiates A, then C (measured: an unknown key then
  // names the Accelerator parser), and the error surfaces there.
  o.deferred = o.load_backend == Backend::CudaMallocAsync;
  const OutcomeClass cls = o.deferred ? OutcomeClass::Ok : OutcomeClass::Exception;
  auto parse_c = [&] {
    if (o.cuda.var == Var::None) return true;
    try {
      c_parse_args(*at_first_allocation.get(o.cuda.var), cc, o.load_backend);
    } catch (Raised &r) {
      fail(cls, Parser::Cuda, o.cuda.var, cc, std::move(r.e));
      return false;
    }
    return true;
  };
  auto parse_a = [&] {
    if (o.accel.var == Var::None) return true;
    try {
      a_parse_args(*at_first_allocation.get(o.accel.var), ac);
    } catch (Raised &r) {
      fail(cls, Parser::Accel, o.accel.var, ac, std::move(r.e));
      return false;
    }
    return true;
  };
  if (o.deferred ? parse_a() && parse_c() : parse_c() && parse_a()) finish();
  // torch.cuda.get_allocator_backend() names the allocator chosen at import.
  o.settings.backend = o.load_backend;
  return o;
}

// ---- public: runtime setter

Runtime runtime_from(const Outcome &o) {
  return Runtime{o.settings, o.load_backend};
}

SetResult set_allocator_settings(Runtime &rt, std::string_view s, SetterApi api) {
  SetResult r;
  if (api == SetterApi::DeprecatedCuda)  // §6: @deprecated wrapper around the accelerator call
    r.warnings.push_back(
        "FutureWarning: torch.cuda._set_allocator_settings is deprecated. Use "
        "torch._C._accelerator_setAllocatorSettings instead.");
  Ctx c{&rt.settings};
  c.warnings = &r.warnings;
  try {
    a_parse_args(s, c);  // if A throws, the C hook never runs (vector S4)
    c_parse_args(s, c, rt.load_backend);
  } catch (Raised &e) {
    r.error = std::move(e.e);
  }
  return r;
}

// ---- public: diagnostics

std::string_view severity_name(Severity s) {
  switch (s) {
    case Severity::Error:
      return "error";
    case Severity::Warning:
      return "warning";
    case Severity::Note:
      return "note";
  }
  return "?";
}

namespace {

// The bytes of the item starting at token `key` (to the end of its value, or of the string when the
// item has no complete value).
std::string item_text(std::string_view value, const std::vector<Token> &toks, std::size_t key) {
  if (key >= toks.size()) return std::string(value);
  std::size_t last = toks.size() - 1;
  if (key + 2 < toks.size()) {
    last = key + 2;
    if (toks[last].text == "[") {
      while (last < toks.size() && toks[last].text != "]") ++last;
      if (last == toks.size()) last = toks.size() - 1;
    }
  }
  return std::string(value.substr(toks[key].begin, toks[last].end - toks[key].begin));
}

std::string structural_cause(const std::vector<Token> &toks, std::size_t key) {
  const std::string k = key < toks.size() ? toks[key].text : "";
  if (key + 1 >= toks.size()) return quote(k) + " has no ':' and value";
  if (key + 2 >= toks.size()) return quote(k + toks[key + 1].text) + " has no value";
  return "the '[' after " + quote(k + toks[key + 1].text) + " is never closed";
}

std::string key_hint(std::string_view key) {
  std::string best;
  std::size_t best_d = 3;
  for (const KeyInfo &k : kKeys) {
    for (std::string_view name : {k.name, k.alias}) {
      if (name.empty()) continue;
      std::size_t d = edit_distance(key, name);
      if (d < best_d) best_d = d, best = std::string(name);
    }
  }
  if (best.empty()) return "";
  std::string lower_key(key);
  for (char &ch : lower_key) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower_key == best) return " (keys are case-sensitive: " + best + ")";
  return " (did you mean " + best + "?)";
}

std::string bool_hint(std::string_view v) {
  if (v == "True" || v == "False") return "";
  std::string l(v);
  for (char &ch : l) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (l == "true" || l == "false")
    return " (PyTorch accepts exactly 'True' or 'False'; case matters: write " +
           std::string(l == "true" ? "True" : "False") + ")";
  if (l == "1" || l == "0" || l == "yes" || l == "no" || l == "on" || l == "off")
    return " (PyTorch accepts exactly 'True' or 'False')";
  return "";
}

// Notes on what std::stoull / std::stod make of a value that is not a plain number.
std::string number_note(ValueKind kind, std::string_view tok) {
  if (kind == ValueKind::SizeMb || kind == ValueKind::Count) {
    std::size_t digits = 0;
    while (digits < tok.size() && std::isdigit(static_cast<unsigned char>(tok[digits]))) ++digits;
    if (digits == tok.size()) return "";
    std::string s(tok);
    unsigned long long v = 0;
    std::size_t used = 0;
    try {
      v = std::stoull(s, &used);
    } catch (const std::exception &) {
      return "";
    }
    if (!tok.empty() && tok[0] == '-')
      return "reads " + quote(tok) + " as " + std::to_string(v) +
             " (std::stoull wraps negative numbers)";
    if (used < s.size())
      return "reads " + quote(tok) + " as " + std::to_string(v) + " (std::stoull ignores " +
             quote(s.substr(used)) + ")";
    return "";
  }
  if (kind == ValueKind::Double) {
    std::string s(tok);
    std::size_t used = 0;
    double d = 0;
    try {
      d = std::stod(s, &used);
    } catch (const std::exception &) {
      return "";
    }
    if (used < s.size())
      return "reads " + quote(tok) + " as " + py_float(d) + " (std::stod ignores " +
             quote(s.substr(used)) + ")";
  }
  return "";
}

std::string where_read(const Outcome &o, Parser p) {
  Var v = o.read(p).var;
  return v == Var::None ? std::string("no variable (defaults)") : std::string(var_name(v));
}

// One variable, item by item, the way parsers L and C walk it; each item validated by the parser
// that owns its key, every problem reported (PyTorch stops at the first).
void lint_var(Var var, const std::string &value, const Outcome &o, std::vector<Problem> &out) {
  const bool by_a = o.accel.var == var, by_c = o.cuda.var == var;
  const std::string vn(var_name(var));
  const std::vector<Token> toks = tokenize_spans(value);
  const Tokenizer t(value);
  const std::size_t n = t.size();

  // The large segment size A will use for the bounds (its pre-pass), ignoring bad values.
  Settings base;
  if (by_a) {
    for (std::size_t i = 0; i < n; ++i) {
      if (toks[i].text != "large_segment_size_mb") continue;
      Ctx c{&base};
      try {
        a_large_segment(t, i, c);
      } catch (Raised &) {
      }
    }
  }
  const bool is_error_var = o.error && o.error_var == var;
  std::map<Key, std::vector<std::string>> seen;
  for (std::size_t i = 0; i < n;) {
    const std::size_t key_i = i;
    const std::string &key = toks[i].text;
    std::size_t end = 0;
    try {
      end = t.skipKey(i);
    } catch (Raised &r) {
      if (!(is_error_var && o.error_key_index == key_i))
        out.push_back({Severity::Error, vn + ": " + structural_cause(toks, key_i) + " (" +
                                            r.e.message + "); PyTorch cannot read past it"});
      break;
    }
    const std::string item(value.substr(toks[key_i].begin, toks[end].end - toks[key_i].begin));
    const std::string at = vn + ": " + quote(item) + ": ";
    if (toks[key_i + 1].text != ":")
      out.push_back({Severity::Warning, at + quote(toks[key_i + 1].text) +
                                            " stands where ':' belongs; PyTorch does not check it "
                                            "and reads the next token as the value"});
    for (std::size_t j = key_i; j <= end; ++j) {
      const Token &tk = toks[j];
      if (tk.end - tk.begin != tk.text.size())
        out.push_back({Severity::Note, at + "whitespace inside " +
                                           quote(value.substr(tk.begin, tk.end - tk.begin)) +
                                           " is dropped: PyTorch reads " + quote(tk.text)});
    }
    const std::optional<Key> k = find_key(key);
    const bool outcome_here = is_error_var && o.error_key_index == key_i;
    if (!k) {
      if (!outcome_here && (by_c || by_a))
        out.push_back({Severity::Error, at + "unknown key " + quote(key) + key_hint(key) + ": " +
                                            std::string(error_type_name(ErrorType::ValueError)) +
                                            ": Unrecognized key '" + key + "' in " +
                                            (by_c ? "CUDA" : "Accelerator") +
                                            " allocator config."});
      else if (outcome_here && !key_hint(key).empty())
        out.push_back({Severity::Note, at + "unknown key" + key_hint(key)});
    } else {
      const KeyInfo &info = key_info(*k);
      const bool a_key = info.owner == Parser::Accel;
      const bool read = a_key ? by_a : by_c;
      if (!read) {
        const Parser owner = a_key ? Parser::Accel : Parser::Cuda;
        std::string why = "ignored: the parser of this key (" + std::string(parser_name(owner)) +
                          ") reads " + where_read(o, owner) +
                          ", and PyTorch does not merge variables";
        if (var == Var::Hip && !a_key)
          why = "ignored on a CUDA build: only parser A reads PYTORCH_HIP_ALLOC_CONF; " +
                std::string(info.name) + " comes from " + where_read(o, owner);
        out.push_back({Severity::Warning, at + why});
      } else {
        Settings scratch = base;
        Ctx c{&scratch};
        try {
          if (a_key)
            a_known_item(t, key_i, c, *k);
          else
            c_known_item(t, key_i, c, *k, std::nullopt);  // duplicates of backend: see below
          const std::string &v = toks[key_i + 2].text;
          std::string note = number_note(info.kind, v);
          if (!note.empty()) out.push_back({Severity::Warning, at + note});
          seen[*k].push_back(
              value.substr(toks[key_i + 2].begin, toks[end].end - toks[key_i + 2].begin));
        } catch (Raised &r) {
          std::string hint = info.kind == ValueKind::Bool && key_i + 2 < n
                                 ? bool_hint(toks[key_i + 2].text)
                                 : std::string();
          if (!outcome_here)
            out.push_back({Severity::Error, at + r.e.python() + hint});
          else if (!hint.empty())
            out.push_back({Severity::Note, at + hint.substr(2, hint.size() - 3)});
        }
      }
    }
    i = end + 1;
    if (i < n) {
      if (toks[i].text != ",")
        out.push_back(
            {Severity::Warning, at + quote(toks[i].text) +
                                    " after the value is taken as the separator (PyTorch "
                                    "consumes the token after a value without checking it)"});
      ++i;
    }
  }
  for (const auto &[k, values] : seen) {
    if (values.size() < 2) continue;
    const KeyInfo &info = key_info(k);
    if (k == Key::Backend) {
      if (std::adjacent_find(values.begin(), values.end(), std::not_equal_to<>()) != values.end())
        out.push_back({Severity::Error,
                       vn + ": backend is given " + std::to_string(values.size()) +
                           " times with different values: the first chooses the allocator at "
                           "import, and the runtime check fails on one that differs"});
      continue;
    }
    out.push_back({Severity::Note, vn + ": " + std::string(info.name) + " is given " +
                                       std::to_string(values.size()) + " times; the last (" +
                                       quote(values.back()) + ") wins"});
  }
}

}  // namespace

std::vector<Problem> diagnose(const Env &env) {
  return diagnose(env, evaluate(env));
}

std::vector<Problem> diagnose(const Env &env, const Outcome &o) {
  std::vector<Problem> out;
  // What PyTorch will do, first.
  if (o.error) {
    const std::string vn(var_name(o.error_var));
    const std::string &value = *env.get(o.error_var);
    const std::vector<Token> toks = tokenize_spans(value);
    const std::string item = item_text(value, toks, o.error_key_index);
    if (o.cls == OutcomeClass::ImportAbort)
      out.push_back({Severity::Error, vn + "=" + quote(value) +
                                          ": import torch would abort (std::terminate in the "
                                          "static initialisation of libc10_cuda.so): " +
                                          structural_cause(toks, o.error_key_index) +
                                          "; c10::Error: " + o.error->what()});
    else if (o.cls == OutcomeClass::Exception)
      out.push_back({Severity::Error, vn + ": the first CUDA allocation would raise " +
                                          o.error->python() + " (parser " +
                                          std::string(parser_name(o.error_parser)) + ", at " +
                                          quote(item) + ")"});
    else
      out.push_back({Severity::Error,
                     vn +
                         ": backend:cudaMallocAsync leaves the other keys unread at allocations; "
                         "the first call that reads the allocator settings (e.g. "
                         "torch._C._accelerator_setAllocatorSettings) would raise " +
                         o.error->python() + " (parser " +
                         std::string(parser_name(o.error_parser)) + ", at " + quote(item) + ")"});
  }
  // Which variables are read, hidden or ignored.
  const auto &cuda = env.cuda;
  if (cuda) {
    for (Var other : {Var::Hip, Var::Alloc}) {
      const auto &ov = env.get(other);
      if (!ov) continue;
      const std::string on(var_name(other));
      if (cuda->empty() && !ov->empty())
        out.push_back({Severity::Warning, "PYTORCH_CUDA_ALLOC_CONF is set but empty: it hides " +
                                              on + "=" + quote(*ov) +
                                              " (a present variable wins even when empty)"});
      else if (*ov != *cuda)
        out.push_back({Severity::Warning, on + "=" + quote(*ov) +
                                              " is ignored: PYTORCH_CUDA_ALLOC_CONF is set and "
                                              "PyTorch does not merge the variables"});
    }
  } else if (env.hip) {
    out.push_back({Severity::Note,
                   "PYTORCH_HIP_ALLOC_CONF feeds only parser A on a CUDA build (max_split_size_mb, "
                   "expandable_segments, ...); backend and the CUDA keys come from " +
                       where_read(o, Parser::Cuda)});
  }
  // Item by item, every variable some parser reads.
  for (Var v : kVars) {
    if (!env.get(v)) continue;
    if (o.load.var != v && o.cuda.var != v && o.accel.var != v) continue;
    lint_var(v, *env.get(v), o, out);
  }
  if (!o.error && o.load_backend == Backend::CudaMallocAsync) {
    std::string native;
    for (Key k :
         {Key::LargeSegmentSizeMb, Key::MaxSplitSizeMb, Key::MaxNonSplitRoundingMb,
          Key::GarbageCollectionThreshold, Key::RoundupPower2Divisions, Key::ExpandableSegments}) {
      if (o.source[key_slot(k)] == Var::None) continue;
      if (!native.empty()) native += ", ";
      native.append(key_info(k).name);
    }
    if (!native.empty())
      out.push_back({Severity::Warning, native + " ha" +
                                            (native.find(',') == std::string::npos ? "s" : "ve") +
                                            " no effect with backend:cudaMallocAsync (PyTorch 2.11 "
                                            "does not warn)"});
  }
  for (const std::string &w : o.warnings)
    out.push_back({Severity::Note, "PyTorch will print: " + w});
  return out;
}

std::vector<Problem> diagnose_change(const Env &at_import, const Env &now) {
  std::vector<Problem> out;
  for (Var v : kVars) {
    const auto &a = at_import.get(v), &b = now.get(v);
    if (a == b) continue;
    out.push_back({Severity::Warning,
                   std::string(var_name(v)) + " changed after import torch (" +
                       (a ? quote(*a) : std::string("unset")) + " -> " +
                       (b ? quote(*b) : std::string("unset")) +
                       "): the backend was already chosen from the old value; the other keys are "
                       "read from the new value at the first allocation"});
  }
  if (!out.empty()) {
    Outcome o = evaluate(at_import, now);
    if (o.error)
      out.push_back({Severity::Error, "with this change the first CUDA allocation would raise " +
                                          o.error->python()});
  }
  return out;
}

// ---- public: merge

namespace {

struct Item {
  std::size_t key = 0, last = 0;   // token indices: key, last token of the value
  std::optional<std::size_t> sep;  // the token consumed as separator after the value
};

// The walk of parsers L and C (key, skipKey, one token consumed as separator whatever it is).
bool walk(const std::vector<Token> &toks, std::vector<Item> &items, std::string &err) {
  const std::size_t n = toks.size();
  for (std::size_t i = 0; i < n;) {
    if (i + 2 >= n) {
      err = structural_cause(toks, i) + ": PyTorch would abort at import";
      return false;
    }
    std::size_t last = i + 2;
    if (toks[last].text == "[") {
      while (last < n && toks[last].text != "]") ++last;
      if (last == n) {
        err = structural_cause(toks, i) + ": PyTorch would abort at import";
        return false;
      }
    }
    Item it{i, last, std::nullopt};
    if (last + 1 < n) it.sep = last + 1;
    items.push_back(it);
    i = last + 2;
  }
  return true;
}

bool same_key(std::string_view written, const Override &o) {
  if (o.known) return find_key(written) == o.known;
  return written == o.key;
}

std::string override_text(const Override &o) {
  return o.remove ? "-" + o.key : o.key + ":" + o.value;
}

}  // namespace

OverridesParse parse_overrides(std::string_view s) {
  OverridesParse r;
  const std::vector<std::string> t = tokenize(s);
  const std::size_t n = t.size();
  auto fail = [&](std::string msg) {
    r.items.clear();
    r.error = std::move(msg);
    return r;
  };
  for (std::size_t i = 0; i < n;) {
    if (t[i] == ",") {
      ++i;
      continue;
    }
    const std::string &key = t[i];
    if (key == ":" || key == "[" || key == "]") return fail("expected a key, got " + quote(key));
    Override o;
    if (key[0] == '-') {
      o.remove = true;
      o.key = key.substr(1);
      if (o.key.empty()) return fail("'-' must be followed by the key to remove");
      if (i + 1 < n && t[i + 1] != ",")
        return fail(quote(key) + " removes a key and takes no value");
      o.known = find_key(o.key);
      r.items.push_back(std::move(o));
      i += 1;
      continue;
    }
    o.key = key;
    o.known = find_key(key);
    if (i + 1 >= n || t[i + 1] != ":")
      return fail(quote(key) + " needs ':value' (or write -" + key + " to remove it)");
    if (i + 2 >= n || t[i + 2] == "," || t[i + 2] == ":" || t[i + 2] == "]")
      return fail(quote(key + ":") + " has no value");
    std::size_t last = i + 2;
    if (t[last] == "[") {
      while (last < n && t[last] != "]") {
        if (last > i + 2 && t[last] == "[") return fail("nested '[' in the value of " + quote(key));
        ++last;
      }
      if (last == n) return fail("the '[' after " + quote(key + ":") + " is never closed");
    }
    for (std::size_t j = i + 2; j <= last; ++j) o.value += t[j];
    r.items.push_back(std::move(o));
    i = last + 1;
    if (i < n && t[i] != ",")
      return fail("expected ',' after " + quote(key + ":" + r.items.back().value) + ", got " +
                  quote(t[i]));
  }
  return r;
}

MergeResult merge(std::string_view original, std::string_view overrides) {
  MergeResult r{std::string(original), {}};
  const OverridesParse po = parse_overrides(overrides);
  if (!po.error.empty()) {
    r.error = "CUMEMGUARD_TORCH_ALLOC_CONF: " + po.error;
    return r;
  }
  if (po.items.empty()) return r;  // byte for byte, even when the original is malformed
  std::string &s = r.value;
  for (const Override &o : po.items) {
    // Re-walk after each edit: offsets change.
    for (bool again = true; again;) {
      again = false;
      const std::vector<Token> toks = tokenize_spans(s);
      std::vector<Item> items;
      std::string err;
      if (!walk(toks, items, err)) {
        r.value.assign(original);
        r.error = "cannot rewrite " + quote(original) + ": " + err;
        return r;
      }
      std::vector<std::size_t> hits;
      for (std::size_t j = 0; j < items.size(); ++j)
        if (same_key(toks[items[j].key].text, o)) hits.push_back(j);
      if (o.remove) {
        if (hits.empty()) break;
        // Remove one occurrence with one adjacent separator, then look again.
        const std::size_t j = hits.back();
        const Item &it = items[j];
        std::size_t from = toks[it.key].begin, to = toks[it.last].end;
        if (it.sep) {
          to = *it.sep + 1 < toks.size() ? toks[*it.sep + 1].begin : toks[*it.sep].end;
        } else if (j > 0) {
          from = toks[items[j - 1].last].end;  // drop the previous item's separator instead
        }
        s.erase(from, to - from);
        again = true;
      } else if (hits.empty()) {
        if (toks.empty()) {
          s += o.key + ":" + o.value;
        } else {
          const bool trailing_sep = items.back().sep.has_value();
          s.insert(toks.back().end, (trailing_sep ? "" : ",") + o.key + ":" + o.value);
        }
      } else {
        // Every occurrence gets the value, in place (see the decision in plan() below).
        for (auto h = hits.rbegin(); h != hits.rend(); ++h) {
          const Item &it = items[*h];
          const std::size_t from = toks[it.key + 2].begin, to = toks[it.last].end;
          s.replace(from, to - from, o.value);
        }
      }
    }
  }
  return r;
}

// ---- public: plan

std::string_view plan_action_name(PlanAction a) {
  switch (a) {
    case PlanAction::None:
      return "none";
    case PlanAction::Write:
      return "write";
    case PlanAction::Refuse:
      return "refuse";
  }
  return "?";
}

Env apply(const Env &env, const Plan &p) {
  Env e = env;
  if (p.action != PlanAction::Write) return e;
  for (const Write &w : p.writes) e.get(w.var) = w.new_value;
  return e;
}

// Decisions (the reference is silent on these):
// * A key given several times: every occurrence gets the new value, in place. Replacing only the
//   last would leave `backend` wrong (parser L takes the first occurrence at import and C checks
//   each one against it, so a mixed list raises) and would leave a stale value for readers that
//   test substrings (vLLM cumem.py, torch_memory_saver, reference §8). "-key" removes every
//   occurrence, otherwise an earlier one would become the effective one.
// * No variable present: create PYTORCH_CUDA_ALLOC_CONF. All three parsers read it first in
//   2.10/2.11, 2.9.1 ignored PYTORCH_ALLOC_CONF for expandable_segments (#183387), and the
//   downstream checks of §8 only look at this name.
// * Only PYTORCH_HIP_ALLOC_CONF present (A reads it, C and L do not): A-owned keys go to it;
//   backend and the CUDA keys go to PYTORCH_ALLOC_CONF (created if needed), which C and L read.
//   Creating PYTORCH_CUDA_ALLOC_CONF instead would hide the HIP variable from A.
// * The original would abort at import: refuse (its items cannot be delimited, and the shim does
//   not guess what was meant). A result that PyTorch would reject: refuse, keep the original.
// * An original that fails at the first allocation may be written when the result is accepted
//   (the override repairs it); the problems of the original are still reported.
Plan plan(const Env &env, std::string_view overrides) {
  Plan p;
  p.before = evaluate(env);
  p.problems = diagnose(env, p.before);
  auto refuse = [&](std::string why) {
    p.action = PlanAction::Refuse;
    p.writes.clear();
    p.reason = std::move(why);
    return p;
  };
  const OverridesParse po = parse_overrides(overrides);
  if (!po.error.empty()) return refuse("CUMEMGUARD_TORCH_ALLOC_CONF: " + po.error);
  if (po.items.empty()) {
    p.reason = overrides.empty() ? "CUMEMGUARD_TORCH_ALLOC_CONF is not set"
                                 : "CUMEMGUARD_TORCH_ALLOC_CONF holds no override";
    return p;
  }
  for (const Override &o : po.items)
    if (!o.known)
      return refuse("CUMEMGUARD_TORCH_ALLOC_CONF: unknown key " + quote(o.key) + key_hint(o.key) +
                    " (PyTorch would raise ValueError: Unrecognized key '" + o.key +
                    "' in CUDA allocator config.)");
  if (p.before.cls == OutcomeClass::ImportAbort)
    return refuse(std::string(var_name(p.before.error_var)) +
                  " would already abort import torch; the shim keeps it unchanged");

  // Which variable gets which overrides.
  const Var a_var = p.before.accel.var, c_var = p.before.cuda.var;
  std::vector<std::pair<Var, std::vector<const Override *>>> targets;
  auto target_for = [&](const Override &o) {
    Var v;
    if (a_var == Var::None && c_var == Var::None)
      v = Var::Cuda;
    else if (a_var == c_var)
      v = a_var;
    else if (a_owns(*o.known))
      v = a_var;
    else
      v = c_var == Var::None ? Var::Alloc : c_var;
    for (auto &[tv, list] : targets)
      if (tv == v) return list.push_back(&o);
    targets.push_back({v, {&o}});
  };
  for (const Override &o : po.items) target_for(o);

  Env next = env;
  for (const auto &[v, list] : targets) {
    const std::optional<std::string> &old = env.get(v);
    bool sets = false;
    std::string text;
    for (const Override *o : list) {
      if (!text.empty()) text += ",";
      text += override_text(*o);
      sets = sets || !o->remove;
    }
    if (!old && !sets) continue;  // removing keys from a variable that is not there
    MergeResult m = merge(old.value_or(""), text);
    if (!m.ok()) return refuse(std::string(var_name(v)) + ": " + m.error);
    if (old && m.value == *old) continue;
    Write w;
    w.var = v;
    w.create = !old;
    w.old_value = old;
    w.new_value = m.value;
    next.get(v) = w.new_value;
    std::string readers;
    for (Parser q : {Parser::Load, Parser::Cuda, Parser::Accel}) {
      if (reader(q, next).var != v) continue;
      if (!readers.empty()) readers += ", ";
      readers.append(parser_name(q));
    }
    w.why = std::string(w.create ? "created; " : "") + "read by parser" +
            (readers.find(',') == std::string::npos ? " " : "s ") + readers + " for " + text;
    p.writes.push_back(std::move(w));
  }

  p.after = evaluate(next);
  const Outcome &after = *p.after;
  if (after.error) {
    std::string why = "the result would make ";
    why += after.cls == OutcomeClass::ImportAbort ? "import torch abort: " + after.error->what()
           : after.cls == OutcomeClass::Exception
               ? "the first CUDA allocation raise " + after.error->python()
               : "the first allocator-settings call raise " + after.error->python();
    if (p.before.error) why += " (the original environment fails already)";
    return refuse(why + "; keeping the original");
  }
  // Self-check: each overridden key has the requested value, every other key is unchanged.
  std::array<bool, kKeyCount> touched{};
  std::array<std::string, kKeyCount> want;
  for (const Override &o : po.items) {
    const std::size_t slot = key_slot(*o.known);
    touched[slot] = true;
    Settings scratch;
    if (!o.remove) {
      scratch.large_segment_size = after.settings.large_segment_size;
      Ctx c{&scratch};
      const Tokenizer t(o.key + ":" + o.value);
      try {
        if (a_owns(*o.known))
          a_known_item(t, 0, c, *o.known);
        else
          c_known_item(t, 0, c, *o.known, std::nullopt);
      } catch (Raised &r) {
        return refuse("CUMEMGUARD_TORCH_ALLOC_CONF: " + quote(override_text(o)) + ": " +
                      r.e.python());
      }
    }
    want[slot] = effective_text(scratch, *o.known);
  }
  for (const KeyInfo &k : keys()) {
    const std::size_t slot = key_slot(k.key);
    const std::string got = effective_text(after.settings, k.key);
    if (touched[slot] && got != want[slot])
      return refuse(std::string(k.name) + " would be " + got + ", not the requested " + want[slot] +
                    "; keeping the original");
    if (!touched[slot] && !p.before.error && got != effective_text(p.before.settings, k.key))
      return refuse(std::string(k.name) + " would change as a side effect; keeping the original");
  }
  if (p.writes.empty()) {
    p.reason = "the overrides are already in effect";
    return p;
  }
  p.action = PlanAction::Write;
  for (const Write &w : p.writes) {
    if (!p.reason.empty()) p.reason += "; ";
    p.reason +=
        (w.create ? "create " : "set ") + std::string(var_name(w.var)) + "=" + quote(w.new_value);
  }
  return p;
}

}  // namespace cmg::torchconf
