#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Writes one man page from a command's own --help and --version (help2man), so the pages and the
# help never disagree. The include file adds what --help does not say (environment, files, see
# also).
#   gen-man.sh CUMEMGUARD SUBCOMMAND|- "one-line description" INCLUDE.h2m OUT.1
set -eu
exe=$1 sub=$2 name=$3 include=$4 out=$5
if [ "$sub" = "-" ]; then
  help2man --no-info --section=1 --name="$name" --include="$include" --output="$out" "$exe"
else
  help2man --no-info --section=1 --name="$name" --include="$include" \
    --help-option="$sub --help" --version-option="$sub --version" --output="$out.tmp" "$exe"
  # help2man names the page after the program; a subcommand's page is cumemguard-SUB(1).
  upper=$(printf '%s' "$sub" | tr '[:lower:]' '[:upper:]')
  sed -e "s/^\\.TH CUMEMGUARD /.TH CUMEMGUARD-$upper /" \
      -e "/^\\.SH NAME/{n;s/^cumemguard /cumemguard-$sub /;s/^cumemguard\\\\- /cumemguard-$sub \\\\- /}" \
      "$out.tmp" > "$out"
  rm -f "$out.tmp"
fi
