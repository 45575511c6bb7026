// SPDX-License-Identifier: Apache-2.0
// The allocator-config parser of PyTorch 2.0 to 2.7, before AcceleratorAllocatorConfig split it:
// one CUDAAllocatorConfig::parseArgs for every key, transliterated from the stored legacy
// c10/cuda/CUDAAllocatorConfig.cpp (lexArgs, consumeToken, the parse* functions) and kept apart
// from the 2.10+ parsers because it differs in every quirk: only ' ' is dropped, separators are
// checked, sizes are std::stoi, every failure is a TORCH_CHECK (RuntimeError), and the backend at
// import comes from regex splits that never throw (so nothing aborts `import torch`). Which keys a
// release parses is the table of torch_releases.def; the message texts are those of that source.
#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>

#include "torch_conf_impl.h"

namespace cmg::torchconf::impl {
namespace {

constexpr std::uint64_t kLargeBufferMb = 20;  // kLargeBuffer / mb

using Config = std::vector<std::string>;

// lexArgs: each of , : [ ] is a token; only ' ' is dropped (a tab stays inside the word).
Config lex_args(std::string_view env) {
  Config config;
  std::string buf;
  for (const char ch : env) {
    if (ch == ',' || ch == ':' || ch == '[' || ch == ']') {
      if (!buf.empty()) config.push_back(std::move(buf)), buf.clear();
      config.emplace_back(1, ch);
    } else if (ch != ' ') {
      buf += ch;
    }
  }
  if (!buf.empty()) config.push_back(std::move(buf));
  return config;
}

[[noreturn]] void raise_check(std::string msg) {
  raise_runtime(std::move(msg));  // TORCH_CHECK: c10::Error, RuntimeError in Python
}

void consume_token(const Config &config, std::size_t i, char c) {
  if (!(i < config.size() && config[i] == std::string(1, c)))
    raise_check(std::string("Error parsing CachingAllocator settings, expected ") + c);
}

// `size_t v = stoi(s)`: int range, a negative value wraps.
std::uint64_t stoi_size(const std::string &s) {
  try {
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(std::stoi(s)));
  } catch (const std::exception &e) {
    raise_runtime(e.what());
  }
}

double stod_value(const std::string &s) {
  try {
    return std::stod(s);
  } catch (const std::exception &e) {
    raise_runtime(e.what());
  }
}

std::uint64_t stoul_value(const std::string &s) {
  try {
    return std::stoul(s);
  } catch (const std::exception &e) {
    raise_runtime(e.what());
  }
}

bool true_false(const Config &config, std::size_t i, std::string_view key) {
  if (!(i < config.size() && (config[i] == "True" || config[i] == "False")))
    raise_check("Expected a single True/False argument for " + std::string(key));
  return config[i] == "True";
}

std::size_t parse_size_mb(const Config &config, std::size_t i, Ctx &c, Key k) {
  consume_token(config, ++i, ':');
  const std::string_view name = key_info(k).name;
  if (!(++i < config.size())) raise_check("Error, expecting " + std::string(name) + " value");
  std::uint64_t v = stoi_size(config[i]);
  if (k == Key::MaxSplitSizeMb) {
    if (!(v > kLargeBufferMb))
      raise_check("CachingAllocator option max_split_size_mb too small, must be > " +
                  std::to_string(kLargeBufferMb));
  } else if (k == Key::MaxNonSplitRoundingMb) {
    if (!(v >= kLargeBufferMb))
      raise_check("CachingAllocator option max_non_split_rounding_mb too small, must be >= " +
                  std::to_string(kLargeBufferMb));
  }
  v = std::min(std::max(v, kLargeBufferMb), UINT64_MAX / kMB);
  if (k == Key::RoundupBypassThresholdMb) v = stoi_size(config[i]);  // no bound (PR #85940)
  (k == Key::MaxSplitSizeMb          ? c.s->max_split_size
   : k == Key::MaxNonSplitRoundingMb ? c.s->max_non_split_rounding_size
                                     : c.s->roundup_bypass_threshold) = v * kMB;
  c.mark(k);
  return i;
}

std::size_t parse_gc(const Config &config, std::size_t i, Ctx &c) {
  consume_token(config, ++i, ':');
  if (!(++i < config.size())) raise_check("Error, expecting garbage_collection_threshold value");
  const double v = stod_value(config[i]);
  if (!(v > 0)) raise_check("garbage_collect_threshold too small, set it 0.0~1.0");
  if (!(v < 1.0)) raise_check("garbage_collect_threshold too big, set it 0.0~1.0");
  c.s->garbage_collection_threshold = v;
  c.mark(Key::GarbageCollectionThreshold);
  return i;
}

// The list form differs from 2.10+: ">" fills from last_index itself, and a list that is never
// closed ends the parse without an error.
std::size_t parse_roundup(const Config &config, std::size_t i, Ctx &c) {
  auto &div = c.s->roundup_power2_divisions;
  consume_token(config, ++i, ':');
  bool first_value = true;
  if (!(++i < config.size())) raise_check("Error, expecting roundup_power2_divisions value");
  if (config[i] == "[") {
    std::size_t last_index = 0;
    while (++i < config.size() && config[i] != "]") {
      const std::string &val1 = config[i];
      consume_token(config, ++i, ':');
      if (!(++i < config.size())) raise_check("Error parsing roundup_power2_divisions value");
      const std::uint64_t val2 = stoi_size(config[i]);
      if (!(val2 == 0 || is_power_of_2(val2)))
        raise_check("For roundups, the divisons has to be power of 2 or 0 to disable roundup ");
      if (val1 == ">") {
        std::fill(div.begin() + static_cast<std::ptrdiff_t>(std::min(last_index, div.size())),
                  div.end(), val2);
      } else {
        const std::uint64_t val1_long = stoul_value(val1);
        if (!is_power_of_2(val1_long))
          raise_check("For roundups, the intervals have to be power of 2 ");
        std::size_t index = static_cast<std::size_t>(63 - std::countl_zero(val1_long));
        index = std::min(index, div.size() - 1);
        if (first_value) {
          std::fill(div.begin(), div.begin() + static_cast<std::ptrdiff_t>(index), val2);
          first_value = false;
        }
        div[index] = val2;
        last_index = index;
      }
      // config[i + 1] past the end is read as "not ]" here (the source reads out of bounds).
      if (!(i + 1 < config.size() && config[i + 1] == "]")) consume_token(config, ++i, ',');
    }
  } else {  // backwards compatible single value
    const std::uint64_t val1 = stoi_size(config[i]);
    if (!is_power_of_2(val1)) raise_check("For roundups, the divisons has to be power of 2 ");
    div.fill(val1);
  }
  c.mark(Key::RoundupPower2Divisions);
  return i;
}

std::size_t parse_backend(const Config &config, std::size_t i, Ctx &c,
                          std::optional<Backend> loaded, bool &async) {
  consume_token(config, ++i, ':');
  if (!(++i < config.size())) raise_check("Error parsing backend value");
  if (!(config[i] == "native" || config[i] == kAsyncToken))
    raise_check("Unknown allocator backend, options are native and cudaMallocAsync");
  const Backend b = config[i] == "native" ? Backend::Native : Backend::CudaMallocAsync;
  async = b == Backend::CudaMallocAsync;
  if (loaded && b != *loaded)
    throw Raised{TorchError{ErrorType::RuntimeError,
                            "Allocator backend parsed at runtime != allocator backend parsed at "
                            "load time",
                            true, "config[i] == get()->name()",
                            "\"/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":…"}};
  c.s->backend = b;
  c.mark(Key::Backend);
  return i;
}

std::size_t parse_bool(const Config &config, std::size_t i, Ctx &c, Key k) {
  consume_token(config, ++i, ':');
  const std::string_view name = key_info(k).name;
  // parsePinnedUseCudaHostRegister and parsePinnedUseBackgroundThreads check the index first.
  if (k == Key::PinnedUseCudaHostRegister || k == Key::PinnedUseBackgroundThreads)
    if (!(i + 1 < config.size())) raise_check("Error, expecting " + std::string(name) + " value");
  const bool v = true_false(config, ++i, name);
  switch (k) {
    case Key::ExpandableSegments:
      c.s->expandable_segments = v;
      break;
    case Key::ReleaseLockOnCudamalloc:
      c.s->release_lock_on_cudamalloc = v;
      break;
    case Key::PinnedUseCudaHostRegister:
      c.s->pinned_use_cuda_host_register = v;
      break;
    default:
      c.s->pinned_use_background_threads = v;
      break;
  }
  c.mark(k);
  return i;
}

std::size_t parse_threads(const Config &config, std::size_t i, Ctx &c) {
  consume_token(config, ++i, ':');
  if (!(++i < config.size())) raise_check("Error, expecting pinned_num_register_threads value");
  const std::uint64_t v = stoi_size(config[i]);
  if (!is_power_of_2(v)) raise_check("Number of register threads has to be power of 2 ");
  if (!(v <= kMaxRegisterThreads))
    raise_check("Number of register threads should be less than or equal to " +
                std::to_string(kMaxRegisterThreads));
  c.s->pinned_num_register_threads = v;
  c.mark(Key::PinnedNumRegisterThreads);
  return i;
}

}  // namespace

void legacy_parse_args(std::string_view env, Ctx &c, std::optional<Backend> loaded) {
  Settings &s = *c.s;
  s.max_split_size = UINT64_MAX;
  s.roundup_power2_divisions.fill(0);
  s.garbage_collection_threshold = 0;
  s.last_allocator_settings.assign(env);
  bool async = false, native_specific = false;
  const Config config = lex_args(env);
  for (std::size_t i = 0; i < config.size(); ++i) {
    c.key_index = i;
    const std::string &item = config[i];
    const std::optional<Key> k = find_key(item, *c.g);
    if (!k) raise_check("Unrecognized CachingAllocator option: " + item);
    switch (*k) {
      case Key::MaxSplitSizeMb:
      case Key::MaxNonSplitRoundingMb:
      case Key::RoundupBypassThresholdMb:
        i = parse_size_mb(config, i, c, *k);
        break;
      case Key::GarbageCollectionThreshold:
        i = parse_gc(config, i, c);
        break;
      case Key::RoundupPower2Divisions:
        i = parse_roundup(config, i, c);
        break;
      case Key::Backend:
        i = parse_backend(config, i, c, loaded, async);
        break;
      case Key::PinnedNumRegisterThreads:
        i = parse_threads(config, i, c);
        break;
      case Key::ExpandableSegments:
      case Key::ReleaseLockOnCudamalloc:
      case Key::PinnedUseCudaHostRegister:
      case Key::PinnedUseBackgroundThreads:
        i = parse_bool(config, i, c, *k);
        break;
      default:  // no other key is in a legacy release (the table's first releases)
        raise_check("Unrecognized CachingAllocator option: " + item);
    }
    if (*k != Key::Backend) native_specific = true;
    if (i + 1 < config.size()) consume_token(config, ++i, ',');
  }
  if (async && native_specific)
    c.warn(
        "Warning: backend:cudaMallocAsync ignores max_split_size_mb,roundup_power2_divisions, and "
        "garbage_collect_threshold. (function parseArgs)");
}

// parseEnvForBackend: the value split on the regex [\s,]+, each option on [:]+; the first
// "backend" option naming cudaMallocAsync or native decides. Nothing here throws.
Backend legacy_load(std::string_view env, Ctx &c) {
  std::string option;
  auto decide = [&](const std::string &opt, Backend &out) {
    std::vector<std::string> kv;
    std::string part;
    for (const char ch : opt) {
      if (ch == ':') {
        if (!part.empty() || kv.empty()) kv.push_back(std::move(part)), part.clear();
      } else {
        part += ch;
      }
    }
    kv.push_back(std::move(part));
    if (kv.size() >= 2 && kv[0] == "backend") {
      if (kv[1] == kAsyncToken) return out = Backend::CudaMallocAsync, c.mark(Key::Backend), true;
      if (kv[1] == "native") return out = Backend::Native, c.mark(Key::Backend), true;
    }
    return false;
  };
  Backend out = Backend::Native;
  for (std::size_t i = 0; i <= env.size(); ++i) {
    const bool sep = i == env.size() || env[i] == ',' || is_space(env[i]);
    if (!sep) {
      option += env[i];
      continue;
    }
    if (!option.empty() && decide(option, out)) return out;
    option.clear();
  }
  return Backend::Native;
}

}  // namespace cmg::torchconf::impl
