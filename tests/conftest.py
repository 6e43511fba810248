import os

# Outputs that tilews allocates (out_idx) start as NaN in every test: an unwritten element fails.
os.environ["TILEWS_POISON_OUTPUTS"] = "1"
# Each test run compiles into its own cache unless told otherwise.
os.environ.setdefault("TILEWS_CACHE_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                        f"tilews-test-cache-{os.getpid()}"))

# Without a GPU, target="triton" runs under Triton's CPU interpreter, which must be chosen before
# anything imports triton.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
