// SPDX-License-Identifier: Apache-2.0
// A statically linked program: ld.so never runs for it, so LD_PRELOAD (the shim) is ignored.
#include <stdio.h>

int main(void) {
  puts("static program ran");
  return 0;
}
