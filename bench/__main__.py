"""``python -m tilews.bench``: the same as the ``tilews-bench`` console script."""
import sys

from .cli import main

sys.exit(main())
