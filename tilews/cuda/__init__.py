"""TileLang's ``tilelang.cuda`` (hand-written tensor-core emitters: the MMA / ldmatrix macro
generators, their fragment layouts, the sparse-metadata layouts) has no tilews counterpart:
tilews picks and emits the matrix instructions itself (``T.gemm``). Importing it says so."""
raise ImportError("tilews does not provide TileLang's tilelang.cuda modules (hand-written MMA / "
                  "ldmatrix emitters and their layouts): tilews chooses the tensor-core "
                  "instructions itself; write the product with T.gemm")
