#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The integration oracle (run_case.py) must see a shim that changes what a program gets. Each check
# feeds it the steps of a run without the shim and of a run with it, as a regressed shim would
# print them, and requires a failure; then the same with the shim as it should behave, and
# requires a pass. (The oracle compared with a table that said "any error", accepted "n/a" from
# the fake and fell back to a second expectation when the fake did not re-issue a value.)
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_case as rc  # noqa: E402


def fails(fn):
    try:
        fn()
    except rc.Failure:
        return True
    return False


def with_shim(without, got, shim=(), varies=(), real=False):
    want = dict(without)
    want.update(dict(shim))
    rc.compare_steps(got, want, "with shim", real, exact=True, varies=varies)


def main():
    bad = []
    base = {"interior": rc.RIV, "second_free": rc.RIV}
    # 1. An error code the shim changed (the table said any error: the old oracle passed it).
    if not fails(lambda: with_shim(base, {"interior": "cudaErrorUnknown", "second_free": rc.RIV})):
        bad.append("a changed error code was not seen")
    # 2. A status the shim turned into success where no difference is declared.
    if not fails(lambda: with_shim(base, {"interior": rc.RS, "second_free": rc.RIV})):
        bad.append("a refusal turned into success was not seen")
    # 3. A step only the run with the shim printed.
    if not fails(lambda: with_shim(base, dict(base, extra="1"))):
        bad.append("a step only the shim's run printed was not seen")
    # 4. A step the shim's run lost.
    if not fails(lambda: with_shim(base, {"interior": rc.RIV})):
        bad.append("a step missing with the shim was not seen")
    # 5. n/a from the fake driver (it can always observe), accepted from the real one.
    if not fails(lambda: with_shim({"live_after": "0"}, {"live_after": "n/a"})):
        bad.append("n/a was accepted on the fake")
    if fails(lambda: rc.compare_steps({"live_after": "n/a"}, {"live_after": "0"}, "x", True)):
        bad.append("n/a was refused on the real driver")
    # 6. A value the fake did not re-issue: no fall-back expectation on the fake.
    c = rc.CASES["P02"]
    base2, _, _ = rc.variants("P02", c, {"b.reused_value": "0"}, real=False)
    if base2.get("b.reused_value") != "1":
        bad.append("P02 fell back to the not-re-issued expectation on the fake")
    base3, _, _ = rc.variants("P02", c, {"b.reused_value": "0"}, real=True)
    if base3.get("b.reused_value") != "0":
        bad.append("P02 has no not-re-issued expectation on the real driver")
    # 7. An Err() step: exact on the fake, any error on the real driver.
    if not fails(lambda: rc.compare_steps({"x": rc.IV}, {"x": rc.Err(rc.RIV)}, "x", False)):
        bad.append("Err() accepted another code on the fake")
    if fails(lambda: rc.compare_steps({"x": "cudaErrorUnknown"}, {"x": rc.Err(rc.RIV)}, "x", True)):
        bad.append("Err() refused another error on the real driver")
    # The shim as it should behave: declared differences and measurements pass.
    if fails(lambda: with_shim({"a": rc.IV, "t_ms": "300"}, {"a": rc.S, "t_ms": "0"},
                               shim={"a": rc.S}, varies=("t_ms",))):
        bad.append("declared differences were refused")
    for b in bad:
        print("FAIL " + b)
    if not bad:
        print("ok oracle")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
