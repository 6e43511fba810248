"""``tilelang.carver.arch.driver``: the device facts TileLang's examples ask for."""
from tilews.targets import num_sms


def get_num_sms() -> int:
    """Streaming multiprocessors of the current CUDA device (``tilews.num_sms()``: 132, an H100
    SXM's, without a GPU)."""
    return num_sms()
