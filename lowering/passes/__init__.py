"""The passes: one module per pass, each with ``run(kernel, config) -> kernel`` (pure,
location-preserving, its contract in its module docstring).

Which passes a backend runs, and in which order, is its ``Pipeline``, declared in the backend's
own module (``lowering/pipeline.py``; docs/design.md §5 shows every backend's). A pass never
decides whether it applies to a target: a backend that does not need it leaves it out.
"""
