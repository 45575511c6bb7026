// SPDX-License-Identifier: Apache-2.0
// The legacy-IPC bridge without CUDA (policy/ipc_bridge.h): handle and wire formats (with a
// deterministic fuzz loop over every decoder), the peer checks, the export and import tables, the
// address rule, and the ipc-vmm / free-exported texts.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstring>
#include <memory>
#include <set>

#include "ipc_bridge.h"

using namespace cmg;
using namespace cmg::ipc;

namespace {

constexpr std::uint64_t G = 2ull << 20;

// xorshift64*: the same inputs on every run.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  std::uint8_t byte() { return static_cast<std::uint8_t>(next() >> 56); }
};

Handle sample() {
  Handle h;
  h.pid = 4242;
  h.tag = 0x1122334455667788ull;
  h.export_id = 7;
  for (std::size_t i = 0; i < h.nonce.size(); ++i) h.nonce[i] = static_cast<std::uint8_t>(0xa0 + i);
  h.res_base = 0x7f0000000000ull;
  h.pages = 3;
  return h;
}

// Writes a little-endian field and fixes the checksum, as a forger who read the docs would.
void reseal(std::array<std::uint8_t, kHandleSize> &b) {
  std::uint32_t h = 2166136261u;
  for (std::size_t i = 0; i < 60; ++i) h = (h ^ b[i]) * 16777619u;
  for (int i = 0; i < 4; ++i) b[60 + i] = static_cast<std::uint8_t>(h >> (8 * i));
}

bool valid_json(const std::string &s) {
  return nlohmann::json::accept(s);
}

Nonce nonce_of(std::uint8_t v) {
  Nonce n;
  n.fill(v);
  return n;
}

ExportTable::Random counter_random() {
  auto n = std::make_shared<std::uint8_t>(0);
  return [n](std::uint8_t *p, std::size_t len) {
    ++*n;
    std::memset(p, *n, len);
    return true;
  };
}

}  // namespace

TEST_CASE("handle: the layout of docs/ipc-bridge.md, byte for byte") {
  const auto b = encode_handle(sample());
  CHECK(std::memcmp(b.data(), "CMGBRIDG", 8) == 0);
  CHECK(b[8] == 1);
  CHECK(b[9] == 0);  // version 1, little-endian
  CHECK(b[10] == 0);
  CHECK(b[11] == 0);  // flags
  CHECK(b[12] == (4242 & 0xff));
  CHECK(b[13] == (4242 >> 8));
  CHECK(b[16] == 0x88);
  CHECK(b[23] == 0x11);  // tag
  CHECK(b[24] == 7);     // export id
  CHECK(b[32] == 0xa0);
  CHECK(b[47] == 0xaf);  // nonce
  CHECK(b[53] == 0x7f);  // reservation base 0x00007f0000000000
  CHECK(b[56] == 3);     // pages
  Handle out;
  REQUIRE(decode_handle(b, out) == HandleStatus::Ok);
  CHECK(out == sample());
}

TEST_CASE("handle: deterministic for the same export, different for another (P14)") {
  CHECK(encode_handle(sample()) == encode_handle(sample()));
  Handle other = sample();
  other.export_id = 8;
  CHECK(encode_handle(other) != encode_handle(sample()));
}

TEST_CASE("handle: what is not ours goes to the driver") {
  Handle out;
  std::array<std::uint8_t, 64> zeros{};
  CHECK(decode_handle(zeros, out) == HandleStatus::NotOurs);
  // The fake driver's legacy handle starts with its own magic (tests/fakecuda/driver_ipc.cpp).
  std::array<std::uint8_t, 64> legacy{0xde, 0xc0, 0x1b, 0xfc, 1};
  CHECK(decode_handle(legacy, out) == HandleStatus::NotOurs);
  CHECK(decode_handle(std::span<const std::uint8_t>(), out) == HandleStatus::NotOurs);
  auto b = encode_handle(sample());
  b[3] ^= 0x20;  // "CMgBRIDG"
  CHECK(decode_handle(b, out) == HandleStatus::NotOurs);
}

TEST_CASE("handle: truncated, corrupt, unknown version, bad fields") {
  const auto good = encode_handle(sample());
  Handle out;
  for (std::size_t n = 1; n < kHandleSize; ++n)  // any prefix of ours, even of the magic alone
    CHECK(decode_handle(std::span<const std::uint8_t>(good.data(), n), out) ==
          HandleStatus::Truncated);
  // Every single-bit flip past the magic is caught by the checksum.
  for (std::size_t byte = 8; byte < kHandleSize; ++byte)
    for (int bit = 0; bit < 8; ++bit) {
      auto b = good;
      b[byte] ^= static_cast<std::uint8_t>(1u << bit);
      CHECK(decode_handle(b, out) == HandleStatus::BadCheck);
    }
  auto cut = good;
  std::memset(cut.data() + 32, 0, 32);  // the second half lost
  CHECK(decode_handle(cut, out) == HandleStatus::BadCheck);
  auto v2 = good;
  v2[8] = 2;
  reseal(v2);
  CHECK(decode_handle(v2, out) == HandleStatus::BadVersion);
  for (auto field : {12, 16, 24, 56}) {  // pid, tag, export id, pages: zero
    auto b = good;
    std::memset(b.data() + field, 0, field == 12 || field == 56 ? 4 : 8);
    reseal(b);
    CHECK(decode_handle(b, out) == HandleStatus::BadFields);
  }
  auto flags = good;
  flags[10] = 1;
  reseal(flags);
  CHECK(decode_handle(flags, out) == HandleStatus::BadFields);
  auto many = good;
  many[58] = 0x10;  // 2^20 pages > kMaxPages
  reseal(many);
  CHECK(decode_handle(many, out) == HandleStatus::BadFields);
}

TEST_CASE("handle: deterministic fuzz of the decoder") {
  Rng rng{0x9e3779b97f4a7c15ull};
  const auto good = encode_handle(sample());
  std::size_t ok = 0, ours = 0;
  for (int i = 0; i < 200000; ++i) {
    std::vector<std::uint8_t> b(rng.next() % 81);
    for (auto &x : b) x = rng.byte();
    // memcpy into an empty vector's data() (null) is undefined even for 0 bytes.
    switch (b.empty() ? 3 : rng.next() % 4) {
      case 0:
        std::memcpy(b.data(), good.data(), std::min(b.size(), good.size()));
        break;
      case 1:
        std::memcpy(b.data(), "CMGBRIDG", std::min<std::size_t>(b.size(), 8));
        break;
      default:
        break;
    }
    if (b.size() >= 64 && rng.next() % 2) {  // a sealed forgery: only field checks stand
      std::array<std::uint8_t, 64> a;
      std::memcpy(a.data(), b.data(), 64);
      reseal(a);
      std::memcpy(b.data(), a.data(), 64);
    }
    Handle h;
    const HandleStatus st = decode_handle(b, h);
    if (st != HandleStatus::NotOurs) ++ours;
    if (st == HandleStatus::Ok) {
      ++ok;
      // Whatever decodes is exactly what encodes to the same 64 bytes.
      const auto again = encode_handle(h);
      REQUIRE(std::memcmp(again.data(), b.data(), 64) == 0);
    }
  }
  CHECK(ours > 50000);
  CHECK(ok > 1000);  // the sealed copies of the good handle with tails of any length
}

TEST_CASE("socket name: abstract, per broker instance") {
  const std::string n = socket_name(4242, 0xabcull);
  REQUIRE(n.size() > 1);
  CHECK(n[0] == '\0');
  CHECK(n.substr(1) == "cumemguard-ipc.4242.0000000000000abc");
  CHECK(socket_name(4242, 0xabdull) != n);
  CHECK(n.size() <= 108);  // sun_path
}

TEST_CASE("requests: round trip and every malformed shape") {
  Request r;
  r.op = Op::Open;
  r.export_id = 9;
  r.nonce = nonce_of(5);
  const auto b = encode_request(r);
  Request out;
  REQUIRE(parse_request(b, out) == ParseError::None);
  CHECK(out == r);
  CHECK(parse_request(std::span<const std::uint8_t>(b.data(), 31), out) == ParseError::Size);
  std::vector<std::uint8_t> longer(b.begin(), b.end());
  longer.push_back(0);
  CHECK(parse_request(longer, out) == ParseError::Size);
  CHECK(parse_request(std::span<const std::uint8_t>(), out) == ParseError::Size);
  auto m = b;
  m[0] = 'X';
  CHECK(parse_request(m, out) == ParseError::Magic);
  auto v = b;
  v[4] = 9;
  CHECK(parse_request(v, out) == ParseError::Version);
  for (std::uint8_t op : {0, 3, 255}) {
    auto o = b;
    o[6] = op;
    CHECK(parse_request(o, out) == ParseError::Op);
  }
  auto z = b;
  std::memset(z.data() + 8, 0, 8);
  CHECK(parse_request(z, out) == ParseError::Fields);
  r.op = Op::Release;
  REQUIRE(parse_request(encode_request(r), out) == ParseError::None);
  CHECK(out.op == Op::Release);
}

TEST_CASE("requests, replies and chunks: deterministic fuzz of the parsers") {
  Rng rng{12345};
  Request good;
  good.export_id = 3;
  const auto req = encode_request(good);
  Reply rep;
  rep.export_id = 3;
  rep.pages = 2;
  rep.span = 2 * G;
  rep.res_size = 8 * G;
  const auto repb = encode_reply(rep);
  std::size_t parsed = 0;
  for (int i = 0; i < 200000; ++i) {
    std::vector<std::uint8_t> b(rng.next() % (kChunkMax + 40));
    for (auto &x : b) x = rng.byte();
    if (rng.next() % 3 == 0) {
      const auto &src =
          (i & 1) ? std::span<const std::uint8_t>(req) : std::span<const std::uint8_t>(repb);
      if (!b.empty()) std::memcpy(b.data(), src.data(), std::min(b.size(), src.size()));
      if (rng.next() % 2) b.resize(src.size());
      if (!b.empty() && rng.next() % 2) b[rng.next() % b.size()] ^= rng.byte();
    }
    Request q;
    if (parse_request(b, q) == ParseError::None) {
      ++parsed;
      const auto again = encode_request(q);
      REQUIRE(std::vector<std::uint8_t>(again.begin(), again.end()) == b);
    }
    Reply p;
    if (parse_reply(b, p) == ParseError::None) {
      ++parsed;
      const auto again = encode_reply(p);
      REQUIRE(std::memcmp(again.data(), b.data(), kReplySize) == 0);
    }
    std::uint32_t first = 0;
    std::vector<PageRange> pages;
    if (parse_chunk(b, first, pages) == ParseError::None) {
      ++parsed;
      REQUIRE(encode_chunk(first, pages) == b);
    }
  }
  CHECK(parsed > 1000);
}

TEST_CASE("replies: error replies carry no layout") {
  Reply r;
  r.status = ReplyStatus::BadNonce;
  r.export_id = 4;
  Reply out;
  REQUIRE(parse_reply(encode_reply(r), out) == ParseError::None);
  CHECK(out == r);
  r.pages = 1;
  CHECK(parse_reply(encode_reply(r), out) == ParseError::Fields);
  auto b = encode_reply(Reply{});
  b[6] = 99;
  CHECK(parse_reply(b, out) == ParseError::Op);
}

TEST_CASE("chunks: at most 64 pages, exact length") {
  std::vector<PageRange> pages;
  for (int i = 0; i < 64; ++i) pages.push_back({static_cast<std::uint64_t>(i) * G, G});
  const auto b = encode_chunk(128, pages);
  std::uint32_t first = 0;
  std::vector<PageRange> out;
  REQUIRE(parse_chunk(b, first, out) == ParseError::None);
  CHECK(first == 128);
  CHECK(out == pages);
  pages.push_back({64 * G, G});
  CHECK(parse_chunk(encode_chunk(0, pages), first, out) == ParseError::Size);
  CHECK(parse_chunk(encode_chunk(0, {}), first, out) == ParseError::Size);
  auto cut = b;
  cut.pop_back();
  CHECK(parse_chunk(cut, first, out) == ParseError::Size);
}

TEST_CASE("page lists: sorted, non-empty, inside the reservation") {
  const std::vector<PageRange> good = {{G, G}, {2 * G, G}, {4 * G, 2 * G}};
  CHECK(pages_valid(good, 6 * G));
  CHECK_FALSE(pages_valid(good, 5 * G));
  CHECK_FALSE(pages_valid({}, 6 * G));
  CHECK_FALSE(pages_valid(std::vector<PageRange>{{G, 0}}, 6 * G));
  CHECK_FALSE(pages_valid(std::vector<PageRange>{{2 * G, G}, {G, G}}, 6 * G));
  CHECK_FALSE(pages_valid(std::vector<PageRange>{{0, 2 * G}, {G, G}}, 6 * G));
  CHECK_FALSE(pages_valid(std::vector<PageRange>{{~0ull - 10, G}}, ~0ull));
}

TEST_CASE("peers: same user only, and the server must be the exporter") {
  CHECK(check_peer({10, 1000, 1000}, 1000) == PeerVerdict::Allowed);
  CHECK(check_peer({10, 1001, 1000}, 1000) == PeerVerdict::OtherUser);
  CHECK(check_peer({10, 0, 0}, 1000) == PeerVerdict::OtherUser);  // root is no exception
  CHECK(check_peer({10, 1000, 0}, 0) == PeerVerdict::OtherUser);
  CHECK(check_server({42, 1000, 1000}, 42, 1000) == ServerVerdict::Exporter);
  CHECK(check_server({43, 1000, 1000}, 42, 1000) == ServerVerdict::NotExporter);
  CHECK(check_server({0, 1000, 1000}, 42, 1000) == ServerVerdict::NotExporter);
  CHECK(check_server({42, 0, 0}, 42, 1000) == ServerVerdict::OtherUser);
  CHECK(nonce_equal(nonce_of(3), nonce_of(3)));
  Nonce n = nonce_of(3);
  n[15] = 4;
  CHECK_FALSE(nonce_equal(nonce_of(3), n));
}

TEST_CASE("exports: the same pages give the same export, new pages a new one") {
  ExportTable t;
  const std::vector<ExportPage> two = {{0, G, 1, 10}, {G, G, 2, 11}};
  auto rnd = counter_random();
  auto a = t.find_or_add(0x1000000, 4 * G, two, {}, 0, rnd);
  auto b = t.find_or_add(0x1000000, 4 * G, two, {}, 0, rnd);
  REQUIRE(a);
  REQUIRE(b);
  CHECK_FALSE(a->reused);
  CHECK(b->reused);
  CHECK(a->id == b->id);
  CHECK(nonce_equal(a->nonce, b->nonce));
  auto three = two;
  three.push_back({3 * G, G, 3, 12});
  auto c = t.find_or_add(0x1000000, 4 * G, three, {}, 0, rnd);
  REQUIRE(c);
  CHECK(c->id != a->id);
  CHECK_FALSE(nonce_equal(a->nonce, c->nonce));
  // A remap at the same offset is other memory: another export.
  auto remapped = two;
  remapped[0].map_seq = 99;
  CHECK(t.find_or_add(0x1000000, 4 * G, remapped, {}, 0, rnd)->id != a->id);
  CHECK_FALSE(
      t.find_or_add(0x2000000, G, two, {}, 0, [](std::uint8_t *, std::size_t) { return false; }));
  CHECK(t.size() == 3);
}

TEST_CASE("exports: lookups check id and nonce") {
  ExportTable t;
  auto m = t.find_or_add(0x1000000, 2 * G, {{0, G, 1, 1}}, {}, 0, counter_random());
  REQUIRE(m);
  Export e;
  CHECK(t.lookup(m->id, m->nonce, &e) == ExportTable::Lookup::Ok);
  CHECK(e.res_base == 0x1000000);
  CHECK(t.lookup(m->id + 1, m->nonce, nullptr) == ExportTable::Lookup::Unknown);
  Nonce wrong = m->nonce;
  wrong[0] ^= 1;
  CHECK(t.lookup(m->id, wrong, nullptr) == ExportTable::Lookup::BadNonce);
}

TEST_CASE("exports: an unmap of an exported page drops the export and counts its importers (P16)") {
  ExportTable t;
  auto rnd = counter_random();
  auto a = t.find_or_add(0x1000000, 4 * G, {{0, G, 1, 1}, {G, G, 2, 2}},
                         EventRef{5, 0, 1, 0, "cuIpcGetMemHandle"}, 0, rnd);
  auto b = t.find_or_add(0x1000000 + 8 * G, 2 * G, {{0, G, 3, 3}}, {}, 0, rnd);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(t.any());
  CHECK(t.commit_open(a->id, 1));
  CHECK(t.commit_open(a->id, 1));
  CHECK(t.commit_open(a->id, 2));
  t.release(a->id, 1);
  // Outside every page: nothing.
  CHECK(t.begin_unmap(0x1000000 + 2 * G, 2 * G).empty());
  auto tok = t.begin_unmap(0x1000000 + G, G);
  REQUIRE(tok.exports.size() == 1);
  CHECK(tok.exports[0].id == a->id);
  // While the unmap is in flight the export serves nobody.
  CHECK(t.lookup(a->id, a->nonce, nullptr) == ExportTable::Lookup::Dying);
  CHECK_FALSE(t.commit_open(a->id, 3));
  // The driver refused the unmap: the export is back.
  CHECK(t.end_unmap(tok, false).empty());
  CHECK(t.lookup(a->id, a->nonce, nullptr) == ExportTable::Lookup::Ok);
  tok = t.begin_unmap(0x1000000, 4 * G);
  auto dropped = t.end_unmap(tok, true);
  REQUIRE(dropped.size() == 1);
  CHECK(dropped[0].importers == 2);  // connection 1 once, connection 2 once
  CHECK(dropped[0].pages == 2);
  CHECK(dropped[0].bytes == 2 * G);
  CHECK(dropped[0].made.seq == 5);
  CHECK(t.lookup(a->id, a->nonce, nullptr) == ExportTable::Lookup::Unknown);
  CHECK(t.size() == 1);
  // A connection that goes away takes its opens with it.
  CHECK(t.commit_open(b->id, 7));
  t.drop_connection(7);
  dropped = t.end_unmap(t.begin_unmap(0x1000000 + 8 * G, G), true);
  REQUIRE(dropped.size() == 1);
  CHECK(dropped[0].importers == 0);
  CHECK_FALSE(t.any());
}

TEST_CASE("imports: the address rule and reference counts") {
  const std::vector<PageRange> pages = {{G, G}, {2 * G, G}, {4 * G, G}};
  const Layout l = layout_for(pages);
  CHECK(l.first_off == G);
  CHECK(l.span == 4 * G);  // granules 1..4, not the whole reservation
  const std::uint64_t span_va = 0x7f0000400000ull;
  const std::uint64_t base = import_base(span_va, l);
  // base + o is the importer's address of exporter offset o, for every exported o.
  for (const auto &p : pages) CHECK(base + p.off == span_va + (p.off - l.first_off));
  // A span below the first offset wraps like the caller's own pointer arithmetic.
  CHECK(import_base(G / 2, l) + G == G / 2);

  ImportTable t;
  Import imp;
  imp.key = {42, 7, 1};
  imp.ptr = base;
  imp.refs = 1;
  t.add(imp);
  CHECK(t.ptr_taken(base));
  REQUIRE(t.find({42, 7, 1}));
  ++t.find({42, 7, 1})->refs;
  CHECK(t.from_exporter(42, 7) == 1);
  CHECK(t.from_exporter(42, 8) == 0);
  CHECK_FALSE(t.close(base + 1));
  auto c1 = t.close(base);
  REQUIRE(c1);
  CHECK(c1->refs == 1);
  auto c2 = t.close(base);
  REQUIRE(c2);
  CHECK(c2->refs == 0);
  CHECK_FALSE(t.close(base));  // the third close is the driver's business
  CHECK(t.size() == 0);
}

TEST_CASE("PyTorch hint: the variable PyTorch reads and the token as written") {
  torchconf::Env env;
  env.cuda = "max_split_size_mb:512,expandable_segments:True";
  TorchHint h = torch_hint(env);
  CHECK(h.expandable);
  CHECK(h.var == "PYTORCH_CUDA_ALLOC_CONF");
  CHECK(h.token == "expandable_segments:True");

  torchconf::Env unified;
  unified.alloc = "garbage_collection_threshold:0.8, expandable_segments : True";
  h = torch_hint(unified);
  CHECK(h.expandable);
  CHECK(h.var == "PYTORCH_ALLOC_CONF");
  CHECK(h.token == "expandable_segments : True");

  // PyTorch 2.10 precedence (the scoped allocator-settings guard): a present PYTORCH_CUDA_ALLOC_CONF wins, even empty.
  torchconf::Env shadowed;
  shadowed.cuda = "";
  shadowed.alloc = "expandable_segments:True";
  CHECK_FALSE(torch_hint(shadowed).expandable);

  torchconf::Env off;
  off.cuda = "expandable_segments:True,expandable_segments:False";
  CHECK_FALSE(torch_hint(off).expandable);
  CHECK_FALSE(torch_hint(torchconf::Env{}).expandable);
}

TEST_CASE("ipc-vmm diagnosis: reservation, pages, handle types, PyTorch, ways out") {
  Subject s;
  s.api = "cudaIpcGetMemHandle";
  s.ptr = 0x7f0000000000ull;
  s.res_base = 0x7f0000000000ull;
  s.res_size = 4 * G;
  s.reserved = EventRef{3, 0, 1, 0, "cuMemAddressReserve"};
  s.pages = {{0, G, kTypePosixFd, true}, {G, G, kTypePosixFd, true}};
  using W = ExportPlan::What;
  CHECK(plan_export(IpcMode::Report, s, true).what == W::Report);
  CHECK(plan_export(IpcMode::Deny, s, true).what == W::Deny);
  CHECK(plan_export(IpcMode::Bridge, s, true).what == W::Bridge);
  CHECK(plan_export(IpcMode::Bridge, s, false).what == W::Report);  // nowhere to write a handle
  Finding f = ipc_vmm_finding(s, {}, {W::Report, {}});
  CHECK(f.cls == FindingClass::IpcVmm);
  CHECK_THAT(f.msg, Catch::Contains("VMM reservation 0x7f0000000000 (8.0 MiB"));
  CHECK_THAT(f.msg, Catch::Contains("2 mapped page(s): +0 (2.0 MiB), +2097152 (2.0 MiB)"));
  CHECK_THAT(f.msg, Catch::Contains("handle types POSIX_FD"));
  CHECK_THAT(f.msg, Catch::Contains("CUMEMGUARD_IPC=bridge"));
  CHECK_THAT(f.msg, !Catch::Contains("PyTorch"));
  REQUIRE(valid_json(f.state_json));
  auto st = nlohmann::json::parse(f.state_json);
  CHECK(st["mapped_pages"] == 2);
  CHECK(st["mapped_bytes"] == 2 * G);
  CHECK(st["mode"] == "report");
  CHECK_FALSE(st.contains("torch_var"));
  REQUIRE(f.related.size() == 1);
  CHECK(f.related[0].ev.seq == 3);

  TorchHint t = torch_hint(torchconf::Env{std::string("expandable_segments:True"), {}, {}, {}, {}});
  f = ipc_vmm_finding(s, t, {W::Report, {}});
  CHECK_THAT(f.msg,
             Catch::Contains("PyTorch's PYTORCH_CUDA_ALLOC_CONF has 'expandable_segments:True'"));
  CHECK_THAT(f.msg, Catch::Contains("with cumemguard.expandable_segments(False) around the "
                                    "allocation"));
  CHECK_THAT(f.msg, Catch::Contains("(TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC unset: "
                                    "torch.multiprocessing shares such tensors with POSIX file "
                                    "descriptors, legacy CUDA IPC cannot)"));
  CHECK(nlohmann::json::parse(f.state_json)["expandable_segments_ipc"] == "unset");
  // Off: PyTorch's own sharing fails as well (PR #169487).
  const TorchHint off_ipc = torch_hint(
      torchconf::Env{std::string("expandable_segments:True"), {}, {}, {}, std::string("0")});
  CHECK(off_ipc.ipc_off);
  CHECK_THAT(ipc_vmm_finding(s, off_ipc, {W::Report, {}}).msg,
             Catch::Contains("(TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC '0': off, so "
                             "torch.multiprocessing cannot share these tensors either)"));
  CHECK_THAT(f.msg, Catch::Contains("CUMEMGUARD_TORCH_ALLOC_CONF=expandable_segments:False"));
  st = nlohmann::json::parse(f.state_json);
  CHECK(st["torch_var"] == "PYTORCH_CUDA_ALLOC_CONF");
  CHECK(st["torch_token"] == "expandable_segments:True");

  f = ipc_vmm_finding(s, {}, {W::Deny, {}});
  CHECK_THAT(f.msg, Catch::Contains("CUMEMGUARD_IPC=deny"));

  Subject fabric = s;
  fabric.pages = {{0, G, kTypeFabric, true}};
  const ExportPlan plan = plan_export(IpcMode::Bridge, fabric, true);
  REQUIRE(plan.what == W::BridgeImpossible);
  const std::string why = plan.blocker;
  CHECK_THAT(why, Catch::Contains("handle types FABRIC, without POSIX_FD"));
  f = ipc_vmm_finding(fabric, {}, plan);
  CHECK_THAT(f.msg, Catch::Contains("CUMEMGUARD_IPC=bridge cannot export it either"));
  CHECK_THAT(f.msg, !Catch::Contains("Ways out"));
  st = nlohmann::json::parse(f.state_json);
  CHECK(st["handle_types"] == "FABRIC");
  CHECK(st["bridge_blocker"] == why);
}

TEST_CASE("bridge blockers and the widened handle types") {
  Subject s;
  CHECK_THAT(bridge_blocker(s), Catch::Contains("nothing is mapped"));
  s.pages = {{0, G, kTypePosixFd | kTypeFabric, true}};
  CHECK(bridge_blocker(s).empty());
  s.pages.push_back({G, G, 0, false});
  CHECK_THAT(bridge_blocker(s), Catch::Contains("host-located"));
  CHECK(widened_types(0, true, true) == kTypePosixFd);
  CHECK(widened_types(kTypeFabric, true, true) == (kTypeFabric | kTypePosixFd));
  CHECK(widened_types(kTypeFabric, true, false) == kTypeFabric);
  CHECK(widened_types(0, false, true) == 0);
  CHECK(handle_type_names(0) == "none");
  CHECK(handle_type_names(kTypePosixFd | kTypeFabric) == "POSIX_FD|FABRIC");
  CHECK(handle_type_names(0x40) == "0x40");
}

TEST_CASE("free-exported and importer-side findings") {
  ExportTable::Dropped d{
      3, 2, 5, 5 * G, 0x7f0000000000ull, EventRef{9, 0, 1, 0, "cudaIpcGetMemHandle"}};
  Finding f = free_exported_finding(d, "cuMemUnmap", 0x7f0000000000ull, G);
  CHECK(f.cls == FindingClass::FreeExported);
  CHECK_THAT(f.msg, Catch::Contains("bridge export 3"));
  CHECK_THAT(f.msg, Catch::Contains("still hold 2 open(s)"));
  REQUIRE(valid_json(f.state_json));
  CHECK(nlohmann::json::parse(f.state_json)["importer_opens"] == 2);
  CHECK(f.related.at(0).ev.seq == 9);

  Handle h = sample();
  std::set<std::string> msgs;
  for (auto why : {OpenFailure::CorruptHandle, OpenFailure::SameProcess, OpenFailure::ExporterGone,
                   OpenFailure::NotExporter, OpenFailure::OtherUser, OpenFailure::UnknownExport,
                   OpenFailure::BadNonce, OpenFailure::ProtocolError, OpenFailure::ExportFailed,
                   OpenFailure::ImportFailed, OpenFailure::NoContext}) {
    Finding o = open_failure_finding(why, "cudaIpcOpenMemHandle", h, "detail");
    CHECK(o.cls == FindingClass::IpcVmm);
    CHECK_THAT(o.msg,
               Catch::StartsWith("cudaIpcOpenMemHandle of a cumemguard bridge handle failed: "));
    CHECK_THAT(o.msg, Catch::EndsWith("(detail)"));
    CHECK(valid_json(o.state_json));
    msgs.insert(o.msg);
  }
  CHECK(msgs.size() == 11);
}
