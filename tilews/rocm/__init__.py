"""TileLang's ``tilelang.rocm`` (AMD matrix-core emitters and target queries) has no tilews
counterpart: tilews reaches AMD GPUs through Triton only. Importing it says so."""
raise ImportError("tilews does not provide TileLang's tilelang.rocm modules (AMD matrix-core "
                  "emitters and target queries): tilews reaches AMD GPUs through Triton's "
                  "target='triton'")
