#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs PROGRAM and compares its stdout with EXPECTED exactly (EXPECTED's lines starting with # are
# comments); prints the difference when they differ.
# Usage: compare-output.sh PROGRAM EXPECTED   (exit 77 of PROGRAM = no device: passed through as skip)
set -u
prog=$1
expected=$2
out=$(mktemp) || exit 1
want=$(mktemp) || exit 1
trap 'rm -f "$out" "$want"' EXIT
grep -v '^#' "$expected" >"$want"
"$prog" >"$out"
rc=$?
[ "$rc" -eq 77 ] && exit 77
if ! diff -u "$want" "$out"; then
  echo "compare-output: $prog differs from $expected (exit status $rc)" >&2
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  echo "compare-output: $prog exited with $rc" >&2
  exit 1
fi
exit 0
