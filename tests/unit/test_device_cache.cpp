// SPDX-License-Identifier: Apache-2.0
// The per-thread current device (policy/device_cache.h): asked once, then remembered until the
// thread forgets it or the process-wide epoch moves; a failed question is not remembered.
#include <catch2/catch.hpp>

#include <thread>

#include "device_cache.h"

using namespace cmg;

TEST_CASE("the device is asked once and remembered") {
  DeviceEpoch e;
  CachedDevice c;
  int asked = 0;
  auto q = [&] { return ++asked, 1; };
  REQUIRE(c.get(e, q) == 1);
  REQUIRE(c.get(e, q) == 1);
  REQUIRE(asked == 1);
}

TEST_CASE("forget drops only the thread's own answer") {
  DeviceEpoch e;
  CachedDevice mine, other;
  int dev = 0, asked = 0;
  auto q = [&] { return ++asked, dev; };
  REQUIRE(mine.get(e, q) == 0);
  REQUIRE(other.get(e, q) == 0);
  dev = 1;
  mine.forget();
  REQUIRE(mine.get(e, q) == 1);
  REQUIRE(other.get(e, q) == 0);  // its context did not change
  REQUIRE(asked == 3);
}

TEST_CASE("the epoch drops every thread's answer") {
  DeviceEpoch e;
  CachedDevice a;
  int dev = 0;
  REQUIRE(a.get(e, [&] { return dev; }) == 0);
  int seen = -2;
  std::thread([&] {
    CachedDevice b;
    REQUIRE(b.get(e, [] { return 0; }) == 0);
    e.advance();
    seen = b.get(e, [] { return 1; });
  }).join();
  REQUIRE(seen == 1);
  dev = 1;
  REQUIRE(a.get(e, [&] { return dev; }) == 1);
}

TEST_CASE("no current context is asked again, not remembered") {
  DeviceEpoch e;
  CachedDevice c;
  int asked = 0, dev = -1;
  auto q = [&] { return ++asked, dev; };
  REQUIRE(c.get(e, q) == -1);
  REQUIRE(c.get(e, q) == -1);
  REQUIRE(asked == 2);
  dev = 0;
  REQUIRE(c.get(e, q) == 0);
  REQUIRE(c.get(e, q) == 0);
  REQUIRE(asked == 3);
}

TEST_CASE("an epoch that moves while the driver is asked leaves the answer stale") {
  DeviceEpoch e;
  CachedDevice c;
  int asked = 0;
  REQUIRE(c.get(e, [&] { return ++asked, e.advance(), 0; }) == 0);
  REQUIRE(c.get(e, [&] { return ++asked, 1; }) == 1);
  REQUIRE(asked == 2);
}
