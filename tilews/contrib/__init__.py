"""TileLang's ``tilelang.contrib`` as far as its examples reach it: ``nvcc``'s compute-capability
queries."""
