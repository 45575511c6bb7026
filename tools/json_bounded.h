// SPDX-License-Identifier: Apache-2.0
// Free-form JSON values of a log (a finding's `args` and `state`, header options) re-written
// compact and bounded: a hostile log nested 100,000 deep once overflowed the stack of a recursive
// copy and made `--json` output grow with the square of the depth (tests/fuzz, fuzz_report).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace cmg::report {

// The value in `raw` as compact JSON, always valid: levels past `max_depth` are replaced by the
// string "[nested deeper than N levels: cut]", output past about `max_bytes` by a "[cut at N
// bytes]" element before every open container is closed, raw control bytes inside strings by
// \u00XX. Text that is not one JSON value becomes the string "[not valid JSON]". Iterative:
// nothing here recurses on its input.
std::string bounded_json(std::string_view raw, std::size_t max_depth, std::size_t max_bytes);

// Appends `s` as a JSON string (quotes included): `"`, `\` and control bytes escaped, and `<` as
// \u003c so the text can sit inside an HTML <script> element.
void append_json_string(std::string &out, std::string_view s);
std::string json_string(std::string_view s);

}  // namespace cmg::report
