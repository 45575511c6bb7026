// SPDX-License-Identifier: Apache-2.0
// policy/nccl_holds: registrations (with NCCL's shared slots), windows, multicast bindings,
// sleeping ranges and peer imports, what a free meets, and how the findings phrase them.
#include <catch2/catch.hpp>

#include <string>

#include "nccl_holds.h"

using namespace cmg;

namespace {

constexpr std::uint64_t MiB = 1 << 20;
constexpr std::uint64_t G2 = 2 * MiB;

EventRef ev(std::uint64_t seq, const char *api) {
  EventRef e;
  e.seq = seq;
  e.ts = seq * 10;
  e.tid = 7;
  e.api = api;
  return e;
}

}  // namespace

TEST_CASE(
    "Registrations: a free of any part meets them once, deregistration and the end drop them") {
  NcclHolds h;
  CHECK(h.empty());
  CHECK(h.take_overlapping(0x1000, 0x1000).empty());
  h.on_register(0xc0, 0x7f0000000000, 8 * MiB, 0xaa, false, ev(3, "ncclCommRegister"));
  // A range inside the slot: NCCL hands back the same handle (one more reference).
  h.on_register(0xc0, 0x7f0000001000, 4096, 0xaa, false, ev(4, "ncclCommRegister"));
  // NCCL's own registration of a window (made inside ncclCommWindowRegister): not kept.
  h.on_register(0xc0, 0x7f1000000000, 2 * MiB, 0xbb, true, ev(5, "ncclCommRegister"));
  h.on_register(0xc0, 0x7f2000000000, 2 * MiB, 0, false, ev(6, "ncclCommRegister"));  // NULL
  CHECK_FALSE(h.empty());
  CHECK(h.holds_of(0xc0).size() == 1);
  CHECK(h.take_overlapping(0x7f1000000000, 2 * MiB).empty());
  CHECK(h.take_overlapping(0x7f0000800000, 0).empty());
  CHECK(h.take_overlapping(0x7effffe00000, 2 * MiB).empty());  // ends where the registration starts
  // One page of an expandable segment registered whole: the whole registration is named.
  auto hit = h.take_overlapping(0x7f0000600000, 2 * MiB);
  REQUIRE(hit.size() == 1);
  CHECK(hit[0].kind == HoldKind::Registration);
  CHECK(hit[0].va == 0x7f0000000000);
  CHECK(hit[0].size == 8 * MiB);
  CHECK(hit[0].made.seq == 3);
  // The rest of that teardown does not report it again.
  CHECK(h.take_overlapping(0x7f0000000000, 8 * MiB).empty());
  CHECK(h.on_deregister(0xc0, 0xaa));
  CHECK(h.holds_of(0xc0).size() == 1);  // one reference left
  CHECK(h.on_deregister(0xc0, 0xaa));
  CHECK(h.empty());
  CHECK_FALSE(h.on_deregister(0xc0, 0xaa));
  CHECK_FALSE(h.on_deregister(0xc0, 0xbb));  // NCCL's own: unknown, ignored
  h.on_register(0xc1, 0x1000000, 2 * MiB, 0xcc, false, ev(9, "ncclCommRegister"));
  h.on_window(0xc1, 0x2000000, 2 * MiB, 0xdd, ev(10, "ncclCommWindowRegister"));
  h.on_comm_end(0xc1);  // ncclRegCleanup and the windows' end
  CHECK(h.empty());
}

TEST_CASE("Windows: the window is named, deregistration drops it") {
  NcclHolds h;
  h.on_window(0xc0, 0x4000000, 2 * MiB, 0xee, ev(2, "ncclCommWindowRegister"));
  h.on_window(0xc0, 0x5000000, 2 * MiB, 0, ev(3, "ncclCommWindowRegister"));  // none made
  CHECK(h.holds_of(0xc0).size() == 1);
  CHECK_FALSE(h.on_window_deregister(0xc0, 0x1234));  // NCCL's own window
  auto hit = h.take_overlapping(0x4000000, 2 * MiB);
  REQUIRE(hit.size() == 1);
  CHECK(hit[0].kind == HoldKind::Window);
  const Finding f =
      nccl_findings::freed_while_held("cuMemUnmap of 0x4000000 (+2097152 bytes)", hit[0]);
  CHECK(f.cls == FindingClass::FreeRegistered);
  CHECK(f.msg.find("window 0xee of communicator 0xc0") != std::string::npos);
  CHECK(f.msg.find("ncclCommWindowDeregister") != std::string::npos);
  REQUIRE(f.related.size() == 1);
  CHECK(f.related[0].what == "window registration");
  CHECK(f.related[0].ev.seq == 2);
  CHECK(
      f.state_json ==
      "{\"holds\":{\"kind\":\"window\",\"comm\":\"0xc0\",\"handle\":\"0xee\",\"va\":\"0x4000000\","
      "\"size\":2097152}}");
  CHECK(h.on_window_deregister(0xc0, 0xee));
  CHECK(h.empty());
}

TEST_CASE("NCCL's own reservations: its teardown is told by communicator, base and size") {
  NcclHolds h;
  const std::uint64_t V = 0x4900000000, S = 150323855360;  // 2.28.9 on the H200
  CHECK_FALSE(h.has_own());
  CHECK_FALSE(h.own_teardown(0xc0, V, S));
  h.on_own_reserve(0, 0x5000000000, S);  // no communicator known: not NCCL's for any
  CHECK_FALSE(h.has_own());
  h.on_own_reserve(0xc0, V, S);
  h.on_own_reserve(0xd0, V + S, S);
  CHECK(h.has_own());
  CHECK(h.empty());  // nothing of the program's is held: the free paths stay cheap
  CHECK(h.own_teardown(0xc0, V, S));
  CHECK_FALSE(h.own_teardown(0xd0, V, S));       // another communicator's end
  CHECK_FALSE(h.own_teardown(0, V, S));          // no communicator ending
  CHECK_FALSE(h.own_teardown(0xc0, V, S / 2));   // a part of it
  CHECK_FALSE(h.own_teardown(0xc0, V + G2, S));  // not its base
  h.on_address_freed(V);
  CHECK_FALSE(h.own_teardown(0xc0, V, S));
  CHECK(h.own_teardown(0xd0, V + S, S));
  h.on_comm_end(0xd0);  // what NCCL left of its ranges is no longer known to be its own
  CHECK_FALSE(h.own_teardown(0xd0, V + S, S));
  CHECK_FALSE(h.has_own());
  h.on_own_reserve(0xc0, V, S);
  h.clear();
  CHECK_FALSE(h.own_teardown(0xc0, V, S));
}

TEST_CASE("Multicast bindings: by handle at the last reference, by address at the unmap") {
  NcclHolds h;
  Hold mem;
  mem.kind = HoldKind::BindMem;
  mem.owner = mem.handle = 0x55aa;
  mem.alloc_id = 17;
  mem.size = 2 * MiB;
  mem.dev = 0;
  mem.made = ev(4, "cuMulticastBindMem");
  h.on_bind(mem);
  Hold addr = mem;
  addr.kind = HoldKind::BindAddr;
  addr.alloc_id = 18;
  addr.va = 0x9000000;
  addr.mc_offset = 2 * MiB;
  addr.made = ev(5, "cuMulticastBindAddr");
  h.on_bind(addr);
  CHECK(h.take_overlapping(0, 4 * MiB).empty());  // a binding by handle has no range
  CHECK(h.take_bound(99).empty());
  auto bound = h.take_bound(17);
  REQUIRE(bound.size() == 1);
  const Finding f = nccl_findings::freed_while_held(
      "cuMemRelease of handle 0x1 (the last reference to it)", bound[0]);
  CHECK(f.cls == FindingClass::FreeBound);
  CHECK(
      f.msg.find("multicast object 0x55aa at offset 0 for device 0 (cuMulticastBindMem at seq 4") !=
      std::string::npos);
  CHECK(f.bytes == 2 * MiB);
  auto hit = h.take_overlapping(0x9000000, 2 * MiB);
  REQUIRE(hit.size() == 1);
  CHECK(hit[0].kind == HoldKind::BindAddr);
  CHECK(h.take_bound(18).empty());                  // reported at the unmap already
  CHECK_FALSE(h.on_unbind(0x55aa, 1, 0, 2 * MiB));  // another device
  CHECK(h.on_unbind(0x55aa, 0, 0, 2 * MiB));
  h.on_multicast_release(0x55aa);  // the object's other binding goes with it
  CHECK(h.empty());
}

TEST_CASE("Sleeping ranges belong to the suspended communicator until it resumes or ends") {
  NcclHolds h;
  h.on_suspend_unmap(0xc0, 0x1000000, 2 * MiB, ev(8, "cuMemUnmap"));
  h.on_suspend_unmap(0xc0, 0x3000000, 2 * MiB, ev(9, "cuMemUnmap"));
  CHECK(h.sleeping(0xc0).size() == 2);
  CHECK(h.sleeping(0xc1).empty());
  const Finding f = nccl_findings::teardown_suspended(
      "ncclCommDestroy", 0xc0, ev(7, "ncclCommSuspend"), h.sleeping(0xc0), 1);
  CHECK(f.cls == FindingClass::CommSuspend);
  CHECK(f.msg.find("suspended since seq 7 (ncclCommSuspend, thread 7) with 2 ranges (4.0 MiB)") !=
        std::string::npos);
  CHECK(f.msg.find("failed with 1") != std::string::npos);
  CHECK(f.bytes == 4 * MiB);
  h.on_resumed(0xc0);
  CHECK(h.sleeping(0xc0).empty());
  h.on_suspend_unmap(0xc0, 0x1000000, 2 * MiB, ev(10, "cuMemUnmap"));
  h.on_comm_end(0xc0);
  CHECK(h.sleeping(0xc0).empty());
}

TEST_CASE("Peer imports: taken at a communicator's end while mapped, forgotten once gone") {
  NcclHolds h;
  h.on_import(PeerImport{1, 0xa1, 0, ev(5, "cuMemImportFromShareableHandle"), false});
  h.on_import(PeerImport{2, 0xa2, 1, ev(6, "cuMemImportFromShareableHandle"), false});
  h.on_import(PeerImport{3, 0xa3, -1, ev(7, "cuMemImportFromShareableHandle"), false});
  h.on_import(PeerImport{4, 0xa4, 0, ev(2, "cuMemImportFromShareableHandle"), false});
  auto mapped = [](std::uint64_t id) { return id != 2; };  // 2 was unmapped and released
  // Device 0 since seq 4: import 1, and 3 (no device known); 4 was made before.
  auto left = h.take_mapped_imports(0, 4, mapped);
  REQUIRE(left.size() == 2);
  CHECK(left[0].handle == 0xa1);
  CHECK(left[1].handle == 0xa3);
  CHECK(h.take_mapped_imports(0, 4, mapped).empty());  // reported once
  CHECK(h.take_mapped_imports(1, 0, mapped).empty());  // 2 is gone (and forgotten)
  const Finding f = nccl_findings::imports_after_end("ncclCommAbort", 0xc0, left, 8 * MiB);
  CHECK(f.cls == FindingClass::CommImportMapped);
  CHECK(f.msg.rfind("2 imports of peer memory (8.0 MiB)", 0) == 0);
  CHECK(f.msg.find("NVIDIA/nccl#1968") != std::string::npos);
  CHECK(f.related.size() == 2);
  CHECK(f.state_json == "{\"comm\":\"0xc0\",\"imports\":[\"0xa1\",\"0xa3\"]}");
  for (std::uint64_t i = 0; i < NcclHolds::kImportsKept + 5; ++i)
    h.on_import(PeerImport{100 + i, i, 0, ev(100 + i, "cuMemImportFromShareableHandle"), false});
  CHECK(h.take_mapped_imports(0, 0, [](std::uint64_t) { return true; }).size() ==
        NcclHolds::kImportsKept);
}

TEST_CASE("Communicator findings name the communicator and the earlier event") {
  const Finding ended =
      nccl_findings::ended_again("ncclCommDestroy", 0x5f00, ev(12, "ncclCommAbort"));
  CHECK(ended.cls == FindingClass::CommEnded);
  CHECK(ended.msg ==
        "ncclCommDestroy of communicator 0x5f00, which already ended at seq 12 "
        "(ncclCommAbort, thread 7); NCCL would read the communicator's freed memory");
  CHECK(ended.related[0].ev.seq == 12);
  CHECK(ended.state_json == "{\"comm\":\"0x5f00\"}");
  const Finding twice = nccl_findings::suspended_again(0x5f00, ev(3, "ncclCommSuspend"));
  CHECK(twice.cls == FindingClass::CommSuspend);
  CHECK(twice.msg.find("suspended since seq 3") != std::string::npos);
  const Finding running = nccl_findings::resume_running(0x5f00, true);
  CHECK(running.msg.find("which is not suspended") != std::string::npos);
  CHECK(nccl_findings::resume_running(0x5f00, false).msg.find("never saw created") !=
        std::string::npos);
}

TEST_CASE("The new classes: actions and when they stand") {
  CHECK(finding_info(FindingClass::CommEnded).guard_action == Action::Skip);
  CHECK(finding_info(FindingClass::CommSuspend).stands == Stands::IfRefused);
  CHECK(finding_info(FindingClass::FreeRegistered).stands == Stands::Always);
  CHECK(finding_from_id("comm-import-mapped") == FindingClass::CommImportMapped);
  CHECK(finding_from_id("free-bound") == FindingClass::FreeBound);
}
