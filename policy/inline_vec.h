// SPDX-License-Identifier: Apache-2.0
// A vector that keeps its first N elements inline: a VMM call's inverse delta (the mappings an
// unmap took away, the allocations that died with it) is almost always one element, and a heap
// allocation per call for it would cost more than the rest of the model's work.
#pragma once

#include <array>
#include <cstddef>
#include <utility>
#include <vector>

namespace cmg {

template <class T, std::size_t N>
class InlineVec {
 public:
  void push_back(T v) {
    if (n_ < N)
      inline_[n_] = std::move(v);
    else
      more_.push_back(std::move(v));
    ++n_;
  }
  std::size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T &operator[](std::size_t i) { return i < N ? inline_[i] : more_[i - N]; }
  const T &operator[](std::size_t i) const { return i < N ? inline_[i] : more_[i - N]; }
  template <class F>
  void each(F &&f) const {
    for (std::size_t i = 0; i < n_; ++i) f((*this)[i]);
  }

 private:
  std::array<T, N> inline_{};
  std::vector<T> more_;
  std::size_t n_ = 0;
};

}  // namespace cmg
