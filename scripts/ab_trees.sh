#!/usr/bin/env bash
# Before / after in one GPU run: the same command in an older tree (.base) and in this checkout,
# processes alternating which goes first from round to round (the GPU slows over a burst).
#     mkdir .base && git archive <old commit> | tar -x -C .base      (here; .base is ignored: carry it)
#     TILEWS_DEVICE_CMD="bash scripts/ab_trees.sh 4 'python {root}/scripts/probe_fp8_graph_time.py --tag {which} --json \$OUT/g_{which}_{r}.json'" bash scripts/device_run.sh
# In the command, {which} is base or new, {r} the round, {root} this checkout (so a script that
# only this tree has can run against the old tree's tilews). Each run goes through the tree's own
# scripts/device_run.sh with its imports in a symlink view, so each process imports its own tree.
set -uo pipefail
rounds=$1; cmd=$2
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; export OUT="$(cd "$OUT" && pwd)"
root="$PWD"
[ -d "$root/.base" ] || { echo "ab_trees: no .base tree here (mkdir .base && git archive <commit> | tar -x -C .base)"; exit 2; }
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="base new"; else order="new base"; fi
  for which in $order; do
    dir="$root"; [ "$which" = base ] && dir="$root/.base"
    c="${cmd//\{which\}/$which}"; c="${c//\{r\}/$r}"; c="${c//\{root\}/$root}"
    echo "=== round $r: $which"
    (cd "$dir" && TILEWS_IMPORTS_VIEW=1 TILEWS_DEVICE_CMD="$c" bash scripts/device_run.sh 2>&1 \
        | grep -v "^imports: \|^torch ")
  done
done
