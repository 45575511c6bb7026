#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Generates the shim's linker version script from the symbol lists, so the list of exports lives
# in the .def files only. The script is anonymous (no version node): a named node would make the
# loader skip our definitions for versioned references such as cudaMalloc@libcudart.so.13
# (interposers.md 9.1).
import re
import sys

out, defs = sys.argv[1], sys.argv[2:]
# dlsym (loader.cpp), exit (exiting.cpp: a second thread calling exit() waits for the first
# one's summary), _exit and _Exit (exiting.cpp: the last records are written first) are the libc
# functions the shim defines.
names = ["dlsym", "exit", "_exit", "_Exit"]
for path in defs:
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*CMG_(?:DRV|RT|NCCL|PUBLIC|ENV)\(\s*([A-Za-z_][A-Za-z0-9_]*)", line)
            if m:
                names.append(m.group(1))
with open(out, "w") as f:
    f.write("{\n  global:\n")
    for n in names:
        f.write("    %s;\n" % n)
    f.write("  local:\n    *;\n};\n")
