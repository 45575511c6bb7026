// SPDX-License-Identifier: Apache-2.0
// Diagnostics of the PyTorch allocator-config model: every problem of an environment on one line
// each (what PyTorch will do about it: abort at import, an exception at the first allocation,
// values it ignores), hints (case of booleans and keys, hidden or unmerged variables, quirks of
// stoull and checkToken), and a variable changed after `import torch` (bug-patterns.md P21).
#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <stdexcept>

#include "options.h"
#include "torch_conf_impl.h"

namespace cmg::torchconf {
namespace impl {

std::string structural_cause(const std::vector<Token> &toks, std::size_t key) {
  const std::string k = key < toks.size() ? toks[key].text : "";
  if (key + 1 >= toks.size()) return quote(k) + " has no ':' and value";
  if (key + 2 >= toks.size()) return quote(k + toks[key + 1].text) + " has no value";
  return "the '[' after " + quote(k + toks[key + 1].text) + " is never closed";
}

std::string key_hint(std::string_view key) {
  std::string best;
  std::size_t best_d = 3;
  for (const KeyInfo &k : keys()) {
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

}  // namespace impl

using namespace impl;

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

// " (a key of 2.12 and later)" for a key another release parses.
std::string release_hint(const std::optional<Key> &k, const Grammar &g) {
  if (!k) return "";
  const KeyInfo &i = key_info(*k);
  std::string r = " (a key of " + std::string(i.first);
  r += i.last.empty() ? " and later" : i.last == i.first ? " only" : " to " + std::string(i.last);
  r += "; this is " + std::string(g.release) + ")";
  return r;
}

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
  if (by_a && o.grammar.large_segment_prepass) {
    for (std::size_t i = 0; i < n; ++i) {
      if (toks[i].text != "large_segment_size_mb") continue;
      Ctx c{&base};
      c.g = &o.grammar;
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
    const std::optional<Key> k = find_key(key, o.grammar);
    const bool outcome_here = is_error_var && o.error_key_index == key_i;
    if (!k) {
      const std::optional<Key> other = find_key(key);
      if (o.grammar.opaque_unknown)
        ;  // a key a newer release may have added: noted by the parser, not an error
      else if (!outcome_here && (by_c || by_a))
        out.push_back({Severity::Error, at + "unknown key " + quote(key) +
                                            release_hint(other, o.grammar) + key_hint(key) + ": " +
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
        c.g = &o.grammar;
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

namespace {

// TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC (PR #169487): c10::utils::check_env, read once when the first
// expandable segment is mapped.
void expandable_ipc_problems(const Env &env, const Outcome &o, std::vector<Problem> &out) {
  if (!env.expandable_ipc) return;
  const std::string &v = *env.expandable_ipc;
  const std::string name(kExpandableIpcVar);
  if (v != "0" && v != "1") {
    out.push_back(
        {Severity::Warning, name + "=" + quote(v) +
                                ": PyTorch accepts only 0 or 1, prints \"Ignoring invalid "
                                "value for boolean flag\" and keeps the default (on)"});
    return;
  }
  if (v == "0" && o.settings.expandable_segments && o.load_backend == Backend::Native)
    out.push_back({Severity::Warning,
                   name + "=0 with expandable segments on: PyTorch makes its segments without a "
                          "shareable handle type, so their tensors cannot be shared between "
                          "processes (torch.multiprocessing raises \"cannot be shared between "
                          "processes\")"});
}

}  // namespace

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
  } else if (env.hip && o.grammar.family == Family::Split) {
    out.push_back({Severity::Note,
                   "PYTORCH_HIP_ALLOC_CONF feeds only parser A on a CUDA build (max_split_size_mb, "
                   "expandable_segments, ...); backend and the CUDA keys come from " +
                       where_read(o, Parser::Cuda)});
  }
  if (o.grammar.family == Family::Legacy) {
    for (Var other : {Var::Hip, Var::Alloc})
      if (env.get(other))
        out.push_back({Severity::Warning, std::string(var_name(other)) + "=" +
                                              quote(*env.get(other)) + " is ignored: torch " +
                                              std::string(o.grammar.release) +
                                              " reads only PYTORCH_CUDA_ALLOC_CONF"});
  }
  expandable_ipc_problems(env, o, out);
  // Item by item, every variable some parser reads (the 2.8+ grammar's items).
  for (Var v : kVars) {
    if (o.grammar.family == Family::Legacy) break;
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

bool fails_in_every_release(const Env &env) {
  for (const Grammar &g : grammars())
    if (!evaluate(env, g).error) return false;
  return true;
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
}  // namespace cmg::torchconf
