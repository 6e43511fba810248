timeout 560 python -m tilews.bench attention --targets hopper --shapes bench,4x32x4096x64 --rounds 5 --json $OUT/attention_bench.json 2>&1 | tail -40
