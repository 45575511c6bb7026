// SPDX-License-Identifier: Apache-2.0
// The VMM model under concurrency, deterministically: two or three threads' calls are cut into the
// steps a hook runs (model begin → driver → model end for the calls that take something away;
// driver → model commit for the calls that issue something), and every interleaving of the steps
// is run — all of them for two threads, a fixed-seed sample for three. The driver is the fake
// (tests/fakecuda, real-driver.md rules: handle values and ranges re-issued last released first,
// D3, D6, D12, D13). Each interleaving runs in a child process on a fresh driver, and must end with
//   * no legitimate call refused (every call of the program's own lifecycle returns SUCCESS),
//   * no redundant or stale release forwarded to the driver (they are skipped),
//   * the model equal to the driver: live handle references, allocations, mappings, reservations,
//     and each value the model holds live is live in the driver.
#include <catch2/catch.hpp>
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fakecuda.h"
#include "tracker.h"

using namespace cmg;

namespace {

constexpr std::uint64_t G = 2ull << 20;  // the fake's granularity (real-driver.md D19)

// Named variables of a scenario: handle values and reservation bases, shared by its threads.
struct Vars {
  std::uint64_t h[8] = {};
  std::uint64_t r[8] = {};
};

enum class OpKind { Create, Reserve, Map, Unmap, Release, Retain, AddressFree };

struct Op {
  OpKind kind;
  int h = -1, r = -1;   // variable indices
  bool misuse = false;  // the program's bug: must be skipped, never reach the driver
  bool fail = false;    // the driver refuses this call (an injected fault)
  bool racy = false;    // legitimate, but the driver may refuse it (the other thread's call won)
};

// One thread of a scenario: its calls, cut into steps.
struct Thread {
  std::uint32_t tid;
  std::vector<Op> ops;
  ThreadVmmState ts;
  std::size_t op = 0;
  int step = 0;
  VmmTicket ticket;
  CUresult res = CUDA_SUCCESS;
  bool called = false;
  EventRef issue_ev;  // an issuing call's stamp, taken at its first step
  bool waiting = false;  // inside confirm_ticket's settle
};

int steps_of(OpKind k) {
  switch (k) {
    case OpKind::Create:
    case OpKind::Reserve:
    case OpKind::Retain: return 2;  // driver, commit
    default: return 3;              // begin, driver, end
  }
}

int total_steps(const Thread &t) {
  int n = 0;
  for (const Op &o : t.ops) n += steps_of(o.kind);
  return n;
}

struct World {
  ByteCounters counters;
  VmmModel m{counters};
  Options opts;  // guard mode
  Vars v;
  std::uint64_t seq = 0;
  std::vector<std::string> errors;

  EventRef ev(const char *api, std::uint32_t tid) {
    ++seq;
    return EventRef{seq, seq, tid, 0, api};
  }

  static CUresult create(std::uint64_t *h) {
    CUmemAllocationProp p{};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    CUmemGenericAllocationHandle out = 0;
    CUresult r = cuMemCreate(&out, G, &p, 0);
    *h = out;
    return r;
  }

  std::vector<Thread> *threads = nullptr;  // all of the schedule's threads (settle)

  VmmTicket begin(Thread &t, const Op &o, std::uint64_t h, std::uint64_t r) {
    switch (o.kind) {
      case OpKind::Map: return m.begin_map(r, G, 0, h, ev("cuMemMap", t.tid), t.ts, opts);
      case OpKind::Unmap: return m.begin_unmap(r, G, ev("cuMemUnmap", t.tid), t.ts, opts);
      case OpKind::Release: return m.begin_release(h, ev("cuMemRelease", t.tid), t.ts, opts);
      case OpKind::AddressFree:
        return m.begin_address_free(r, G, ev("cuMemAddressFree", t.tid), t.ts, opts);
      default: return VmmTicket{};
    }
  }

  // The other threads' calls in flight whose effect the driver and the model have not both seen
  // complete now, as they would while the shim's release waits for them (InFlightCalls::settle):
  // an issuing call the driver answered (its commit), a release the model noted (its driver call
  // and end). Returns whether there was one. A thread waiting itself is not in flight.
  static bool in_flight(const Thread &o) {
    if (o.waiting || o.op >= o.ops.size()) return false;
    const OpKind k = o.ops[o.op].kind;
    return (steps_of(k) == 2 && o.step == 1) || (k == OpKind::Release && o.step >= 1);
  }
  bool others_in_flight(const Thread &me) const {
    for (const Thread &o : *threads)
      if (&o != &me && in_flight(o)) return true;
    return false;
  }
  bool settle(Thread &waiting) {
    bool any = false;
    waiting.waiting = true;
    for (Thread &o : *threads) {
      if (&o == &waiting || !in_flight(o)) continue;
      any = true;
      const std::size_t op = o.op;
      while (o.op == op) step(o);
    }
    waiting.waiting = false;
    return any;
  }

  // Runs the next step of thread t (none once its calls are done: a settle ran one of its steps
  // ahead of the schedule).
  void step(Thread &t) {
    if (t.op >= t.ops.size()) return;
    const Op &o = t.ops[t.op];
    std::uint64_t &h = o.h >= 0 ? v.h[o.h] : v.h[7];
    std::uint64_t &r = o.r >= 0 ? v.r[o.r] : v.r[7];
    const bool issuing = steps_of(o.kind) == 2;
    if (issuing) {
      if (t.step == 0) {
        t.called = true;
        // Stamped when the call enters, as the shim stamps it (Call's constructor), not when
        // the model hears of it.
        t.issue_ev = ev(o.kind == OpKind::Create    ? "cuMemCreate"
                        : o.kind == OpKind::Reserve ? "cuMemAddressReserve"
                                                    : "cuMemRetainAllocationHandle",
                        t.tid);
        if (o.kind == OpKind::Create) t.res = create(&h);
        if (o.kind == OpKind::Reserve) {
          CUdeviceptr p = 0;
          t.res = cuMemAddressReserve(&p, G, 0, 0, 0);
          r = p;
        }
        if (o.kind == OpKind::Retain) {
          CUmemGenericAllocationHandle out = 0;
          t.res = cuMemRetainAllocationHandle(&out, reinterpret_cast<void *>(r));
          h = out;
        }
      } else if (t.res == CUDA_SUCCESS) {
        if (o.kind == OpKind::Create)
          m.on_create(h, G, Location::Device, 0, 0, false, t.issue_ev, t.ts);
        if (o.kind == OpKind::Reserve) m.on_reserve(r, G, t.issue_ev, t.ts);
        if (o.kind == OpKind::Retain) m.on_retain(h, r, t.issue_ev, t.ts);
      }
    } else if (t.step == 0) {
      t.ticket = begin(t, o, h, r);
    } else if (t.step == 1) {
      // The hook's decision (run_transaction): a skip that rests on the model holding the value
      // as released is confirmed with the driver first (confirm_ticket); while the driver says
      // live, the issuing calls of the other threads that are between their driver call and the
      // model commit run their commit (the shim waits for them: IssueWindows::settle) and the
      // call is judged again. Skipped calls never reach the driver.
      struct Calls {
        World &w;
        Thread &t;
        // Nothing of another thread runs inside a step but through settle(): a window is quiet
        // when no other thread was in flight at its start.
        bool mark() const { return w.others_in_flight(t); }
        bool quiet_since(bool others) const { return !others; }
        void settle() { w.settle(t); }
      } calls{*this, t};
      confirm_ticket(
          t.ticket, [&] { return begin(t, o, h, r); },
          [&] {
            CUmemAllocationProp prop{};
            const CUresult pr = cuMemGetAllocationPropertiesFromHandle(&prop, h);
            return DriverView{pr == CUDA_SUCCESS ? DriverView::Live::Yes : DriverView::Live::No,
                              nullptr};
          },
          calls);
      t.called = !t.ticket.skip() && !(t.ticket.finding && t.ticket.decision.abort_first);
      t.res = CUDA_SUCCESS;
      if (t.called) {
        const char *api[] = {"", "", "cuMemMap", "cuMemUnmap", "cuMemRelease", "",
                             "cuMemAddressFree"};
        if (o.fail) fakecuda_inject(api[static_cast<int>(o.kind)], 1, CUDA_ERROR_NOT_PERMITTED);
        switch (o.kind) {
          case OpKind::Map: t.res = cuMemMap(r, G, 0, h, 0); break;
          case OpKind::Unmap: t.res = cuMemUnmap(r, G); break;
          case OpKind::Release: t.res = cuMemRelease(h); break;
          case OpKind::AddressFree: t.res = cuMemAddressFree(r, G); break;
          default: break;
        }
      }
    } else if (t.called) {
      m.end(t.ticket, t.res == CUDA_SUCCESS);
    }
    if (++t.step == steps_of(o.kind)) finish(t, o);
  }

  void finish(Thread &t, const Op &o) {
    const char *names[] = {"create", "reserve", "map", "unmap", "release", "retain", "address-free"};
    char what[160];
    std::snprintf(what, sizeof what, "thread %u op %zu (%s)", t.tid, t.op,
                  names[static_cast<int>(o.kind)]);
    if (o.misuse && t.called)
      errors.push_back(std::string(what) + ": a redundant or stale call reached the driver (" +
                       std::to_string(t.res) + ")");
    if (!o.misuse && !t.called && steps_of(o.kind) == 3)
      errors.push_back(std::string(what) + ": a legitimate call was answered without the driver");
    if (o.fail && t.res == CUDA_SUCCESS)
      errors.push_back(std::string(what) + ": the injected fault did not happen");
    if (!o.misuse && !o.fail && !o.racy && t.res != CUDA_SUCCESS)
      errors.push_back(std::string(what) + ": a legitimate call failed with " +
                       std::to_string(t.res));
    t.op++;
    t.step = 0;
    t.ticket = VmmTicket{};
    t.called = false;
  }

  void run_all(Thread &t) {
    while (t.op < t.ops.size()) step(t);
  }

  // The model's state against the driver's own.
  void compare() {
    fakecuda_state st{};
    fakecuda_get_state(&st);
    const VmmCounts c = m.counts();
    unsigned long long refs = 0;
    m.for_each_live_handle([&](const HandleRec &h) {
      refs += h.refs;
      if (!fakecuda_handle_live(h.value))
        errors.push_back("model holds " + hex(h.value) + " live; the driver does not");
    });
    auto same = [&](const char *what, unsigned long long model, unsigned long long driver) {
      if (model != driver)
        errors.push_back(std::string(what) + ": model " + std::to_string(model) + ", driver " +
                         std::to_string(driver));
    };
    same("handle references", refs, st.handle_refs);
    same("physical allocations", c.phys, st.phys_allocs);
    same("mappings", c.mappings, st.mappings);
    same("reservations", c.reservations, st.reservations);
    std::int64_t vmm = 0;
    counters.visit([&](const ByteCounters::Row &row) {
      if (row.kind == MemKind::Vmm) vmm += row.current;
    });
    same("physical bytes", static_cast<unsigned long long>(vmm), st.phys_bytes);
  }
};

struct Scenario {
  const char *name;
  std::function<void(World &, std::vector<Thread> &)> setup;  // run first, sequentially
  std::vector<std::vector<Op>> threads;
};

// Runs one schedule (a list of thread indices, one per step) in a child process; returns the
// errors, the schedule first.
std::vector<std::string> run_schedule(const Scenario &s, const std::vector<int> &order) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    cuInit(0);
    World w;
    std::vector<Thread> ts;
    for (std::size_t i = 0; i < s.threads.size(); ++i)
      ts.push_back(Thread{static_cast<std::uint32_t>(i + 1), s.threads[i], {}});
    s.setup(w, ts);
    w.threads = &ts;
    for (int i : order) w.step(ts[static_cast<std::size_t>(i)]);
    w.compare();
    std::string out;
    for (const auto &e : w.errors) out += e + "\n";
    if (write(fds[1], out.data(), out.size()) < 0) _exit(3);
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  std::vector<std::string> errors;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    errors.push_back("child died (status " + std::to_string(status) + ")");
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    errors.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  if (!errors.empty()) {
    std::string sched = std::string(s.name) + ": schedule";
    for (int i : order) sched += " " + std::to_string(i + 1);
    errors.insert(errors.begin(), sched);
  }
  return errors;
}

// Every interleaving of the threads' steps (each thread's own steps stay in order).
void each_interleaving(const std::vector<int> &counts, std::vector<int> &prefix,
                       std::vector<int> &left, const std::function<void(const std::vector<int> &)> &fn) {
  bool any = false;
  for (std::size_t i = 0; i < left.size(); ++i) {
    if (!left[i]) continue;
    any = true;
    --left[i];
    prefix.push_back(static_cast<int>(i));
    each_interleaving(counts, prefix, left, fn);
    prefix.pop_back();
    ++left[i];
  }
  if (!any) fn(prefix);
}

std::vector<int> step_counts(const Scenario &s) {
  std::vector<int> c;
  for (const auto &ops : s.threads) {
    Thread t{0, ops, {}};
    c.push_back(total_steps(t));
  }
  return c;
}

struct Tally {
  std::size_t schedules = 0, failed = 0;
  std::vector<std::string> first;
  void add(std::vector<std::string> e) {
    ++schedules;
    if (e.empty()) return;
    if (!failed) first = std::move(e);
    ++failed;
  }
  std::string text() const {
    std::string s;
    for (const auto &l : first) s += l + "\n";
    return s;
  }
};

Tally exhaustive(const Scenario &s) {
  Tally t;
  std::vector<int> counts = step_counts(s), left = counts, prefix;
  each_interleaving(counts, prefix, left, [&](const std::vector<int> &order) {
    t.add(run_schedule(s, order));
  });
  return t;
}

Tally sampled(const Scenario &s, unsigned seed, std::size_t n) {
  Tally t;
  std::mt19937 rng(seed);
  const std::vector<int> counts = step_counts(s);
  for (std::size_t k = 0; k < n; ++k) {
    std::vector<int> order;
    for (std::size_t i = 0; i < counts.size(); ++i)
      order.insert(order.end(), static_cast<std::size_t>(counts[i]), static_cast<int>(i));
    std::shuffle(order.begin(), order.end(), rng);
    t.add(run_schedule(s, order));
  }
  return t;
}

// Runs `ops` on thread t before its own calls (the scenario's setup, sequentially).
void prelude(World &w, Thread &t, std::vector<Op> ops) {
  std::vector<Op> own = std::move(t.ops);
  t.ops = std::move(ops);
  t.op = 0;
  w.run_all(t);
  t.ops = std::move(own);
  t.op = 0;
}

// Thread 1 maps h0 at r0, then puts it to sleep (unmap + release), as vLLM's sleep mode does; the
// driver will hand h0's value to the next create (real-driver.md D18).
const std::vector<Op> kSleepH0 = {{OpKind::Reserve, -1, 0}, {OpKind::Create, 0},
                                  {OpKind::Map, 0, 0},     {OpKind::Unmap, -1, 0},
                                  {OpKind::Release, 0}};

// The free while asleep: a no-op unmap, then the release of the sleeping range's old handle.
const std::vector<Op> kFreeWhileAsleep = {{OpKind::Unmap, -1, 0, /*misuse=*/true},
                                          {OpKind::Release, 0, -1, /*misuse=*/true}};

}  // namespace

TEST_CASE("Interleavings: a free while asleep against a create that gets the same value") {
  // Thread 2 creates (the driver re-issues h0's value), maps and releases its own allocation.
  Scenario s{"free-while-asleep vs owner",
             [](World &w, std::vector<Thread> &t) {
               prelude(w, t[0], kSleepH0);
               prelude(w, t[1], {{OpKind::Reserve, -1, 1}});
             },
             {kFreeWhileAsleep,
              {{OpKind::Create, 1}, {OpKind::Map, 1, 1}, {OpKind::Release, 1}}}};
  Tally t = exhaustive(s);
  INFO(t.text());
  CHECK(t.schedules == 3003);  // C(14, 6): 6 and 8 steps
  CHECK(t.failed == 0);
}

TEST_CASE("Interleavings: a free while asleep against NCCL's retain-and-release owner") {
  // The owner releases right after mapping and retains the handle back from the address
  // (real-driver.md section 6), so its value is released and re-issued within its own lifecycle.
  Scenario s{"free-while-asleep vs retain owner",
             [](World &w, std::vector<Thread> &t) {
               prelude(w, t[0], kSleepH0);
               prelude(w, t[1], {{OpKind::Reserve, -1, 1}});
             },
             {kFreeWhileAsleep,
              {{OpKind::Create, 1}, {OpKind::Map, 1, 1}, {OpKind::Release, 1},
               {OpKind::Retain, 2, 1}, {OpKind::Release, 2}}}};
  Tally t = exhaustive(s);
  INFO(t.text());
  CHECK(t.schedules == 27132);  // C(19, 6): 6 and 13 steps
  CHECK(t.failed == 0);
}

TEST_CASE("Interleavings: two sleep-mode allocators freeing while asleep") {
  // Thread 2's allocation got h0's value after thread 1's sleep; both then sleep and free while
  // asleep, so each stale release names a value the other may hold live.
  Scenario s{"two sleepers",
             [](World &w, std::vector<Thread> &t) {
               prelude(w, t[0], kSleepH0);
               prelude(w, t[1], {{OpKind::Reserve, -1, 1}, {OpKind::Create, 1},
                                 {OpKind::Map, 1, 1}});
             },
             {kFreeWhileAsleep,
              {{OpKind::Unmap, -1, 1}, {OpKind::Release, 1}, {OpKind::Unmap, -1, 1, true},
               {OpKind::Release, 1, -1, true}}}};
  Tally t = exhaustive(s);
  INFO(t.text());
  CHECK(t.schedules == 18564);  // C(18, 6): 6 and 12 steps
  CHECK(t.failed == 0);
}

TEST_CASE("Interleavings: three threads, sampled with fixed seeds") {
  Scenario s{"three threads",
             [](World &w, std::vector<Thread> &t) {
               prelude(w, t[0], kSleepH0);
               prelude(w, t[1], {{OpKind::Reserve, -1, 1}});
               prelude(w, t[2], {{OpKind::Reserve, -1, 2}});
             },
             {kFreeWhileAsleep,
              {{OpKind::Create, 1}, {OpKind::Map, 1, 1}, {OpKind::Unmap, -1, 1},
               {OpKind::Release, 1}},
              {{OpKind::Create, 2}, {OpKind::Map, 2, 2}, {OpKind::Release, 2},
               {OpKind::Retain, 3, 2}, {OpKind::Unmap, -1, 2}, {OpKind::Release, 3}}}};
  for (unsigned seed : {1u, 2u, 3u}) {
    Tally t = sampled(s, seed, 1000);
    INFO("seed " << seed << "\n" << t.text());
    CHECK(t.failed == 0);
  }
}

TEST_CASE("Interleavings: a refused release against a retain of the same allocation") {
  // Thread 1's release is refused by the driver while thread 2 retains a handle from the mapped
  // address (the driver answers with the same live value, D16): the refused reference comes back
  // to the value's current issue, and nothing is lost or counted twice.
  Scenario s{"refused release vs retain",
             [](World &w, std::vector<Thread> &t) {
               prelude(w, t[0], {{OpKind::Reserve, -1, 0}, {OpKind::Create, 0},
                                 {OpKind::Map, 0, 0}});
             },
             {{{OpKind::Release, 0, -1, false, /*fail=*/true}},
              {{OpKind::Retain, 1, 0}, {OpKind::Release, 1}}}};
  Tally t = exhaustive(s);
  INFO(t.text());
  CHECK(t.schedules == 56);  // C(8, 3): 3 and 5 steps
  CHECK(t.failed == 0);
}

TEST_CASE("Interleavings: a refused unmap against an address free of the same reservation") {
  // Thread 1's handle was released while mapped (D13), so its unmap would take the allocation
  // with it; the driver refuses the unmap (a fault), and thread 2's address free, noted while the
  // model held the range unmapped, is refused too (still mapped, D11). Nothing may be lost or left:
  // the mapping and its allocation are back, and the teardown after both reaches the driver.
  Scenario s{"refused unmap vs address free",
             [](World &w, std::vector<Thread> &t) {
               prelude(w, t[0], {{OpKind::Reserve, -1, 0}, {OpKind::Create, 0},
                                 {OpKind::Map, 0, 0}, {OpKind::Release, 0}});
             },
             {{{OpKind::Unmap, -1, 0, false, /*fail=*/true}, {OpKind::Unmap, -1, 0}},
              {{OpKind::AddressFree, -1, 0, false, false, /*racy=*/true}}}};
  Tally t = exhaustive(s);
  INFO(t.text());
  CHECK(t.schedules == 84);  // C(9, 3): 6 and 3 steps
  CHECK(t.failed == 0);
}

TEST_CASE("Interleavings: a refused address free against a map into the reservation") {
  // Thread 1 frees an empty reservation and the driver refuses (a fault) while thread 2 maps,
  // then unmaps and releases: the map made meanwhile stays known, so its unmap is judged mapped
  // and reaches the driver.
  Scenario s{"refused address free vs map",
             [](World &w, std::vector<Thread> &t) {
               prelude(w, t[0], {{OpKind::Reserve, -1, 0}});
               prelude(w, t[1], {{OpKind::Create, 1}});
             },
             {{{OpKind::AddressFree, -1, 0, false, /*fail=*/true}},
              {{OpKind::Map, 1, 0}, {OpKind::Unmap, -1, 0}, {OpKind::Release, 1}}}};
  Tally t = exhaustive(s);
  INFO(t.text());
  CHECK(t.schedules == 220);  // C(12, 3): 3 and 9 steps
  CHECK(t.failed == 0);
}

TEST_CASE("Interleavings: an address free the driver accepts against a map it refuses") {
  // No fault: whichever reaches the driver first wins (the map, so the free is refused; or the
  // free, so the map is refused and the handle is released unmapped). The model follows both.
  Scenario s{"address free vs map",
             [](World &w, std::vector<Thread> &t) {
               prelude(w, t[0], {{OpKind::Reserve, -1, 0}});
               prelude(w, t[1], {{OpKind::Create, 1}});
             },
             {{{OpKind::AddressFree, -1, 0, false, false, /*racy=*/true}},
              {{OpKind::Map, 1, 0, false, false, /*racy=*/true}, {OpKind::Release, 1}}}};
  Tally t = exhaustive(s);
  INFO(t.text());
  CHECK(t.schedules == 84);  // C(9, 3): 3 and 6 steps
  CHECK(t.failed == 0);
}
