"""Platform detection: counts CUDA devices when it is imported."""

from cuda.bindings import driver


class CudaPlatform:
    def __init__(self):
        (status,) = driver.cuInit(0)
        self.available = status == driver.CUresult.CUDA_SUCCESS
        self.device_count = driver.cuDeviceGetCount()[1] if self.available else 0


current_platform = CudaPlatform()
