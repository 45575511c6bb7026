// SPDX-License-Identifier: Apache-2.0
// The three readers of PyTorch's allocator configuration, transliterated token by token from c10:
// parser A (AcceleratorAllocatorConfig, c10/core/AllocatorConfig.cpp), parser C
// (CUDAAllocatorConfig, c10/cuda/CUDAAllocatorConfig.cpp) and parser L (the backend at import);
// then what a process gets from its environment (evaluate) and from the runtime setter.
// Following c10 call by call is what makes every quirk (ignored separators, stoull/stod, skipKey
// running off the end) give torch's own result. Spec: docs/reference/pytorch-alloc-conf.md.
#include <algorithm>
#include <bit>
#include <cmath>
#include <locale>
#include <map>
#include <sstream>
#include <utility>

#include "torch_conf_impl.h"

namespace cmg::torchconf {
namespace impl {

// A key the release does not parse: ValueError, or for a release newer than every row of the table
// a note (the key may be one that release added; it is kept and skipped).
void unknown_key(const std::string &key, std::string_view parser, const Ctx &c) {
  if (!c.g->opaque_unknown)
    raise_value("Unrecognized key '" + key + "' in " + std::string(parser) + " allocator config.");
  if (parser == "CUDA")
    c.warn("cumemguard: '" + key + "' is not a key of any modelled release (newest: " +
           std::string(newest_grammar().release) + "); kept as written and not judged");
}

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
  // PR #172056 (2.11): reset to the large segment size in effect when the parse starts (before the
  // pre-pass below). Not observable through the snapshot.
  if (c.g->reset_non_split) s.max_non_split_rounding_size = s.large_segment_size;
  s.last_allocator_settings.assign(env);

  const Tokenizer t(env);
  // Decision: the pre-pass scans every token for the key (last occurrence wins, each one
  // validated), and the main loop then skips the item, so
  // max_split_size_mb/max_non_split_rounding_mb are checked against the final large segment size
  // wherever the keys appear (vector 40).
  for (std::size_t i = 0; c.g->large_segment_prepass && i < t.size(); ++i) {
    if (t[i] == "large_segment_size_mb") {
      c.key_index = i;
      i = a_large_segment(t, i, c);
    }
  }
  for (std::size_t i = 0; i < t.size(); ++i) {
    c.key_index = i;
    const std::string &key = t[i];
    std::optional<Key> k = find_key(key, *c.g);
    if (k && a_owns(*k) && *k != Key::LargeSegmentSizeMb) {
      i = a_known_item(t, i, c, *k);
    } else {
      // The CUDA hook is registered at static init, so A checks the union of both key sets.
      if (!k) unknown_key(key, "Accelerator", c);
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

// parseReserveSpec (PR #192269): a fraction of device memory, or GiB with a trailing G/g, read with
// an istringstream in the classic locale; it must be the whole token, finite and > 0. Anything
// else is a TORCH_WARN and the default, never an error.
bool reserve_spec(const std::string &tok, const Ctx &c) {
  const bool gib = !tok.empty() && (tok.back() == 'G' || tok.back() == 'g');
  const std::string num = gib ? tok.substr(0, tok.size() - 1) : tok;
  double value = 0.0;
  std::istringstream in(num);
  in.imbue(std::locale::classic());
  in >> value;
  const bool ok = !num.empty() && !in.fail() && in.eof() && std::isfinite(value) && value > 0.0;
  if (!ok)
    c.warn("Warning: Ignoring invalid expandable-segment reserve value '" + tok +
           "' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an "
           "absolute size like 40G); using default. (function parseReserveSpec)");
  return ok;
}

// parseExpandableSegmentsReserveByClass: the only parser that uses checkToken's result, to find
// the ']' and the ','; a missing '[' is not diagnosed, and the loop runs off the end instead (the
// index assert). The map replaces the previous one whole; malformed entries are skipped.
std::size_t c_reserve_by_class(const Tokenizer &t, std::size_t i, Ctx &c) {
  t.checkToken(++i, ":");
  t.checkToken(++i, "[");
  std::map<std::string, std::string> parsed;
  while (!t.checkToken(i + 1, "]")) {
    const std::string name = t[++i];
    t.checkToken(++i, ":");
    const std::string &tok = t[++i];
    if (reserve_spec(tok, c)) parsed[name] = tok;
    if (t.checkToken(i + 1, ",")) ++i;
  }
  ++i;  // the ']'
  std::string text;
  for (const auto &[name, tok] : parsed) text += (text.empty() ? "[" : ",") + name + ":" + tok;
  c.s->expandable_segments_reserve_by_class = text.empty() ? "" : text + "]";
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
    case Key::ThrowOnCudamallocOom:
    case Key::PinnedFreeCatchAll: {
      t.checkToken(++i, ":");
      bool v = t.toBool(++i);
      (k == Key::ThrowOnCudamallocOom ? s.throw_on_cudamalloc_oom : s.pinned_free_catch_all) = v;
      break;
    }
    case Key::ExpandableSegmentsReserve: {
      t.checkToken(++i, ":");
      // A bad value keeps the default (parseExpandableSegmentsReserve), so the key is not marked.
      const std::string &tok = t[++i];
      if (!reserve_spec(tok, c)) return i;
      s.expandable_segments_reserve = tok;
      break;
    }
    case Key::ExpandableSegmentsReserveByClass:
      i = c_reserve_by_class(t, i, c);
      break;
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
    std::optional<Key> k = find_key(key, *c.g);
    if (k && !a_owns(*k)) {
      i = c_known_item(t, i, c, *k, loaded);
      if (*k != Key::Backend) native_specific = true;
    } else {
      if (!k) unknown_key(key, "CUDA", c);
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
}  // namespace impl

using namespace impl;

Outcome evaluate(const Env &env) {
  return evaluate(env, env, default_grammar());
}

Outcome evaluate(const Env &env, const Grammar &g) {
  return evaluate(env, env, g);
}

Outcome evaluate(const Env &at_import, const Env &at_first_allocation) {
  return evaluate(at_import, at_first_allocation, default_grammar());
}

Outcome evaluate(const Env &at_import, const Env &at_first_allocation, const Grammar &g) {
  Outcome o;
  o.grammar = g;
  o.load = reader(Parser::Load, at_import, g);
  o.cuda = reader(Parser::Cuda, at_first_allocation, g);
  o.accel = reader(Parser::Accel, at_first_allocation, g);
  Ctx lc{&o.settings}, cc{&o.settings}, ac{&o.settings};
  lc.g = cc.g = ac.g = &o.grammar;
  cc.warnings = &o.warnings;
  const bool legacy = g.family == Family::Legacy;

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
      const std::string &v = *at_import.get(o.load.var);
      o.load_backend = legacy ? legacy_load(v, lc) : l_parse(v, lc);
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
      // The legacy parser owns every key: it is parser C here, and A reads nothing of its own.
      if (legacy)
        legacy_parse_args(*at_first_allocation.get(o.cuda.var), cc, o.load_backend);
      else
        c_parse_args(*at_first_allocation.get(o.cuda.var), cc, o.load_backend);
    } catch (Raised &r) {
      fail(cls, Parser::Cuda, o.cuda.var, cc, std::move(r.e));
      return false;
    }
    return true;
  };
  auto parse_a = [&] {
    if (o.accel.var == Var::None || legacy) return true;
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
  return Runtime{o.settings, o.load_backend, o.grammar};
}

SetResult set_allocator_settings(Runtime &rt, std::string_view s, SetterApi api) {
  SetResult r;
  // §6: from 2.10 a @deprecated wrapper around the accelerator call; before, the setter itself.
  if (api == SetterApi::DeprecatedCuda && rt.grammar.accelerator_setter)
    r.warnings.push_back(
        "FutureWarning: torch.cuda._set_allocator_settings is deprecated. Use "
        "torch._C._accelerator_setAllocatorSettings instead.");
  Ctx c{&rt.settings};
  c.warnings = &r.warnings;
  c.g = &rt.grammar;
  try {
    if (rt.grammar.family == Family::Legacy) {
      // setAllocatorSettings -> CUDAAllocatorConfig::instance().parseArgs(env.c_str()).
      legacy_parse_args(s, c, rt.load_backend);
    } else {
      a_parse_args(s, c);  // if A throws, the C hook never runs (vector S4)
      c_parse_args(s, c, rt.load_backend);
    }
  } catch (Raised &e) {
    r.error = std::move(e.e);
  }
  return r;
}
}  // namespace cmg::torchconf
