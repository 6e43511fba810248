"""``python -m bench``: the same as the ``tilews-bench`` console script."""
import sys

from bench.cli import main

sys.exit(main())
