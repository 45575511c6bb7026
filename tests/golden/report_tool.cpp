// SPDX-License-Identifier: Apache-2.0
// Standalone `cumemguard-report` for the golden tests: the same code `cumemguard report` runs.
#include "report.h"

int main(int argc, char **argv) {
  return cmg::report_main(argc, argv);
}
