// SPDX-License-Identifier: Apache-2.0
// The JSON-line builder every log record is written with: one JSON object in a caller-provided
// buffer, without allocating. Strings are escaped (bytes that are not UTF-8 become \u00XX).
// Without a spill target, a record that does not fit is cut (string values shortened, later
// members left out, "cut":true added) and the object is still closed properly. With one, the
// buffer is handed to it whenever it fills and the record goes on: a record of any length is
// built in a fixed buffer (LogLine in eventlog.h writes such pieces straight into the log).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cmg::shim {

class JsonLine {
 public:
  // Receives the bytes of a record in order, as the buffer fills (never the final piece: that is
  // what finish() returns).
  class Spill {
   public:
    virtual void piece(std::string_view bytes) = 0;

   protected:
    ~Spill() = default;
  };

  JsonLine(char *buf, std::size_t cap, Spill *spill = nullptr);
  JsonLine &str(std::string_view key, std::string_view v);
  // A string the shim's own tables hold (an API, kind or class name: a C identifier or a word of
  // letters and '-', by construction of api_*.def and mem_kind_name), written without the
  // escaping pass.
  JsonLine &ident(std::string_view key, std::string_view v);
  JsonLine &hex(std::string_view key, std::uint64_t v);
  JsonLine &num(std::string_view key, std::int64_t v);
  JsonLine &unum(std::string_view key, std::uint64_t v);
  JsonLine &boolean(std::string_view key, bool v);
  JsonLine &raw(std::string_view key, std::string_view json);  // an already-rendered JSON value
  JsonLine &begin_object(std::string_view key);
  JsonLine &end_object();
  JsonLine &begin_array(std::string_view key);
  JsonLine &end_array();
  // Array elements (inside begin_array): a string, a hex string, raw JSON, or an object (closed
  // with end_object).
  JsonLine &elem_str(std::string_view v);
  JsonLine &elem_hex(std::uint64_t v);
  JsonLine &elem_raw(std::string_view json);
  JsonLine &elem_object();
  // Closes the object and adds '\n'. The view (the last piece, with a spill target) stays valid
  // while the buffer lives.
  std::string_view finish();

 private:
  bool room(std::size_t n);
  __attribute__((noinline, cold)) bool room_full(std::size_t n);
  __attribute__((noinline, cold)) bool spill_now();  // false without a spill target
  void put(std::string_view s);
  void put_long(std::string_view s);  // a raw value that may exceed the buffer (spill target)
  void put_escaped(std::string_view s);
  void put_u00(unsigned char c);
  bool key(std::string_view k, std::size_t extra);
  bool elem(std::size_t n);
  char *buf_;
  std::size_t cap_, len_ = 0;
  Spill *spill_;
  bool first_ = true;
  int skip_ = 0;   // objects/arrays left out because they did not fit
  int depth_ = 0;  // objects/arrays open: one closing byte each is kept free (fuzz_jsonline found
                   // deep nesting writing its closing brackets past the buffer)
  bool cut_ = false;
};

}  // namespace cmg::shim
