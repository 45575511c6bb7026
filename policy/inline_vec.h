// SPDX-License-Identifier: Apache-2.0
// A vector that keeps its first N elements inline: a VMM call's inverse delta (the mappings an
// unmap took away, the allocations that died with it) is almost always one element, and a heap
// allocation per call for it would cost more than the rest of the model's work. The inline
// elements are raw storage, constructed only when pushed: a call that takes nothing away (most
// VMM calls, and every refused one) writes nothing there.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace cmg {

template <class T, std::size_t N>
class InlineVec {
  // Copied and dropped as bytes: only plain records (the model's Mapping, Sleeper, PhysAlloc).
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);

 public:
  InlineVec() = default;
  InlineVec(const InlineVec &o) : more_(o.more_), n_(o.n_) { copy_inline(o); }
  InlineVec &operator=(const InlineVec &o) {
    more_ = o.more_;
    n_ = o.n_;
    copy_inline(o);
    return *this;
  }
  // The source is left empty: its heap part moved, so its count must not name those elements.
  InlineVec(InlineVec &&o) noexcept : more_(std::move(o.more_)), n_(o.n_) {
    copy_inline(o);
    o.clear_moved();
  }
  InlineVec &operator=(InlineVec &&o) noexcept {
    if (this == &o) return *this;
    more_ = std::move(o.more_);
    n_ = o.n_;
    copy_inline(o);
    o.clear_moved();
    return *this;
  }

  void push_back(T v) {
    if (n_ < N)
      ::new (static_cast<void *>(&inline_[n_ * sizeof(T)])) T(std::move(v));
    else
      more_.push_back(std::move(v));
    ++n_;
  }
  std::size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T &operator[](std::size_t i) { return i < N ? at_inline(i) : more_[i - N]; }
  const T &operator[](std::size_t i) const {
    return i < N ? const_cast<InlineVec *>(this)->at_inline(i) : more_[i - N];
  }
  template <class F>
  void each(F &&f) const {
    for (std::size_t i = 0; i < n_; ++i) f((*this)[i]);
  }
  bool contains(const T &v) const {
    for (std::size_t i = 0; i < n_; ++i)
      if ((*this)[i] == v) return true;
    return false;
  }

 private:
  T &at_inline(std::size_t i) {
    return *std::launder(reinterpret_cast<T *>(&inline_[i * sizeof(T)]));
  }
  void clear_moved() {
    more_.clear();
    n_ = 0;
  }
  // Only the constructed elements: the rest of the storage was never written.
  void copy_inline(const InlineVec &o) {
    for (std::size_t i = 0; i < o.n_ && i < N; ++i)
      ::new (static_cast<void *>(&inline_[i * sizeof(T)])) T(o[i]);
  }
  alignas(T) unsigned char inline_[N * sizeof(T)];
  std::vector<T> more_;
  std::size_t n_ = 0;
};

}  // namespace cmg
