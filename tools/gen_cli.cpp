// SPDX-License-Identifier: Apache-2.0
// Build-time writer of the man pages and the bash completion from the commands' table (cli.h):
//   gen_cli man COMMAND VERSION OUT     (COMMAND "-" for cumemguard itself)
//   gen_cli completion OUT
//   gen_cli exits-md OUT                (the README's exit status table)
// Not installed; the build runs it.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli.h"

int main(int argc, char **argv) {
  using namespace cmg::tools::cli;
  std::string text;
  const char *out = nullptr;
  if (argc == 5 && std::strcmp(argv[1], "man") == 0) {
    const std::string name = std::strcmp(argv[2], "-") == 0 ? "" : argv[2];
    text = man_page(command(name), argv[3]);
    out = argv[4];
  } else if (argc == 3 && std::strcmp(argv[1], "completion") == 0) {
    text = bash_completion();
    out = argv[2];
  } else if (argc == 3 && std::strcmp(argv[1], "exits-md") == 0) {
    text = exit_table_markdown();
    out = argv[2];
  } else {
    std::fprintf(stderr, "Usage: gen_cli man COMMAND VERSION OUT | gen_cli completion OUT | "
                         "gen_cli exits-md OUT\n");
    return 64;
  }
  std::FILE *f = std::fopen(out, "we");
  if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) {
    std::perror(out);
    return 73;
  }
  return 0;
}
