"""Stand-in for TileLang's ``tilelang.cuda`` (hand-written tensor-core emitters: the MMA /
ldmatrix macro generators, their fragment layouts, the sparse-metadata layouts): tilews picks
and emits the matrix instructions itself (``T.gemm``). Its names import; using one says so
(``tilews.unprovided``)."""
from tilews.unprovided import stub_package

__getattr__ = stub_package(__name__, "tilews chooses and emits the tensor-core instructions "
                                     "itself (T.gemm); hand-written MMA / ldmatrix emitters and "
                                     "their layouts are not provided")
