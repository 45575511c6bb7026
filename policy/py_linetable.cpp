// SPDX-License-Identifier: Apache-2.0
// Location tables (see py_linetable.h): the decoders of CPython's Objects/codeobject.c
// (3.10: advance/_PyCode_CheckLineNumber; 3.11+: get_line_delta, scan_varint, next_code_delta).
#include "py_linetable.h"

#include <cstdint>

namespace cmg {
namespace {

struct Reader {
  std::span<const std::uint8_t> t;
  std::size_t i = 0;
  bool ok = true;
  std::uint8_t byte() {
    if (i >= t.size()) return ok = false, 0;
    return t[i++];
  }
  // Varints of 6-bit groups, bit 6 set on every group but the last.
  std::uint32_t varint() {
    std::uint32_t b = byte(), v = b & 63;
    for (unsigned shift = 6; (b & 64) && ok && shift < 32; shift += 6) {
      b = byte();
      v |= (b & 63) << shift;
    }
    return v;
  }
  std::int32_t svarint() {
    const std::uint32_t u = varint();
    return (u & 1) ? -static_cast<std::int32_t>(u >> 1) : static_cast<std::int32_t>(u >> 1);
  }
};

int locations(std::span<const std::uint8_t> table, int first_line, int addr) {
  Reader r{table};
  // 64 bits: a table that is not what it claims cannot overflow the count.
  std::int64_t line = first_line;
  int start = 0;
  while (r.i < table.size()) {
    const std::uint8_t b = r.byte();
    if (!(b & 0x80)) return -1;  // not the first byte of an entry: the table is not what we think
    const int code = (b >> 3) & 15;
    const int end = start + ((b & 7) + 1) * 2;  // code units of 2 bytes
    int delta = 0;
    bool none = false;
    switch (code) {
      case 15:
        none = true;
        break;  // PY_CODE_LOCATION_INFO_NONE
      case 14:  // LONG
        delta = r.svarint();
        r.varint();
        r.varint();
        r.varint();
        break;
      case 13:
        delta = r.svarint();
        break;  // NO_COLUMNS
      case 12:
      case 11:
      case 10:  // ONE_LINE0..2
        delta = code - 10;
        r.byte();
        r.byte();
        break;
      default:
        r.byte();
        break;  // SHORT0..9
    }
    if (!r.ok) return -1;
    line += delta;
    if (line < 0 || line > INT32_MAX) return -1;
    if (addr < end) return none ? -1 : static_cast<int>(line);
    start = end;
  }
  return -1;
}

int pep626(std::span<const std::uint8_t> table, int first_line, int addr) {
  std::int64_t line = first_line, shown = -1;
  int start = 0, end = 0;
  for (std::size_t i = 0; i + 1 < table.size(); i += 2) {
    start = end;
    end += table[i];
    const int delta = static_cast<std::int8_t>(table[i + 1]);
    if (delta == -128) {
      shown = -1;
    } else {
      line += delta;
      shown = line;
    }
    if (start != end && start <= addr && addr < end)
      return shown > INT32_MAX ? -1 : static_cast<int>(shown);
  }
  return -1;
}

}  // namespace

int py_line_for(std::span<const std::uint8_t> table, PyLineTable format, int first_line, int addr) {
  if (addr < 0) return first_line;
  return format == PyLineTable::Locations ? locations(table, first_line, addr)
                                          : pep626(table, first_line, addr);
}

}  // namespace cmg
