/* SPDX-License-Identifier: Apache-2.0 */
/* Links late_free_lib, whose destructor frees CUDA memory after the shim's destructor ran. */
#include <stdio.h>

int late_free_loaded(void);

int main(void) {
  printf("loaded %d\n", late_free_loaded());
  return 0;
}
