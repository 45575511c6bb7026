// SPDX-License-Identifier: Apache-2.0
// The scoped allocator-settings change, on the one parser of the product. Its first
// review found the two ways such guards go wrong: a partial string passed to the setter resets
// max_split_size, roundup_power2_divisions and garbage_collection_threshold (A.parseArgs resets
// them, reference §5), and a guard that reads only PYTORCH_CUDA_ALLOC_CONF misses the unified
// variable. Here the base is the full configuration, the result changes one token in place
// (merge), and both the result and the restore are run through the setter model and compared key
// by key before anything is handed out.
#include "torch_rewrite.h"

#include <cstring>

#include "torch_conf_impl.h"

namespace cmg::torchconf {
using namespace impl;
namespace {

bool expandable_in_effect(const Runtime &rt) {
  return rt.load_backend == Backend::Native && rt.settings.expandable_segments;
}

// The keys an override list names (aliases resolved).
std::array<bool, kKeyCount> named_keys(const OverridesParse &po) {
  std::array<bool, kKeyCount> named{};
  for (const Override &o : po.items)
    if (o.known) named[key_slot(*o.known)] = true;
  return named;
}

// The first key of the release whose effective value differs, or "".
std::string first_difference(const Settings &a, const Settings &b,
                             const std::array<bool, kKeyCount> &skip, const Grammar &g) {
  for (const KeyInfo &k : keys()) {
    if (skip[key_slot(k.key)] || !g.knows(k.key)) continue;
    if (effective_text(a, k.key) != effective_text(b, k.key))
      return std::string(k.name) + " (" + effective_text(a, k.key) + " -> " +
             effective_text(b, k.key) + ")";
  }
  return "";
}

// A JSON string, escaped here: this file is also linked without the rest of the model (the fuzz
// target), so it does not borrow the tracker's helper.
std::string json_str(std::string_view s) {
  std::string r = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      r += '\\';
      r += ch;
    } else if (c < 0x20) {
      static constexpr char kHex[] = "0123456789abcdef";
      r += "\\u00";
      r += kHex[c >> 4];
      r += kHex[c & 15];
    } else {
      r += ch;  // UTF-8 passes through; the reader replaces invalid bytes
    }
  }
  return r + "\"";
}

}  // namespace

RewriteRequest request_from_c(const char *base, const char *overrides, const char *torch_version) {
  RewriteRequest q;
  if (base) q.base = base;
  q.overrides = overrides ? overrides : "";
  if (torch_version && *torch_version)
    if (auto v = parse_torch_version(torch_version)) {
      q.version = *v;
      q.version_source = "given by the caller";
    }
  return q;
}

std::size_t copy_out(const std::string &s, char *buf, std::size_t len) {
  if (buf && len > s.size()) {
    std::memcpy(buf, s.data(), s.size());
    buf[s.size()] = '\0';
  } else if (buf && len > 0) {
    buf[0] = '\0';
  }
  return s.size();
}

Rewrite rewrite(const Env &env, const RewriteRequest &req) {
  Rewrite r;
  // The judged release's own grammar: its keys are accepted and kept (a 2.12 key is no error for
  // 2.12), and a release newer than every row keeps keys it does not know verbatim.
  const Judgement j = judge(env, req.version, req.version_source);
  const Outcome &read = j.outcome;
  const Grammar &g = j.grammar;
  r.version = j.version.text;
  r.setter = std::string(g.setter_name());
  r.version_source = j.source;
  for (const KnownProblem &k : j.known) r.known.push_back(k.text);
  auto fail = [&](std::string why) {
    r.error = std::move(why);
    r.result = r.restore = r.base;
    return r;
  };

  // The state the process is in before the change.
  Runtime rt;
  if (!req.base) {
    r.variable = read.accel.var;
    r.base = env.get(r.variable).value_or("");
    if (read.cls == OutcomeClass::ImportAbort)
      return fail("import torch aborts on this environment: " + read.error->what());
    if (read.error && !read.deferred)
      return fail("the environment already fails at the first CUDA allocation: " +
                  read.error->python());
    rt = runtime_from(j.outcome);
  } else {
    r.base = *req.base;
    rt = read.error ? Runtime{Settings{}, Backend::Native, g} : runtime_from(j.outcome);
    if (SetResult s = set_allocator_settings(rt, r.base); s.error)
      return fail("the base configuration raises " + s.error->python());
  }
  r.expandable_before = expandable_in_effect(rt);

  const OverridesParse po = parse_overrides(req.overrides);
  if (!po.error.empty()) return fail("overrides: " + po.error);
  for (const Override &o : po.items) {
    if (!o.known) return fail("overrides: unknown key " + quote(o.key) + key_hint(o.key));
    if (!g.knows(*o.known))
      return fail("overrides: " + quote(o.key) + " is not a key of torch " + j.version.text +
                  " (first parsed by " + std::string(key_info(*o.known).first) + ")");
  }
  const MergeResult m = merge(r.base, req.overrides);
  if (!m.ok()) return fail(m.error);
  r.result = m.value;

  // `rt` is the state to come back to: the environment as the judged release read it, or the base
  // string applied by the setter.
  Runtime after = rt;
  if (SetResult s = set_allocator_settings(after, r.result); s.error)
    return fail("the result " + quote(r.result) + " would raise " + s.error->python());
  const std::array<bool, kKeyCount> named = named_keys(po);
  if (std::string d = first_difference(rt.settings, after.settings, named, g); !d.empty())
    return fail("the result would also change " + d);
  r.expandable_after = expandable_in_effect(after);
  r.changed = r.result != r.base;

  // The restore: the base itself, unless the setter does not reset a key the result changed
  // (expandable_segments and the CUDA keys keep their value when a string omits them). Then the
  // keys' values of the base are written into it.
  r.restore = r.base;
  for (int attempt = 0; attempt < 2; ++attempt) {
    Runtime back = after;
    if (SetResult s = set_allocator_settings(back, r.restore); s.error)
      return fail("the restore " + quote(r.restore) + " would raise " + s.error->python());
    const std::string d = first_difference(rt.settings, back.settings, {}, g);
    if (d.empty() && expandable_in_effect(back) == r.expandable_before) return r;
    if (attempt == 1) return fail("no string restores the original settings: " + d);
    std::string keep;
    for (const Override &o : po.items) {
      if (!keep.empty()) keep += ",";
      keep += std::string(key_info(*o.known).name) + ":" + effective_text(rt.settings, *o.known);
    }
    const MergeResult mb = merge(r.base, keep);
    if (!mb.ok()) return fail(mb.error);
    r.restore = mb.value;
  }
  return r;
}

std::string rewrite_json(const Rewrite &r) {
  std::string j = "{\"variable\":";
  j += r.variable == Var::None ? "null" : json_str(std::string(var_name(r.variable)));
  j += ",\"base\":" + json_str(r.base) + ",\"result\":" + json_str(r.result) +
       ",\"restore\":" + json_str(r.restore) +
       ",\"error\":" + (r.error.empty() ? std::string("null") : json_str(r.error)) +
       ",\"expandable_before\":" + (r.expandable_before ? "true" : "false") +
       ",\"expandable_after\":" + (r.expandable_after ? "true" : "false") +
       ",\"changed\":" + (r.changed ? "true" : "false") +
       ",\"torch_version\":" + json_str(r.version) +
       ",\"torch_version_source\":" + json_str(r.version_source) +
       ",\"setter\":" + json_str(r.setter) + ",\"known_problems\":[";
  for (std::size_t i = 0; i < r.known.size(); ++i) j += (i ? "," : "") + json_str(r.known[i]);
  return j + "]}";
}

}  // namespace cmg::torchconf
