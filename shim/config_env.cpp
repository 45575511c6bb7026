// SPDX-License-Identifier: Apache-2.0
// Environment policies applied once at load, before any library reads the environment.
#include "summary.h"

namespace cmg::shim {

void on_load() {}

}  // namespace cmg::shim
