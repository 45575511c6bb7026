// SPDX-License-Identifier: Apache-2.0
// A reference to a callable, without owning or copying it: what the models' visitors take. A
// std::function parameter copies a lambda that captures more than two pointers onto the heap,
// and the exit path, which visits the models, must not allocate (docs/reliability.md).
#pragma once

#include <type_traits>
#include <utility>

namespace cmg {

template <class Sig>
class FnRef;

template <class R, class... A>
class FnRef<R(A...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FnRef>>>
  FnRef(F &&f)  // NOLINT: implicit, like std::function
      : obj_(const_cast<void *>(static_cast<const void *>(&f))), call_([](void *o, A... a) -> R {
          return (*static_cast<std::remove_reference_t<F> *>(o))(std::forward<A>(a)...);
        }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void *obj_;
  R (*call_)(void *, A...);
};

}  // namespace cmg
