// SPDX-License-Identifier: Apache-2.0
// Known differences and bugs of PyTorch releases in how the allocator configuration is honoured,
// one row per public report. Where a row says which release fixed it, the release is the first one
// cut after the fix was merged (the pull request's merge date against the release branch dates);
// docs/torch-versions.md lists the sources of every row.
#include "torch_rules.h"

#include <algorithm>

#include "torch_conf_impl.h"

namespace cmg::torchconf {
using namespace impl;
namespace {

std::size_t slot(Key k) {
  return key_slot(k);
}

bool expandable_set(const Outcome &o) {
  return o.settings.expandable_segments && o.load_backend == Backend::Native;
}

std::string source_of(const Outcome &o, Key k) {
  const Var v = o.source[slot(k)];
  return v == Var::None ? std::string("the default") : std::string(var_name(v));
}

// ---- pytorch#183387: on 2.9.1 the CUDA allocator takes expandable_segments only from
// PYTORCH_CUDA_ALLOC_CONF; PYTORCH_ALLOC_CONF=expandable_segments:True leaves it False (the
// report's snapshot shows False). Honoured by 2.11.0 (verified by the reporter,
// karpathy/autoresearch#588) and by 2.10.0 (the scoped guard's snapshot with the unified variable only).
bool unified_ignored_applies(const Env &, const Outcome &o, const TorchVersion &) {
  return o.source[slot(Key::ExpandableSegments)] == Var::Alloc && o.settings.expandable_segments;
}
std::string unified_ignored_text(const Env &, const Outcome &) {
  return "PYTORCH_ALLOC_CONF sets expandable_segments:True, but this release takes "
         "expandable_segments for CUDA only from PYTORCH_CUDA_ALLOC_CONF: segments stay "
         "non-expandable (set PYTORCH_CUDA_ALLOC_CONF instead)";
}
void unified_ignored_adjust(Outcome &o) {
  o.settings.expandable_segments = false;
  o.source[slot(Key::ExpandableSegments)] = Var::None;
}

// ---- the deprecation warning 2.8-2.10 print when PYTORCH_CUDA_ALLOC_CONF is read (the text is in
// pytorch#183387's report on 2.9.1; PriorLabs/TabPFN#801 dates it from 2.8). 2.11.0 printed none
// (reference §2, measured on the H200).
bool deprecated_applies(const Env &env, const Outcome &, const TorchVersion &) {
  return env.cuda.has_value();
}
std::string deprecated_text(const Env &, const Outcome &) {
  return "PyTorch will print: Warning: PYTORCH_CUDA_ALLOC_CONF is deprecated, use "
         "PYTORCH_ALLOC_CONF instead";
}

// ---- pytorch#119452: expandable segments with max_split_size_mb hit
// "!block->expandable_segment_ INTERNAL ASSERT FAILED" (CUDACachingAllocator.cpp). PR #120022
// (merged 2024-02-16) makes expandable segments ignore max_split_size.
bool max_split_assert_applies(const Env &, const Outcome &o, const TorchVersion &) {
  return expandable_set(o) && o.source[slot(Key::MaxSplitSizeMb)] != Var::None;
}
std::string max_split_assert_text(const Env &, const Outcome &o) {
  return "expandable_segments:True with max_split_size_mb (" + source_of(o, Key::MaxSplitSizeMb) +
         ") can stop with RuntimeError: !block->expandable_segment_ INTERNAL ASSERT FAILED";
}

// ---- PR #134338 (merged 2024-08-29): garbage_collection_threshold or max_split_size_mb with
// expandable segments "could cause the allocator to hit assert failures when running nearly out
// of memory" (garbage collection and max_split freeing tried to release expandable segments).
bool near_oom_applies(const Env &, const Outcome &o, const TorchVersion &) {
  return expandable_set(o) && (o.source[slot(Key::MaxSplitSizeMb)] != Var::None ||
                               o.source[slot(Key::GarbageCollectionThreshold)] != Var::None);
}
std::string near_oom_text(const Env &, const Outcome &o) {
  std::string keys;
  for (Key k : {Key::MaxSplitSizeMb, Key::GarbageCollectionThreshold}) {
    if (o.source[slot(k)] == Var::None) continue;
    if (!keys.empty()) keys += " and ";
    keys += std::string(key_info(k).name) + " (" + source_of(o, k) + ")";
  }
  return "expandable_segments:True with " + keys +
         ": the allocator can fail an assertion when the device is nearly out of memory";
}

// ---- pytorch#123548 (reported on 2.9.1, ROCm): get_free_block() applies max_split_size's
// oversize rules to blocks inside expandable segments too, so a free block larger than
// max_split_size is not reused and reserved memory grows. Fix proposed in PR #193400, a draft and
// not merged when last seen (2026-08-13): no release has it.
bool growth_applies(const Env &, const Outcome &o, const TorchVersion &) {
  return expandable_set(o) && o.source[slot(Key::MaxSplitSizeMb)] != Var::None;
}
std::string growth_text(const Env &, const Outcome &o) {
  return "expandable_segments:True with max_split_size_mb (" + source_of(o, Key::MaxSplitSizeMb) +
         "): free blocks of expandable segments larger than max_split_size are not reused, so "
         "reserved memory can grow (expandable segments need no max_split_size_mb)";
}

// ---- pytorch#145661 (reported on 2.5.1): forceUncachedAllocator() tests only that
// PYTORCH_NO_CUDA_MEMORY_CACHING exists, so =0 turns caching off. PR #145905 (merged 2025-01-30)
// reads the value: only 1 turns it off.
bool no_caching_value_applies(const Env &env, const Outcome &, const TorchVersion &) {
  return env.no_caching && *env.no_caching != "1";
}
std::string no_caching_value_text(const Env &env, const Outcome &) {
  return std::string(kNoCachingVar) + "=" + quote(*env.no_caching) +
         " turns the CUDA caching allocator off in this release, whatever the value: every "
         "allocation is a cudaMalloc and every free a synchronising cudaFree (unset it to keep "
         "caching)";
}

// ---- pytorch#147851 (2025-02): expandable segments do not work for a torch.cuda.MemPool with a
// custom allocator (CUDAPluggableAllocator, as vLLM's sleep mode and torch_memory_saver use); PR
// #148378 (2025-03) made the allocator raise instead. From 2.10 the allocator leaves expandable
// segments out of such pools by itself: `is_expandable_segments_active = expandable_segments() &&
// !active_user_pool` with active_user_pool = a private pool that has an allocator
// (CUDACachingAllocator.cpp, quoted in PR #185818), so no advice is needed there.
bool user_pool_applies(const Env &env, const Outcome &o, const TorchVersion &v) {
  return expandable_set(o) && !caching_off(env, v);
}
std::string user_pool_text(const Env &, const Outcome &o) {
  return "expandable_segments:True (" + source_of(o, Key::ExpandableSegments) +
         "): a torch.cuda.MemPool with a custom allocator (vLLM's sleep mode, torch_memory_saver) "
         "does not work with expandable segments in this release: turn them off inside the pool, "
         "e.g. with cumemguard.expandable_segments(False), which keeps every other setting";
}

// ---- PR #130890 (2024-07, "Support IPC for Expandable Segments"): before it, a tensor in an
// expandable segment cannot be shared with another process at all.
bool no_ipc_applies(const Env &env, const Outcome &o, const TorchVersion &v) {
  return expandable_set(o) && !caching_off(env, v);
}
std::string no_ipc_text(const Env &, const Outcome &o) {
  return "expandable_segments:True (" + source_of(o, Key::ExpandableSegments) +
         "): this release cannot share tensors of expandable segments between processes "
         "(torch.multiprocessing, CUDA IPC)";
}

// Every release: with caching off, the allocator configuration has no effect on CUDA memory.
bool uncached_applies(const Env &env, const Outcome &o, const TorchVersion &v);
std::string uncached_text(const Env &env, const Outcome &o);

// The table. Keep rows ordered by the first release they concern.
const VersionRule kRules[] = {
    {"expandable-max-split-assert", "", "2.3.0", Severity::Warning, true, "pytorch#119452",
     "fixed by PR #120022, first in 2.3.0", max_split_assert_applies, max_split_assert_text,
     nullptr},
    {"expandable-near-oom-assert", "", "2.5.0", Severity::Warning, true, "PR #134338",
     "first in 2.5.0", near_oom_applies, near_oom_text, nullptr},
    {"no-caching-any-value", "", "2.7.0", Severity::Warning, true, "pytorch#145661",
     "fixed by PR #145905, first in 2.7.0, which reads the value", no_caching_value_applies,
     no_caching_value_text, nullptr},
    {"expandable-ipc-unsupported", "2.1.0", "2.5.0", Severity::Note, false, "PR #130890",
     "IPC for expandable segments, first in 2.5.0", no_ipc_applies, no_ipc_text, nullptr},
    {"mempool-custom-allocator", "2.1.0", "2.10.0", Severity::Warning, false, "pytorch#147851",
     "from 2.10.0 pools with a custom allocator do not use expandable segments (PR #185818 quotes "
     "the code)",
     user_pool_applies, user_pool_text, nullptr},
    {"cuda-variable-deprecated", "2.8.0", "2.11.0", Severity::Note, false, "pytorch#183387",
     "2.11.0 prints no such warning", deprecated_applies, deprecated_text, nullptr},
    {"unified-variable-ignored", "2.9.0", "2.10.0", Severity::Warning, true, "pytorch#183387",
     "reported on 2.9.1; 2.10.0 and 2.11.0 honour PYTORCH_ALLOC_CONF", unified_ignored_applies,
     unified_ignored_text, unified_ignored_adjust},
    {"expandable-max-split-growth", "", "", Severity::Warning, false, "pytorch#123548",
     "fix proposed in PR #193400, in no release yet", growth_applies, growth_text, nullptr},
    {"caching-off", "", "", Severity::Warning, false, "",
     "by design: the variable bypasses the cache for debugging with a memory checker",
     uncached_applies, uncached_text, nullptr},
};

bool uncached_applies(const Env &env, const Outcome &o, const TorchVersion &v) {
  return caching_off(env, v) &&
         std::any_of(o.source.begin(), o.source.end(), [](Var s) { return s != Var::None; });
}
std::string uncached_text(const Env &env, const Outcome &) {
  return std::string(kNoCachingVar) + "=" + quote(*env.no_caching) +
         " turns the caching allocator off: every allocation is a cudaMalloc of its own, so "
         "the allocator settings (expandable_segments, max_split_size_mb, ...) have no effect";
}

bool at_or_after(const TorchVersion &v, std::string_view bound) {
  return bound.empty() || v >= torch_version(bound);
}

}  // namespace

bool VersionRule::covers(const TorchVersion &v) const {
  return at_or_after(v, since) && (until.empty() || v < torch_version(until));
}

std::span<const VersionRule> version_rules() {
  return kRules;
}

bool caching_off(const Env &env, const TorchVersion &v) {
  if (!env.no_caching) return false;
  return v < torch_version("2.7.0") || *env.no_caching == "1";
}

std::string Judgement::summary() const {
  std::string s = "torch " + version.text + " (" + source + "): ";
  const std::string row(grammar.release);
  switch (grammar.fit) {
    case Fit::Newer:
      return s + "newer than every modelled release: judged with the newest grammar known (" + row +
             ", the main branch after " + std::string(grammars()[grammars().size() - 2].release) +
             "); keys it does not know are kept and not judged";
    case Fit::Older:
      return s + "older than the oldest modelled release (" + row + "): judged with the " + row +
             " grammar; that release's own keys, messages and variables are not modelled";
    case Fit::Exact:
      break;
  }
  if (!grammar.released)
    s += "not released: the keys of the main branch after " +
         std::string(grammars()[grammars().size() - 2].release) + " (" +
         std::string(grammar.source) + "), judged as the next release";
  else
    s += "the " + row + " grammar and its known problems";
  if (!grammar.not_modelled.empty()) s += "; not modelled: " + std::string(grammar.not_modelled);
  return s;
}

Judgement judge(const Env &env, const TorchVersion &v, std::string source) {
  Judgement j;
  j.version = v;
  j.source = std::move(source);
  j.grammar = grammar_for(v);
  j.exact = j.grammar.fit == Fit::Exact && j.grammar.not_modelled.empty();
  const Outcome o = evaluate(env, j.grammar);
  j.outcome = o;
  // The rows that change the value first (what the release really gets), then every row in table
  // order: a changing row on the grammar's value, the others on the changed one (2.9.1 with
  // expandable_segments:True from PYTORCH_ALLOC_CONF has them off, so no row about them applies).
  for (const VersionRule &r : kRules)
    if (r.adjust && !o.error && r.covers(v) && r.applies(env, o, v)) r.adjust(j.outcome);
  for (const VersionRule &r : kRules) {
    const Outcome &basis = r.adjust ? o : j.outcome;
    if (!r.covers(v) || !r.applies(env, basis, v)) continue;
    std::string why =
        r.bug.empty() ? std::string(r.fix) : std::string(r.bug) + "; " + std::string(r.fix);
    j.known.push_back(KnownProblem{&r, r.text(env, basis) + " (" + why + ")"});
  }
  return j;
}

}  // namespace cmg::torchconf
