// SPDX-License-Identifier: Apache-2.0
// The location-table decoders (policy/py_linetable.h) against CPython's own answers, and which
// Python files belong to the program (policy/program_frame.h).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "program_frame.h"
#include "py_linetable.h"

using namespace cmg;

namespace {

// A function with a multi-line comprehension, a raise across lines and an except clause, compiled
// by CPython 3.11.2: co_firstlineno 2, co_linetable as below, and the line of every code unit as
// co_lines() gives it (-1: no location). 3.13 and 3.14 use the same format.
const std::vector<std::uint8_t> kTable311 = {
    0x80, 0x00, 0xd8, 0x08, 0x09, 0x88, 0x41, 0x89, 0x05, 0x80, 0x41, 0xd8, 0x07, 0x08, 0x88, 0x31,
    0x82, 0x75, 0x80, 0x75, 0xf0, 0x02, 0x01, 0x0d, 0x20, 0xf0, 0x00, 0x01, 0x0d, 0x20, 0xdd, 0x16,
    0x1b, 0x98, 0x41, 0x91, 0x68, 0x94, 0x68, 0xf0, 0x03, 0x01, 0x0d, 0x20, 0xf1, 0x00, 0x01, 0x0d,
    0x20, 0xf4, 0x00, 0x01, 0x0d, 0x20, 0x88, 0x01, 0xe0, 0x0f, 0x10, 0x88, 0x08, 0xf0, 0x02, 0x05,
    0x05, 0x0d, 0xdd, 0x0e, 0x18, 0xf0, 0x02, 0x01, 0x0d, 0x16, 0xf1, 0x03, 0x02, 0x0f, 0x17, 0xf4,
    0x00, 0x02, 0x0f, 0x17, 0xf0, 0x00, 0x02, 0x09, 0x17, 0xf8, 0xf5, 0x06, 0x00, 0x0c, 0x16, 0xf0,
    0x00, 0x01, 0x05, 0x0d, 0xf0, 0x00, 0x01, 0x05, 0x0d, 0xf0, 0x00, 0x01, 0x05, 0x0d, 0xd8, 0x08,
    0x0c, 0x88, 0x04, 0xf0, 0x03, 0x01, 0x05, 0x0d, 0xf8, 0xf8, 0xf8, 0xe0, 0x0b, 0x0c, 0x80, 0x48};
const std::vector<int> kLines311 = {
    2, 3, 3, 3, 3, 3,  4,  4,  4,  4,  4,  4,  5,  5,  6,  6,  6,  6,  6,  6,  6,  6,  6, 6, 6,
    6, 6, 6, 5, 5, 5,  5,  5,  5,  5,  5,  5,  7,  7,  8,  9,  9,  9,  9,  9,  9,  10, 9, 9, 9,
    9, 9, 9, 9, 9, -1, 12, 12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 12, -1, -1, -1, 14, 14};

}  // namespace

TEST_CASE("the 3.11+ location table gives CPython's line for every instruction") {
  for (std::size_t unit = 0; unit < kLines311.size(); ++unit) {
    INFO("byte offset " << unit * 2);
    CHECK(py_line_for(kTable311, PyLineTable::Locations, 2, static_cast<int>(unit * 2)) ==
          kLines311[unit]);
  }
  // Before the first instruction (a frame that has not started): the first line.
  CHECK(py_line_for(kTable311, PyLineTable::Locations, 2, -1) == 2);
  // Past the end, or a table cut in the middle of an entry: no line, never a read past it.
  CHECK(py_line_for(kTable311, PyLineTable::Locations, 2, 146) == -1);
  const std::vector<std::uint8_t> cut(kTable311.begin(), kTable311.begin() + 23);
  CHECK(py_line_for(cut, PyLineTable::Locations, 2, 60) == -1);
  // A byte without the entry bit where an entry must start: not a location table.
  CHECK(py_line_for(std::vector<std::uint8_t>{0x05, 0x00}, PyLineTable::Locations, 2, 0) == -1);
}

TEST_CASE("the 3.10 table of (bytes, line delta) pairs, -128 meaning no line (PEP 626)") {
  // First line 10: 6 bytes at 11, 4 at 12, an empty range moving to 13, 8 bytes without a line,
  // then 10 bytes at 15.
  const std::vector<std::uint8_t> t = {6, 1, 4, 1, 0, 1, 8, 0x80, 10, 2};
  CHECK(py_line_for(t, PyLineTable::Pep626, 10, 0) == 11);
  CHECK(py_line_for(t, PyLineTable::Pep626, 10, 5) == 11);
  CHECK(py_line_for(t, PyLineTable::Pep626, 10, 6) == 12);
  CHECK(py_line_for(t, PyLineTable::Pep626, 10, 10) == -1);
  CHECK(py_line_for(t, PyLineTable::Pep626, 10, 18) == 15);
  CHECK(py_line_for(t, PyLineTable::Pep626, 10, 27) == 15);
  CHECK(py_line_for(t, PyLineTable::Pep626, 10, 28) == -1);
  CHECK(py_line_for(t, PyLineTable::Pep626, 10, -1) == 10);
}

TEST_CASE("program files are not the interpreter's, the standard library's or a package's") {
  CHECK(python_program_file("/work/app/b_double.py"));
  CHECK(python_program_file("train.py"));
  CHECK(python_program_file("<string>"));  // python -c
  CHECK(python_program_file("/home/u/lib/python3.11-notes/x.py"));
  CHECK_FALSE(python_program_file(""));
  CHECK_FALSE(python_program_file("<frozen importlib._bootstrap>"));
  CHECK_FALSE(python_program_file("/usr/lib/python3.11/threading.py"));
  CHECK_FALSE(
      python_program_file("/root/.pyenv/versions/3.11.7/lib/python3.11/ctypes/__init__.py"));
  CHECK_FALSE(python_program_file("/usr/lib64/python3.12/asyncio/events.py"));
  CHECK_FALSE(python_program_file("/venv/lib/python3.12/site-packages/torch/cuda/memory.py"));
  CHECK_FALSE(python_program_file("/usr/lib/python3/dist-packages/numpy/core/x.py"));
}
