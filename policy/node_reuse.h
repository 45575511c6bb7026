// SPDX-License-Identifier: Apache-2.0
// Node reuse for the model's ordered maps: an allocation and its free (or a VMM cycle) insert and
// erase one record of each kind, which would otherwise be a malloc and a free per record per call
// (measured: a third of the instructions the model added, docs/performance.md). Erased nodes are
// kept in a small spare list and reused by the next insertion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

namespace cmg::detail {

inline constexpr std::size_t kSpareNodes = 16;  // nodes kept per kind of record

// Inserts or overwrites key -> value in m, taking a node from `spare` when there is one.
template <class Map, class V>
void put_reusing(Map &m, std::vector<typename Map::node_type> &spare,
                 const typename Map::key_type &key, V &&value) {
  if (spare.empty()) {
    m.insert_or_assign(key, std::forward<V>(value));
    return;
  }
  typename Map::node_type nh = std::move(spare.back());
  spare.pop_back();
  nh.key() = key;
  nh.mapped() = std::forward<V>(value);
  auto res = m.insert(std::move(nh));
  if (!res.inserted) {
    res.position->second = std::move(res.node.mapped());
    spare.push_back(std::move(res.node));
  }
}

template <class Node>
void recycle(std::vector<Node> &spare, Node nh, std::size_t cap = kSpareNodes) {
  if (nh && spare.size() < cap) spare.push_back(std::move(nh));
}  // else the handle's destructor frees the node

// Erases *it, keeping its node; returns the next iterator.
template <class Map>
typename Map::iterator erase_keep(Map &m, std::vector<typename Map::node_type> &spare,
                                  typename Map::iterator it) {
  auto next = std::next(it);
  recycle(spare, m.extract(it));
  return next;
}

// Maps of disjoint ranges keyed by start offset (mappings and sleeping ranges of a reservation,
// live allocations by address): the first entry that ends after `off` is the one before
// upper_bound(off), or upper_bound(off) itself. Walking from there while entries start before the
// end visits exactly the overlapping ones, in O(log n + k): PyTorch's expandable segments keep
// thousands of mappings in one reservation, and every VMM call of theirs passes here.
template <class Map, class End>
auto first_ending_after(Map &m, std::uint64_t off, End &&end_of) {
  auto it = m.upper_bound(off);
  if (it != m.begin()) {
    auto prev = std::prev(it);
    if (end_of(prev->second) > off) return prev;
  }
  return it;
}

}  // namespace cmg::detail
