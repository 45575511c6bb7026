// SPDX-License-Identifier: Apache-2.0
// The linear model under concurrency, deterministically: two threads' calls are cut into the steps
// a hook runs (begin_free → hold or driver → end; held()'s release: take the oldest → driver →
// given_back; an allocation: driver → on_alloc), and every interleaving of the steps is run on a
// fresh model and a small driver that issues the address it freed last first (real-driver.md
// D18). Each interleaving must end with
//   * no legitimate free judged anything but Live (never a double free),
//   * no double free forwarded to the driver (every one is skipped, proven or confirmed), and no
//     free the driver sees twice,
//   * the counts exact: the model's live allocations are the driver's, less the frees held back.
#include <catch2/catch.hpp>

#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tracker.h"

using namespace cmg;

namespace {

constexpr KindMask kDev = kind_bit(MemKind::Linear);
constexpr std::uint64_t kBase = 0x7f6000000000, kStep = 0x200000;

// The driver: addresses live in it, the last freed issued first.
struct Driver {
  std::set<std::uint64_t> live;
  std::vector<std::uint64_t> freed;
  std::uint64_t next = kBase;
  std::uint64_t alloc() {
    std::uint64_t p;
    if (!freed.empty()) {
      p = freed.back();
      freed.pop_back();
    } else {
      p = next;
      next += kStep;
    }
    live.insert(p);
    return p;
  }
  // false: the address was not live (a double free reached the driver)
  bool free(std::uint64_t p) {
    if (!live.erase(p)) return false;
    freed.push_back(p);
    return true;
  }
};

struct HeldEntry {
  std::uint64_t ptr;
  std::uint32_t gen;
};

struct World {
  std::unique_ptr<LinearModel> m = std::make_unique<LinearModel>();
  Driver drv;
  std::deque<HeldEntry> held;  // the shim's held frees, oldest first
  Options opts;                // guard mode
  std::uint64_t seq = 0;
  std::uint64_t vars[4] = {};  // the program's pointers, by name
  std::vector<std::string> wrong;
  EventRef ev(const char *api, std::uint32_t tid) {
    ++seq;
    return EventRef{seq, seq, tid, 0, api};
  }
};

// One thread's state between its steps.
struct Ctx {
  std::uint32_t tid;
  LinearTicket t;
  std::uint64_t ptr = 0;
  HeldEntry popped{0, 0};
  bool ok = false;
};

using Step = std::function<void(World &, Ctx &)>;

// The program's calls, each cut into its steps.
void alloc(std::vector<Step> &s, int var) {
  s.push_back([](World &w, Ctx &c) { c.ptr = w.drv.alloc(); });
  s.push_back([var](World &w, Ctx &c) {
    w.m->on_alloc(LinearRec{c.ptr, 0x100, 0, MemKind::Linear, w.ev("cudaMalloc", c.tid)});
    w.vars[var] = c.ptr;
  });
}

// No VMM reservations here.
constexpr const VmmModel *no_vmm = nullptr;

// `hold`: the kinds the quarantine holds (their record is Held at once).
void begin_legit(World &w, Ctx &c, int var, KindMask hold = 0) {
  c.t = w.m->begin_free(w.vars[var], kDev, w.ev("cudaFree", c.tid), w.opts, no_vmm, hold);
  if (c.t.cls != FreeClass::Live)
    w.wrong.push_back("legitimate free of var " + std::to_string(var) + " judged " +
                      std::to_string(static_cast<int>(c.t.cls)));
}

// A free forwarded to the driver; `refused`: the driver refuses it (an injected fault).
void free_fwd(std::vector<Step> &s, int var, bool refused = false) {
  s.push_back([var](World &w, Ctx &c) { begin_legit(w, c, var); });
  s.push_back([refused](World &w, Ctx &c) {
    if (c.t.cls != FreeClass::Live) return;
    c.ok = !refused && w.drv.free(c.t.rec.ptr);
    if (!refused && !c.ok) w.wrong.push_back("a legitimate free reached a dead address");
  });
  s.push_back([](World &w, Ctx &c) { w.m->end(c.t, c.ok); });
}

// A free the shim holds back: Held at once by begin_free (the quarantine), or marked Held after
// it (`later`: a deferred flush), then queued.
void free_held(std::vector<Step> &s, int var, bool later = false) {
  s.push_back([var, later](World &w, Ctx &c) { begin_legit(w, c, var, later ? 0 : kDev); });
  s.push_back([](World &w, Ctx &c) {
    c.popped = {c.t.rec.ptr, c.t.holding ? c.t.gen : w.m->mark_held(c.t)};
  });
  s.push_back([](World &w, Ctx &c) { w.held.push_back(c.popped); });
}

// held() gives its oldest free to the driver (release_down_to).
void release(std::vector<Step> &s) {
  s.push_back([](World &w, Ctx &c) {
    c.popped = {0, 0};
    if (w.held.empty()) return;
    c.popped = w.held.front();
    w.held.pop_front();
  });
  s.push_back([](World &w, Ctx &c) {
    if (c.popped.ptr && !w.drv.free(c.popped.ptr))
      w.wrong.push_back("a held free reached a dead address");
  });
  s.push_back([](World &w, Ctx &c) {
    if (c.popped.ptr) w.m->given_back(c.popped.ptr, c.popped.gen);
  });
}

// The program's bug: a second free of var. Judged a double free and skipped, proven (held) or
// confirmed with the driver's view; never forwarded.
void misuse(std::vector<Step> &s, int var) {
  s.push_back([var](World &w, Ctx &c) {
    c.ptr = w.vars[var];
    c.t = w.m->begin_free(c.ptr, kDev, w.ev("cudaFree", c.tid), w.opts, no_vmm);
    if (c.t.cls != FreeClass::DoubleFree) w.wrong.push_back("a double free judged otherwise");
  });
  s.push_back([](World &w, Ctx &c) {
    if (c.t.decision.confirm) {
      DriverView v;
      v.live = w.drv.live.count(c.ptr) ? DriverView::Live::Yes : DriverView::Live::No;
      confirmed(v, c.t.decision);
    }
    if (!c.t.skip()) {
      w.wrong.push_back(std::string("a double free forwarded (held: ") + (c.t.held ? "yes" : "no") +
                        ")");
      c.ok = w.drv.free(c.ptr);
      w.m->end(c.t, c.ok);
    }
  });
}

struct Scenario {
  const char *name;
  std::vector<Step> a, b;
};

void check_end(World &w) {
  std::size_t held_live = 0;
  for (const HeldEntry &h : w.held) held_live += w.drv.live.count(h.ptr);
  if (held_live != w.held.size()) w.wrong.push_back("a held free's memory is not live");
  if (w.m->live_count() != w.drv.live.size() - w.held.size())
    w.wrong.push_back("model live " + std::to_string(w.m->live_count()) + ", driver live " +
                      std::to_string(w.drv.live.size()) + " with " + std::to_string(w.held.size()) +
                      " held");
  w.m->for_each_live([&](const LinearRec &r) {
    if (!w.drv.live.count(r.ptr)) w.wrong.push_back("the model holds a dead address live");
  });
}

// Runs every interleaving of the two threads' steps; returns how many, and the first failure.
std::size_t run_all(const Scenario &sc, std::string &failure) {
  const std::size_t na = sc.a.size(), nb = sc.b.size();
  std::size_t runs = 0;
  std::vector<int> order;
  std::function<void(std::size_t, std::size_t)> rec = [&](std::size_t i, std::size_t j) {
    if (!failure.empty()) return;
    if (i == na && j == nb) {
      World w;
      Ctx ca{1, {}}, cb{2, {}};
      std::size_t x = 0, y = 0;
      for (int who : order) {
        if (who == 0)
          sc.a[x++](w, ca);
        else
          sc.b[y++](w, cb);
      }
      check_end(w);
      ++runs;
      if (!w.wrong.empty()) {
        failure = std::string(sc.name) + ": " + w.wrong.front() + " in order ";
        for (int who : order) failure += who ? 'b' : 'a';
      }
      return;
    }
    if (i < na) {
      order.push_back(0);
      rec(i + 1, j);
      order.pop_back();
    }
    if (j < nb) {
      order.push_back(1);
      rec(i, j + 1);
      order.pop_back();
    }
  };
  rec(0, 0);
  return runs;
}

std::size_t binomial(std::size_t n, std::size_t k) {
  std::size_t r = 1;
  for (std::size_t i = 1; i <= k; ++i) r = r * (n - k + i) / i;
  return r;
}

}  // namespace

TEST_CASE("Linear interleavings: holding, releasing and issuing again the same addresses") {
  // Thread a holds its free and frees another allocation; thread b releases the held free and
  // allocates the address again (the driver's last-freed-first), holds it and releases it.
  Scenario sc{"hold-release-reissue", {}, {}};
  alloc(sc.a, 0);
  free_held(sc.a, 0);
  alloc(sc.a, 1);
  free_fwd(sc.a, 1);
  release(sc.b);
  alloc(sc.b, 2);
  free_held(sc.b, 2);
  release(sc.b);
  std::string failure;
  const std::size_t runs = run_all(sc, failure);
  CHECK(failure == "");
  CHECK(runs == binomial(sc.a.size() + sc.b.size(), sc.a.size()));
}

TEST_CASE("Linear interleavings: refused frees put back amid holds and re-issues") {
  Scenario sc{"refused", {}, {}};
  alloc(sc.a, 0);
  free_fwd(sc.a, 0, true);  // refused: live again
  free_held(sc.a, 0, true);
  release(sc.a);
  alloc(sc.b, 1);
  free_fwd(sc.b, 1, true);
  free_fwd(sc.b, 1);
  std::string failure;
  const std::size_t runs = run_all(sc, failure);
  CHECK(failure == "");
  CHECK(runs == binomial(sc.a.size() + sc.b.size(), sc.a.size()));
}

TEST_CASE("Linear interleavings: a second free of a held address while it is given back") {
  // Thread a frees twice an address it holds; thread b gives the held free to the driver
  // meanwhile (and frees its own allocation, made before). Whether a's second free meets the
  // record held, held while the driver frees it, or freed, it is skipped: proven while held,
  // confirmed with the driver's view once given back.
  Scenario sc{"double-free-while-released", {}, {}};
  alloc(sc.a, 0);
  free_held(sc.a, 0);
  misuse(sc.a, 0);
  misuse(sc.a, 0);
  alloc(sc.b, 1);
  release(sc.b);
  free_fwd(sc.b, 1);
  std::string failure;
  const std::size_t runs = run_all(sc, failure);
  CHECK(failure == "");
  CHECK(runs == binomial(sc.a.size() + sc.b.size(), sc.a.size()));
}
