// SPDX-License-Identifier: Apache-2.0
// PyTorch's allocator configuration as a CUDA build of each release reads it: parse, validate,
// merge, plan. The grammar of 2.10+ is transliterated from c10 token by token and measured on
// torch 2.11 (docs/alloc-conf-agreement.md); what each release parses is the one table
// policy/torch_releases.def. Spec: docs/reference/pytorch-alloc-conf.md; releases:
// docs/torch-versions.md; test vectors: docs/reference/alloc-conf-vectors.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "torch_version.h"

namespace cmg::torchconf {

// ---- tokenizer (reference §3, ConfigTokenizer in c10/core/AllocatorConfig.h L35-128)

struct Token {
  std::string text;       // what PyTorch sees: whitespace removed
  std::size_t begin = 0;  // byte span in the input, whitespace inside a word included
  std::size_t end = 0;
};

// Exactly ConfigTokenizer's split: each of , : [ ] is a token, every isspace character is dropped
// (even inside a word), everything else accumulates.
std::vector<std::string> tokenize(std::string_view s);
// The same tokens with their byte spans (merge keeps the bytes between tokens verbatim).
std::vector<Token> tokenize_spans(std::string_view s);

// ---- the environment

enum class Var : unsigned char { None, Cuda, Hip, Alloc };
std::string_view var_name(Var v);  // "PYTORCH_CUDA_ALLOC_CONF", ...; "" for None
inline constexpr std::array<Var, 3> kVars = {Var::Cuda, Var::Hip, Var::Alloc};
inline constexpr std::string_view kNoCachingVar = "PYTORCH_NO_CUDA_MEMORY_CACHING";
inline constexpr std::string_view kExpandableIpcVar = "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC";

// Presence matters: PyTorch uses c10::utils::get_env, which returns optional, so a variable set to
// "" is present and wins over the next one (reference §2).
struct Env {
  std::optional<std::string> cuda, hip, alloc;
  // PYTORCH_NO_CUDA_MEMORY_CACHING: the caching allocator off, every allocation a cudaMalloc
  // (read by c10/cuda/CUDACachingAllocator.cpp; before 2.7 its presence alone, pytorch#145661).
  std::optional<std::string> no_caching;
  // TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC: read once per process (a function-local static in
  // ExpandableSegment::map, c10::utils::check_env: "1" on, "0" off, anything else warns and keeps
  // the default, on in public builds). Off: segments are made without a shareable handle type, so
  // their tensors cannot be shared between processes (PR #169487).
  std::optional<std::string> expandable_ipc;

  const std::optional<std::string> &get(Var v) const;  // Var::None: always nullopt
  std::optional<std::string> &get(Var v);              // v must not be Var::None
  bool operator==(const Env &) const = default;

  static Env from_lookup(const std::function<std::optional<std::string>(std::string_view)> &get);
  static Env from_envp(char *const *envp);
};

// ---- the three readers (reference §2)

enum class Parser : unsigned char {
  Load,  // L: BackendStaticInitializer::parseEnvForBackend, static init of libc10_cuda.so
  Cuda,  // C: CUDAAllocatorConfig::instance(), lazily at the first CUDA allocation
  Accel  // A: AcceleratorAllocatorConfig::instance(), lazily at the first CUDA allocation
};
std::string_view parser_name(Parser p);  // "L", "C", "A"
std::string_view parser_title(Parser p);

struct Read {
  Var var = Var::None;  // None: no variable present, defaults
  std::string reason;   // one line: why this variable
};
struct Grammar;
// Which variable a parser of a CUDA build reads (default: the 2.11 grammar).
Read reader(Parser p, const Env &env);
Read reader(Parser p, const Env &env, const Grammar &g);

// ---- keys (reference §4)

// One row per key in policy/torch_releases.def (appended, never reordered).
enum class Key : unsigned char {
#define TORCH_KEY(e, ...) e,
#include "torch_releases.def"
#undef TORCH_KEY
};
inline constexpr std::size_t kKeyCount = 0
#define TORCH_KEY(...) +1
#include "torch_releases.def"
#undef TORCH_KEY
    ;

// Reserve / ReserveList: parseReserveSpec's values (a fraction, or GiB with a G suffix); a
// malformed one only warns (TORCH_WARN) and keeps the default, unlike every other key.
enum class ValueKind : unsigned char {
  Bool,
  SizeMb,
  Count,
  Double,
  Divisions,
  Backend,
  Reserve,
  ReserveList
};

struct KeyInfo {
  Key key;
  std::string_view name;   // as written in the variable
  std::string_view alias;  // the ROCm spelling C also accepts on CUDA builds, or ""
  Parser owner;            // A or C (backend: C at runtime, L at load)
  ValueKind kind;
  std::string_view
      setting;            // name of the effective value (snapshot key where it is in the snapshot)
  bool in_snapshot;       // listed in torch.cuda.memory._snapshot()["allocator_settings"]
  std::string_view unit;  // "bytes", "MiB", "" ...
  std::string_view first;   // the first release that parses it ("2.11")
  std::string_view last;    // the last one, when a later release dropped it; "" = still parsed
  std::string_view source;  // where first/last were read (docs/torch-versions.md prints it)
  std::string_view help;
};

std::span<const KeyInfo> keys();
const KeyInfo &key_info(Key k);
// Exact, case-sensitive (PyTorch compares with ==); aliases map to their key. Without a grammar:
// a key of any modelled release.
std::optional<Key> find_key(std::string_view name);
// Only a key the release parses.
std::optional<Key> find_key(std::string_view name, const Grammar &g);

// ---- releases (policy/torch_releases.def, TORCH_RELEASE rows)

enum class Family : unsigned char {
  Legacy,  // one CUDAAllocatorConfig parser: lexArgs, consumeToken, TORCH_CHECK (2.0 to 2.7)
  Split    // ConfigTokenizer, parsers A and C (2.8 on)
};
// How the judged release relates to the rows: its own row, newer than the newest row (judged with
// the newest grammar known), or older than the oldest (judged with the oldest).
enum class Fit : unsigned char { Exact, Newer, Older };

struct Grammar {
  std::string_view release;  // the row: "2.11"
  Family family;
  bool large_segment_prepass;  // A reads large_segment_size_mb before the other keys (PR #172056)
  bool reset_non_split;        // A resets max_non_split_rounding_size each parse (PR #172056)
  bool accelerator_setter;     // torch._C._accelerator_setAllocatorSettings (PR #165291)
  bool released;               // false: the next release, keys of the main branch
  std::string_view source;
  std::string_view not_modelled;  // what that release is known to do otherwise ("" = nothing)
  Fit fit = Fit::Exact;
  // A release newer than every row: a key the newest grammar does not know may be one it added,
  // so it is skipped with a note instead of raising (the scoped rewrite keeps it verbatim).
  bool opaque_unknown = false;

  bool knows(Key k) const;  // the release parses the key (its first/last releases in the table)
  // The setter the Python package calls in this release.
  std::string_view setter_name() const;
  TorchVersion version() const;  // the row as a version ("2.11" -> 2.11.0)
};
std::span<const Grammar> grammars();  // every row, oldest first
const Grammar &default_grammar();     // 2.11: the measured one
const Grammar &newest_grammar();      // the newest row (the next release's keys)
// The row of the release (its major.minor), with fit and opaque_unknown set.
Grammar grammar_for(const TorchVersion &v);

enum class Backend : unsigned char { Native, CudaMallocAsync };
std::string_view backend_name(Backend b);

inline constexpr std::size_t kRoundupIntervals = 16;  // kRoundUpPowerOfTwoIntervals

// Effective values in PyTorch's own units (bytes where PyTorch stores bytes).
struct Settings {
  // Parser A (AcceleratorAllocatorConfig)
  std::uint64_t large_segment_size = 20ull << 20;
  std::uint64_t max_split_size = UINT64_MAX;  // SIZE_MAX: snapshot shows -1
  std::uint64_t max_non_split_rounding_size = 20ull << 20;
  double garbage_collection_threshold = 0.0;
  std::array<std::uint64_t, kRoundupIntervals> roundup_power2_divisions{};
  bool expandable_segments = false;
  bool pinned_use_background_threads = false;
  std::string last_allocator_settings;  // snapshot key "PYTORCH_CUDA_ALLOC_CONF"
  // Parser C (CUDAAllocatorConfig)
  Backend backend = Backend::Native;
  bool release_lock_on_cudamalloc = false;
  bool pinned_use_cuda_host_register = false;
  std::uint64_t pinned_num_register_threads = 1;
  std::uint64_t pinned_reserve_segment_size_mb = 0;
  bool graph_capture_record_stream_reuse = false;
  double per_process_memory_fraction = 1.0;
  bool throw_on_cudamalloc_oom = false;  // 2.12
  bool pinned_free_catch_all = false;    // 2.12
  // expandable_segments_reserve / _by_class: the accepted text ("0.5", "40G"; "[a:0.5,b:40G]"
  // as the entries kept), "" = the default (the historical 9/8 of device memory).
  std::string expandable_segments_reserve;
  std::string expandable_segments_reserve_by_class;
  std::uint64_t roundup_bypass_threshold = UINT64_MAX;  // 2.0 only

  bool operator==(const Settings &) const = default;
};

// The effective value as Python prints it: "536870912", "-1" (max_split_size is shown as int64),
// "0.8", "True", "native", "[1, 1, ...]" (16 divisions, index i = interval starting at 2^i MiB).
std::string effective_text(const Settings &s, Key k);
// Snapshot value of max_split_size: int64_t(size_t) as PyTorch stores it (SIZE_MAX -> -1).
std::int64_t snapshot_max_split_size(const Settings &s);

// ---- errors and outcomes (reference §7)

enum class ErrorType : unsigned char { ValueError, RuntimeError };
std::string_view error_type_name(ErrorType t);

struct TorchError {
  ErrorType type = ErrorType::ValueError;
  std::string message;  // the text PyTorch composes (TORCH_CHECK_VALUE text, "stoull", assert text)
  // TORCH_INTERNAL_ASSERT failures: c10 prefixes the condition and the site.
  bool internal_assert = false;
  std::string assert_condition;  // "" when not known
  std::string assert_site;       // "\"/pytorch/c10/core/AllocatorConfig.h\":124", "" when not known

  // c10::Error::what() without the backtrace ("… INTERNAL ASSERT FAILED at …, please report a bug
  // to PyTorch. <message>" for asserts; unknown parts are shown as "…").
  std::string what() const;
  // The last line of the Python traceback: "ValueError: <what()>".
  std::string python() const;
  bool operator==(const TorchError &) const = default;
};

enum class OutcomeClass : unsigned char {
  Ok,           // effective settings
  Exception,    // [E] a Python exception at the first CUDA allocation
  ImportAbort,  // [I] std::terminate during `import torch` (parser L)
};
std::string_view outcome_name(OutcomeClass c);  // "ok", "exception", "import-abort"

struct Outcome {
  OutcomeClass cls = OutcomeClass::Ok;
  // Exception / ImportAbort: what is raised. With cls Ok it is a deferred error (see `deferred`).
  std::optional<TorchError> error;
  Parser error_parser = Parser::Load;
  Var error_var = Var::None;
  std::size_t error_key_index = 0;  // token index of the key being parsed when it failed

  // backend:cudaMallocAsync chosen at import: allocations never consult A and C (measured on
  // torch 2.11), so their parse, and any error in it, waits for the first call that reads the
  // configuration, e.g. torch._C._accelerator_setAllocatorSettings (then A before C).
  bool deferred = false;

  Read load, cuda, accel;  // which variable each parser read, and why
  Backend load_backend = Backend::Native;
  Settings settings;                    // effective when Ok; as far as parsed otherwise
  std::array<Var, kKeyCount> source{};  // variable that set each key, Var::None = default
  std::vector<std::string> warnings;    // what PyTorch itself would print (TORCH_WARN)

  // The grammar that produced it (grammar_for of the judged release; default_grammar()).
  Grammar grammar = default_grammar();

  const Read &read(Parser p) const;
};

// What a CUDA build does with this environment: L at import, then at the first CUDA allocation C,
// then A (A, then C, and later, under cudaMallocAsync: see Outcome::deferred). Without a grammar:
// torch 2.11's (default_grammar()); a legacy grammar (2.0 to 2.7) has one parser, shown as C.
Outcome evaluate(const Env &env);
Outcome evaluate(const Env &env, const Grammar &g);
// The same when the environment changed between `import torch` and the first allocation (case P21):
// L reads `at_import`, C and A read `at_first_allocation`.
Outcome evaluate(const Env &at_import, const Env &at_first_allocation);
Outcome evaluate(const Env &at_import, const Env &at_first_allocation, const Grammar &g);

// ---- runtime setter model (reference §5, §6; vectors S4-S8)

enum class SetterApi : unsigned char {
  Accelerator,     // torch._C._accelerator_setAllocatorSettings(s)
  DeprecatedCuda,  // torch.cuda.memory._set_allocator_settings(s): from 2.10 a FutureWarning and
                   // the same call; before 2.10 the only setter, without a warning
};

struct Runtime {
  Settings settings;
  Backend load_backend = Backend::Native;
  Grammar grammar = default_grammar();  // the release whose setter is modelled
};
// The allocator state of a process whose environment parsed as `o` (must be Ok).
Runtime runtime_from(const Outcome &o);

struct SetResult {
  std::optional<TorchError> error;    // raised in Python; fields parsed before it stay applied
  std::vector<std::string> warnings;  // FutureWarning and TORCH_WARN texts
};
// setAllocatorSettings(s) = A.parseArgs(s), then C.parseArgs(s) (header L365-368); A resets
// max_split_size, roundup_power2_divisions, garbage_collection_threshold and
// max_non_split_rounding_size, nothing else; not transactional.
SetResult set_allocator_settings(Runtime &rt, std::string_view s,
                                 SetterApi api = SetterApi::Accelerator);

// ---- diagnostics

enum class Severity : unsigned char { Error, Warning, Note };
std::string_view severity_name(Severity s);

struct Problem {
  Severity severity;
  std::string text;  // one line, naming the variable
};

// Every problem of the environment, one line each: what PyTorch will do about it (abort at import,
// exception, ignored values), and hints (lower-case true, case of keys, hidden or unmerged
// variables, keys the HIP variable carries that parser C does not see, quirks of stoull and
// checkToken).
std::vector<Problem> diagnose(const Env &env, const Outcome &o);
std::vector<Problem> diagnose(const Env &env);
// Whether every modelled release fails on the environment (an abort at import, an exception at the
// first allocation or at the first settings call): what the shim can say before it knows the
// release.
bool fails_in_every_release(const Env &env);
// Case P21: the allocator variables changed after `import torch`.
std::vector<Problem> diagnose_change(const Env &at_import, const Env &now);

// ---- merge

// One override: "key:value", "key:[list]" or "-key".
struct Override {
  bool remove = false;
  std::string key;    // as written (spaces removed)
  std::string value;  // canonical text of the value ("False", "[256:1,>:4]"); empty for removal
  std::optional<Key> known;
};
struct OverridesParse {
  std::vector<Override> items;
  std::string error;  // empty when well formed
};
// Overrides are comma-separated items; empty items and a trailing comma are allowed.
OverridesParse parse_overrides(std::string_view overrides);

struct MergeResult {
  std::string value;  // the merged text (the original when there is an error)
  std::string error;  // empty on success
  bool ok() const { return error.empty(); }
};
// Applies the overrides to `original` in order, keeping every other byte verbatim:
// * "key:value" replaces the value of EVERY occurrence of the key (aliases included) in place, or
//   appends ",key:value" when the key is absent;
// * "-key" removes every occurrence with one adjacent separator.
// merge(x, "") == x byte for byte. An original whose items cannot be delimited the way PyTorch
// walks them (it would abort at import) is an error.
MergeResult merge(std::string_view original, std::string_view overrides);

// ---- the shim's plan

struct Write {
  Var var = Var::None;
  bool create = false;                   // the variable was not present
  std::optional<std::string> old_value;  // nullopt when created
  std::string new_value;
  std::string why;  // which parser reads it for which keys
};

enum class PlanAction : unsigned char { None, Write, Refuse };
std::string_view plan_action_name(PlanAction a);  // "none", "write", "refuse"

struct Plan {
  PlanAction action = PlanAction::None;
  std::vector<Write> writes;      // Write: set these (in order); otherwise empty
  std::string reason;             // one line: why None / why Refuse / what Write does
  std::vector<Problem> problems;  // of the original environment
  Outcome before;
  std::optional<Outcome> after;  // the environment with the writes applied, when computed
};

// Pure: the shim applies `writes` with setenv() before PyTorch starts. On Refuse it keeps the
// original environment and reports a `config` finding with `reason`.
Plan plan(const Env &env, std::string_view overrides);
Plan plan(const Env &env, std::string_view overrides, const Grammar &g);
Env apply(const Env &env, const Plan &p);

}  // namespace cmg::torchconf
