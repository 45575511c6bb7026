// SPDX-License-Identifier: Apache-2.0
// The rewrite of PyTorch's allocator variables: CUMEMGUARD_TORCH_ALLOC_CONF overrides merged into
// the variable each key's parser reads, keeping every other byte verbatim, and the shim's plan
// (which variables to write, or why it refuses), checked by evaluating the result.
#include <utility>

#include "torch_conf_impl.h"

namespace cmg::torchconf {
using namespace impl;

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
  return plan(env, overrides, default_grammar());
}

Plan plan(const Env &env, std::string_view overrides, const Grammar &g) {
  Plan p;
  p.before = evaluate(env, g);
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
  for (const Override &o : po.items) {
    if (!o.known)
      return refuse("CUMEMGUARD_TORCH_ALLOC_CONF: unknown key " + quote(o.key) + key_hint(o.key) +
                    " (PyTorch would raise ValueError: Unrecognized key '" + o.key +
                    "' in CUDA allocator config.)");
    if (!g.knows(*o.known))
      return refuse("CUMEMGUARD_TORCH_ALLOC_CONF: " + quote(o.key) + " is not a key of torch " +
                    std::string(g.release) + " (first parsed by " +
                    std::string(key_info(*o.known).first) + ")");
  }
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
      if (reader(q, next, g).var != v) continue;
      if (!readers.empty()) readers += ", ";
      readers.append(parser_name(q));
    }
    w.why = std::string(w.create ? "created; " : "") + "read by parser" +
            (readers.find(',') == std::string::npos ? " " : "s ") + readers + " for " + text;
    p.writes.push_back(std::move(w));
  }

  p.after = evaluate(next, g);
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
      c.g = &g;
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
    if (!g.knows(k.key)) continue;
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
