"""Stand-in for TileLang's ``tilelang.rocm`` (AMD matrix-core emitters and target queries):
tilews reaches AMD GPUs through Triton only. Its names import; using one says so
(``tilews.unprovided``)."""
from tilews.unprovided import stub_package

__getattr__ = stub_package(__name__, "tilews reaches AMD GPUs through Triton's target='triton'; "
                                     "AMD matrix-core emitters and target queries are not provided")
