#!/usr/bin/env bash
# check.sh: verify every Promela model in this folder with SPIN, and make
# sure SPIN catches each of its mutants.
#
# A model is a file NAME.pml. It is checked exhaustively: one run for its
# assertions and end states (pan compiled with -DSAFETY), and one run per
# `ltl NAME` formula it declares (acceptance cycles, weak fairness). A
# mutant is declared by a line `//@ mutant N what it breaks`; the model is
# then checked again with -DMUTANT=N, and at least one of its runs must
# report an error. Output, one line per model and per mutant:
#
#   MODEL <name> states=<N> depth=<D> errors=0 time=<s>
#   MUTANT <name>/<N> errors=<K> (<what it breaks>)
#
# It exits 1 if a model has an error, a search was not completed (its
# depth or memory bound), a model or mutant could not be checked at all
# (spin, gcc or pan failed; an ltl formula without a name, or whose claim
# pan did not run), or a mutant was not caught by an error that pan
# reports. Usage: check.sh [NAME...] (default: every model).
set -euo pipefail
cd "$(dirname "$0")"
command -v spin >/dev/null || { echo "check.sh: spin is not installed: run make deps (Debian package spin)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Bounds of one run of pan: the search depth, and the memory it may use.
DEPTH=${MODEL_DEPTH:-2000000}
MEMLIM=${MODEL_MEMLIM:-2048}

# run MODEL DEFINES...: every run of MODEL with the given -D flags;
# prints "states depth errors seconds cut broken" summed (depth: the
# maximum) over the runs, and stops at the first run with an error. cut:
# a search was not completed; broken: a run could not be made (spin, gcc
# or pan failed, or pan gave no verdict), its errors counted as none.
run() {
  local pml=$1; shift
  local dir
  dir=$(mktemp -d -p "$work")
  cp "$pml" "$dir/"
  if grep -Eq '^[[:space:]]*ltl[[:space:]]*\{' "$pml"; then
    echo "check.sh: $pml: an ltl formula without a name is never checked: name it" >&2
    echo "0 0 0 0 0 1"; return
  fi
  (cd "$dir" && spin -a "$@" "$pml" >spin.log 2>&1) || { echo "check.sh: spin -a $pml $*:" >&2; cat "$dir/spin.log" >&2; echo "0 0 0 0 0 1"; return; }
  local claims
  claims=$(sed -n 's/^[[:space:]]*ltl[[:space:]]\+\([A-Za-z_][A-Za-z0-9_]*\).*/\1/p' "$pml")
  local states=0 depth=0 errors=0 secs=0 cut=0
  local kinds=(safety)
  for c in $claims; do kinds+=("ltl:$c"); done
  for k in "${kinds[@]}"; do
    local cflags=(-O0 -DMEMLIM="$MEMLIM" -DVECTORSZ=4096) pflags=(-m"$DEPTH" -n)
    if [[ $k == safety ]]; then
      cflags+=(-DSAFETY -DNOCLAIM)
    else
      cflags+=(-DNFAIR=3)
      pflags+=(-a -f -N "${k#ltl:}")
    fi
    (cd "$dir" && gcc "${cflags[@]}" -o pan pan.c 2>gcc.log) || { echo "check.sh: gcc for $pml $* ($k):" >&2; cat "$dir/gcc.log" >&2; echo "0 0 0 0 0 1"; return; }
    local out
    out=$(cd "$dir" && ./pan "${pflags[@]}" 2>&1 || true)
    local s d e t
    s=$(sed -n 's/^[[:space:]]*\([0-9.e+]*\) states, stored.*/\1/p' <<<"$out" | head -1)
    d=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' <<<"$out" | head -1)
    e=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' <<<"$out" | head -1)
    t=$(sed -n 's/^pan: elapsed time \([0-9.e+-]*\) seconds.*/\1/p' <<<"$out" | head -1)
    local why=""
    if [[ -z $e || -z $s ]]; then
      why="pan gave no verdict"
    elif [[ $k != safety ]] && ! grep -Eq 'never claim[[:space:]]+\+' <<<"$out"; then
      why="pan ran no never claim for ${k#ltl:}"
    fi
    if [[ -n $why ]]; then
      echo "check.sh: $pml $* ($k): $why:" >&2
      echo "$out" | tail -20 >&2
      echo "0 0 0 0 0 1"; return
    fi
    if grep -Eq "max search depth too small|Search not completed|reached -DMEMLIM bound|out of memory" <<<"$out" || [[ $s == 0 ]]; then
      cut=1
    fi
    if [[ ${MODEL_VERBOSE:-} != "" || ( $e != 0 && $* != *MUTANT* ) ]]; then
      echo "--- $pml $* ($k)" >&2
      echo "$out" | grep -v "^[[:space:]]*$" | head -40 >&2
    fi
    states=$(awk -v a="$states" -v b="${s:-0}" 'BEGIN{printf "%d", a+b}')
    depth=$(( depth > ${d:-0} ? depth : ${d:-0} ))
    errors=$(( errors + e ))
    secs=$(awk -v a="$secs" -v b="${t:-0}" 'BEGIN{printf "%.2f", a+b}')
    if [[ $e != 0 ]]; then break; fi
  done
  echo "$states $depth $errors $secs $cut 0"
}

models=("$@")
if [[ ${#models[@]} == 0 ]]; then
  for f in *.pml; do models+=("${f%.pml}"); done
fi
status=0
for m in "${models[@]}"; do
  pml=$m.pml
  [[ -f $pml ]] || { echo "check.sh: no model $pml" >&2; status=1; continue; }
  read -r states depth errors secs cut broken < <(run "$pml")
  echo "MODEL $m states=$states depth=$depth errors=$errors time=${secs}s"
  if [[ $errors != 0 || $broken != 0 ]]; then status=1; fi
  if [[ $cut != 0 ]]; then echo "check.sh: $m: a search was not completed (depth bound $DEPTH, memory bound ${MEMLIM} MB): raise MODEL_DEPTH or MODEL_MEMLIM" >&2; status=1; fi
  while read -r n what; do
    read -r _ _ errors _ _ broken < <(run "$pml" -DMUTANT="$n")
    echo "MUTANT $m/$n errors=$errors ($what)"
    if [[ $errors == 0 || $broken != 0 ]]; then status=1; fi
  done < <(sed -n 's|^//@ mutant \([0-9][0-9]*\) \(.*\)|\1 \2|p' "$pml")
done
exit $status
