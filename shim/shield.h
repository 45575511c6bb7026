// SPDX-License-Identifier: Apache-2.0
// No exception leaves a C entry point of the shim. Every hook body runs inside shielded(): what
// the shim itself does for a call can fail (std::bad_alloc in a host that exhausted RLIMIT_AS and
// handles malloc returning NULL), and without the shim that call would have reached the driver.
// So a failure inside the shim is caught, the call is forwarded unchanged — or, when the driver
// was called already, its answer is returned, never a second call — and the shim says so once.
// From then on the models may have missed a call: they prove nothing, and every call goes to the
// driver (as in report mode). Thread cancellation (glibc's forced unwind) is let through, as it
// passes through any C function: catching it would abort the process (which is also why the
// exports are not declared noexcept).
#pragma once

#include <cxxabi.h>

#include <type_traits>
#include <utility>

#include "cuda_api.h"

namespace cmg::shim {

// Says once (raw write, nothing allocated) that the shim failed inside `api` and forwards from now
// on; turns the models' proofs off. Throws nothing but a thread's forced unwind.
void internal_failure(Api api);

// A non-owning reference to a callable (no allocation, unlike std::function).
template <class Sig>
class FnRef;
template <class R, class... A>
class FnRef<R(A...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FnRef>>>
  FnRef(F &&f) noexcept  // NOLINT: implicit, like std::function
      : obj_(const_cast<void *>(static_cast<const void *>(&f))),
        call_([](void *o, A... a) -> R { return (*static_cast<std::remove_reference_t<F> *>(o))(
                                             std::forward<A>(a)...); }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void *obj_;
  R (*call_)(void *, A...);
};

// The real call, remembering whether it was made and what it answered.
template <class R, class Real>
class Forward {
 public:
  explicit Forward(Real &real) : real_(real) {}
  R operator()() {
    status_ = real_();
    done_ = true;
    return status_;
  }
  bool done() const { return done_; }
  R status() const { return status_; }

 private:
  Real &real_;
  R status_{};
  bool done_ = false;
};

// Runs body(fwd), where fwd() makes the real call. Inlined into the hook: on the path of every
// call it costs what the few stores of Forward cost, no frame of its own.
template <class R, class Real, class Body>
__attribute__((always_inline)) inline R shielded(Api api, Real &real, Body &&body) {
  Forward<R, Real> fwd(real);
  try {
    return body(fwd);
  } catch (abi::__forced_unwind &) {
    throw;
  } catch (...) {
    internal_failure(api);
    return fwd.done() ? fwd.status() : fwd();
  }
}

}  // namespace cmg::shim
