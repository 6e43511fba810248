"""TileLang's ``tilelang.transform`` as far as user programs reach it: ``PassConfigKey``
(``from tilelang.transform import PassConfigKey``)."""
from tilews.pass_config import PassConfigKey

__all__ = ["PassConfigKey"]
