"""Backend selection, decided on first use so that importing stays driver-free."""

import functools


@functools.cache
def has_gpu():
    from triton.backends.nvidia.driver import CudaDriver

    return CudaDriver.is_active()
