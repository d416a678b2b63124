/*
 * A vendor-like libcuda.so.1 for the tests of the GPU-box path (--driver real / auto).
 *
 * It knows nothing of diagtools: it behaves as NVIDIA's driver does where the
 * tool depends on it.  On the first cuInit of a process it dlopens the library
 * named by CUDA_INJECTION64_PATH and calls its InitializeInjection, on the
 * calling thread, before cuInit returns; cuDeviceGetCount answers
 * CUDA_ERROR_NOT_INITIALIZED (3) until cuInit ran in this process; and in a
 * process forked after its parent's cuInit every call, cuInit included,
 * answers CUDA_ERROR_NOT_INITIALIZED, as the real driver does.  One device.
 *
 * Built by the tests with flags that make the faulty drivers the tests need:
 *   -DSTANDIN_NO_INJECTION  never calls the injection library (an old driver, or one built without it);
 *   -DSTANDIN_NO_STATE      has no cuDeviceGetCount (the state probe cannot ask);
 *   -DSTANDIN_VERSION=N     what cuDriverGetVersion answers (default 12080).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef STANDIN_VERSION
#define STANDIN_VERSION 12080
#endif

typedef int CUresult;
enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, INVALID_DEVICE = 101, NOT_FOUND = 500 };

static pid_t init_pid = 0;

static int initialized_here(void) { return init_pid != 0 && init_pid == getpid(); }
static int forked_after_init(void) { return init_pid != 0 && init_pid != getpid(); }

static void load_injection(void)
{
#ifndef STANDIN_NO_INJECTION
    const char *path = getenv("CUDA_INJECTION64_PATH");
    if (path == NULL || path[0] == '\0')
        return;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL)
        return; /* the real driver goes on without its injection library */
    int (*initialize)(void) = (int (*)(void))dlsym(handle, "InitializeInjection");
    if (initialize != NULL)
        initialize();
#endif
}

CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return INVALID_VALUE;
    if (forked_after_init())
        return NOT_INITIALIZED;
    if (initialized_here())
        return OK;
    init_pid = getpid();
    load_injection();
    return OK;
}

CUresult cuDriverGetVersion(int *version)
{
    if (version == NULL)
        return INVALID_VALUE;
    *version = STANDIN_VERSION;
    return OK;
}

#ifndef STANDIN_NO_STATE
CUresult cuDeviceGetCount(int *count)
{
    if (count == NULL)
        return INVALID_VALUE;
    if (!initialized_here())
        return NOT_INITIALIZED;
    *count = 1;
    return OK;
}
#endif

CUresult cuDeviceGet(int *device, int ordinal)
{
    if (!initialized_here())
        return NOT_INITIALIZED;
    if (device == NULL)
        return INVALID_VALUE;
    if (ordinal != 0)
        return INVALID_DEVICE;
    *device = 0;
    return OK;
}

CUresult cuDeviceGetName(char *name, int length, int device)
{
    if (!initialized_here())
        return NOT_INITIALIZED;
    if (name == NULL || length <= 0 || device != 0)
        return INVALID_VALUE;
    strncpy(name, "vendor stand-in GPU", (size_t)length - 1);
    name[length - 1] = '\0';
    return OK;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, int device)
{
    if (!initialized_here())
        return NOT_INITIALIZED;
    if (value == NULL || device != 0)
        return INVALID_VALUE;
    *value = attribute == 75 ? 9 : attribute == 76 ? 0 : 1; /* compute capability 9.0 */
    return OK;
}

CUresult cuGetErrorName(CUresult error, const char **text)
{
    if (text == NULL)
        return INVALID_VALUE;
    *text = error == OK ? "CUDA_SUCCESS" : error == NOT_INITIALIZED ? "CUDA_ERROR_NOT_INITIALIZED" : "CUDA_ERROR_UNKNOWN";
    return OK;
}

CUresult cuGetErrorString(CUresult error, const char **text) { return cuGetErrorName(error, text); }

/* Entry points by name, as cuda-python and the CUDA runtime ask for them. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status)
{
    (void)version;
    (void)flags;
    if (symbol == NULL || pfn == NULL)
        return INVALID_VALUE;
    *pfn = dlsym(RTLD_DEFAULT, symbol);
    if (status != NULL)
        *status = *pfn != NULL ? 0 : 1;
    return *pfn != NULL ? OK : NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags)
{
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
