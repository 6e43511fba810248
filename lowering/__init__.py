"""tilews.lowering: the Tile IR (``ir``, ``dtypes``, ``printer``, ``verify``), the frontend that
builds it, the passes that lower it (``passes``; each backend's ``pipeline`` of them) and the
plans they record (``plans``), the reference interpreter, and what every backend shares: the
``Backend`` interface (``backend``), the machine's ``capabilities``, a backend's ``config``
(capabilities, pipeline, schedule policy, code options), the argument check (``arguments``) and
the settings (``settings``).

It imports no backend, no user-facing ``tilews`` module, and neither Triton nor mlx.
"""
