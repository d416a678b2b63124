"""Where compiled kernels go, keyed by the GPU's architecture, decided at import."""

import ctypes


def _device_count():
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    if cuda.cuInit(0) != 0:
        return 0
    count = ctypes.c_int(0)
    cuda.cuDeviceGetCount(ctypes.byref(count))
    return count.value


class CompilationContext:
    def __init__(self):
        self.devices = _device_count()

    def compile(self, name):
        return lambda x: x


CONTEXT = CompilationContext()
