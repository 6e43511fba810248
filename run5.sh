export PYTHONPATH=$PWD
timeout 560 python scripts/tune_attention.py --auto-only --dim 64 --rounds 7 --blocks '128x128 t256 s3;128x128 t256 s4' 2>&1 | grep -v "^{'work'"
