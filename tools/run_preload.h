// SPDX-License-Identifier: Apache-2.0
// What `cumemguard run` preloads: the shim, behind the sanitizer runtime the program needs first.
#pragma once

#include <string>
#include <vector>

namespace cmg::tools {

// True for the file name of a sanitizer runtime that must be the first object loaded
// (AddressSanitizer, ThreadSanitizer, HWAddressSanitizer and LeakSanitizer, gcc's and clang's):
// libasan.so.8, libclang_rt.asan-x86_64.so, ...
bool is_sanitizer_runtime(const std::string &path);

// DT_NEEDED entries of an ELF file, in order; empty when it is not a readable ELF object with a
// dynamic section (a static program, a script, a missing file).
std::vector<std::string> elf_needed(const std::string &path);

// The sanitizer runtimes the program links (its own DT_NEEDED), following a `#!` line to the
// interpreter it names (`#!/usr/bin/env python3` through PATH), at most a few levels deep. The
// program is found as execvp() finds it. Names are returned as DT_NEEDED gives them (a soname):
// preloaded by that name, ld.so finds the same file the program would, through the program's own
// RPATH/RUNPATH, LD_LIBRARY_PATH and the cache.
std::vector<std::string> program_sanitizer_runtimes(const std::string &program);

// The LD_PRELOAD the program gets: sanitizer runtimes first (those already in `old`, then those
// in `runtimes` not already there), then the shim, then the rest of `old` in its order. ld.so
// separates entries by colons or spaces; the result uses colons.
std::string preload_with(const std::string &shim, const char *old,
                         const std::vector<std::string> &runtimes = {});

}  // namespace cmg::tools
