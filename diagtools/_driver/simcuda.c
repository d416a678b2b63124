/*
 * A stand-in for the CUDA driver library (libcuda.so.1) with no GPU behind it.
 *
 * It models what matters for import-time CUDA bugs: the driver's init state
 * and its fork semantics.  Before cuInit every call answers
 * CUDA_ERROR_NOT_INITIALIZED; after cuInit there is one simulated device of
 * compute capability 9.0; in a process forked after the parent's cuInit, every
 * call (cuInit included) answers CUDA_ERROR_NOT_INITIALIZED again, as the real
 * driver does.  Entry points it does not model answer CUDA_ERROR_NOT_SUPPORTED.
 *
 * When the process hosting it is a Python interpreter that installed a hook as
 * sys._diagtools_on_cuinit, the first successful cuInit calls that hook while
 * the caller's Python frames are still on the stack, so the exact calling line
 * can be recorded whoever made the call (ctypes, cuda-python, C extensions).
 * The same hook is called from InitializeInjection, the entry point the real
 * driver calls in a library named by CUDA_INJECTION64_PATH.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

#define SIM_DRIVER_VERSION 13000
#define SIM_DEVICE_NAME "diagtools simulated GPU (no hardware)"
#define SIM_TOTAL_MEM ((size_t)80 << 30)

static pid_t init_pid = 0;          /* process that called cuInit, 0 if none */
static int primary_refcount = 0;
static int sim_context_token = 0;   /* address used as the primary context */
static CUcontext current_context = NULL;
static unsigned int primary_flags = 0;

/* ---- Python hook: report the first cuInit to an interested interpreter ---- */

typedef int (*gil_ensure_fn)(void);
typedef void (*gil_release_fn)(int);
typedef void *(*sys_getobject_fn)(const char *);
typedef void *(*call_object_fn)(void *, void *);
typedef void (*decref_fn)(void *);
typedef void (*err_clear_fn)(void);
typedef int (*is_initialized_fn)(void);

static void notify_python(const char *event)
{
    if (getenv("DIAGTOOLS_SIMCUDA_NO_HOOK") != NULL && strcmp(event, "cuInit") == 0)
        return;
    is_initialized_fn is_initialized = (is_initialized_fn)dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    gil_ensure_fn gil_ensure = (gil_ensure_fn)dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
    gil_release_fn gil_release = (gil_release_fn)dlsym(RTLD_DEFAULT, "PyGILState_Release");
    sys_getobject_fn sys_getobject = (sys_getobject_fn)dlsym(RTLD_DEFAULT, "PySys_GetObject");
    call_object_fn call_object = (call_object_fn)dlsym(RTLD_DEFAULT, "PyObject_CallObject");
    decref_fn decref = (decref_fn)dlsym(RTLD_DEFAULT, "Py_DecRef");
    err_clear_fn err_clear = (err_clear_fn)dlsym(RTLD_DEFAULT, "PyErr_Clear");
    if (!is_initialized || !gil_ensure || !gil_release || !sys_getobject || !call_object ||
        !decref || !err_clear || !is_initialized())
        return;
    int state = gil_ensure();
    void *hook = sys_getobject("_diagtools_on_cuinit");
    if (hook != NULL) {
        void *result = call_object(hook, NULL);
        if (result != NULL)
            decref(result);
        else
            err_clear();
    }
    gil_release(state);
}

int InitializeInjection(void)
{
    notify_python("injection");
    return 1;
}

#ifndef DIAGTOOLS_INJECTION_ONLY

/* In a process forked after its parent's cuInit, tell an interested interpreter which
 * call the driver refused (sys._diagtools_on_cuda_refused(name)), so the child's
 * failing line can be shown beside the fork that caused it. */
typedef void *(*call_function_fn)(void *, const char *, ...);

static void notify_refusal(const char *call)
{
    is_initialized_fn is_initialized = (is_initialized_fn)dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    gil_ensure_fn gil_ensure = (gil_ensure_fn)dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
    gil_release_fn gil_release = (gil_release_fn)dlsym(RTLD_DEFAULT, "PyGILState_Release");
    sys_getobject_fn sys_getobject = (sys_getobject_fn)dlsym(RTLD_DEFAULT, "PySys_GetObject");
    call_function_fn call_function = (call_function_fn)dlsym(RTLD_DEFAULT, "PyObject_CallFunction");
    decref_fn decref = (decref_fn)dlsym(RTLD_DEFAULT, "Py_DecRef");
    err_clear_fn err_clear = (err_clear_fn)dlsym(RTLD_DEFAULT, "PyErr_Clear");
    if (!is_initialized || !gil_ensure || !gil_release || !sys_getobject || !call_function ||
        !decref || !err_clear || !is_initialized())
        return;
    int state = gil_ensure();
    void *hook = sys_getobject("_diagtools_on_cuda_refused");
    if (hook != NULL) {
        void *result = call_function(hook, "s", call);
        if (result != NULL)
            decref(result);
        else
            err_clear();
    }
    gil_release(state);
}


/* ---- init and fork semantics ---- */

static int initialized_here(void) { return init_pid != 0 && init_pid == getpid(); }
static int poisoned_by_fork(void) { return init_pid != 0 && init_pid != getpid(); }

#define REQUIRE_INIT()                         \
    do {                                       \
        if (!initialized_here()) {             \
            if (poisoned_by_fork())            \
                notify_refusal(__func__);      \
            return CUDA_ERROR_NOT_INITIALIZED; \
        }                                      \
    } while (0)

CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (poisoned_by_fork()) {
        notify_refusal("cuInit");
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (init_pid == 0) {
        init_pid = getpid();
        notify_python("cuInit");
    }
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version)
{
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const char *override = getenv("DIAGTOOLS_SIMCUDA_VERSION");
    *version = override ? atoi(override) : SIM_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

/* ---- devices ---- */

static CUresult check_device(CUdevice dev) { return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }

CUresult cuDeviceGetCount(int *count)
{
    REQUIRE_INIT();
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    REQUIRE_INIT();
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    REQUIRE_INIT();
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    strncpy(name, SIM_DEVICE_NAME, (size_t)len - 1);
    name[len - 1] = '\0';
    return CUDA_SUCCESS;
}

/* Attribute numbers from the CUdevice_attribute enum. */
static int attribute_value(int attrib, int *known)
{
    *known = 1;
    switch (attrib) {
    case 1: return 1024;      /* MAX_THREADS_PER_BLOCK */
    case 2: case 3: return 1024; /* MAX_BLOCK_DIM_X/Y */
    case 4: return 64;        /* MAX_BLOCK_DIM_Z */
    case 5: return 2147483647; /* MAX_GRID_DIM_X */
    case 6: case 7: return 65535; /* MAX_GRID_DIM_Y/Z */
    case 8: return 49152;     /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 10: return 32;       /* WARP_SIZE */
    case 12: return 65536;    /* MAX_REGISTERS_PER_BLOCK */
    case 13: return 1980000;  /* CLOCK_RATE (kHz) */
    case 16: return 132;      /* MULTIPROCESSOR_COUNT */
    case 36: return 2619000;  /* MEMORY_CLOCK_RATE */
    case 37: return 6144;     /* GLOBAL_MEMORY_BUS_WIDTH */
    case 38: return 52428800; /* L2_CACHE_SIZE */
    case 39: return 2048;     /* MAX_THREADS_PER_MULTIPROCESSOR */
    case 75: return 9;        /* COMPUTE_CAPABILITY_MAJOR */
    case 76: return 0;        /* COMPUTE_CAPABILITY_MINOR */
    case 81: return 233472;   /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    case 97: return 232448;   /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    default:
        *known = 0;
        return 0;
    }
}

CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev)
{
    REQUIRE_INIT();
    if (value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    int known;
    *value = attribute_value(attrib, &known);
    return known ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    REQUIRE_INIT();
    if (major == NULL || minor == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    *major = 9;
    *minor = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    REQUIRE_INIT();
    if (bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = SIM_TOTAL_MEM;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev) { return cuDeviceTotalMem_v2(bytes, dev); }

CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice dev)
{
    REQUIRE_INIT();
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    for (int i = 0; i < 16; i++)
        uuid[i] = (unsigned char)(0xd1 + i);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

/* ---- primary context and current context ---- */

static CUcontext primary_context(void) { return (CUcontext)&sim_context_token; }

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    REQUIRE_INIT();
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    primary_refcount++;
    *ctx = primary_context();
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    REQUIRE_INIT();
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    if (primary_refcount == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    primary_refcount--;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    REQUIRE_INIT();
    if (flags == NULL || active == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    *flags = primary_flags;
    *active = primary_refcount > 0;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    REQUIRE_INIT();
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    primary_flags = flags;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    REQUIRE_INIT();
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    primary_refcount = 0;
    if (current_context == primary_context())
        current_context = NULL;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    REQUIRE_INIT();
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = current_context;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    REQUIRE_INIT();
    if (ctx != NULL && ctx != primary_context())
        return CUDA_ERROR_INVALID_CONTEXT;
    current_context = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *dev)
{
    REQUIRE_INIT();
    if (dev == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (current_context == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = 0;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
    REQUIRE_INIT();
    return current_context ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    REQUIRE_INIT();
    if (free_bytes == NULL || total_bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (current_context == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    *total_bytes = SIM_TOTAL_MEM;
    *free_bytes = SIM_TOTAL_MEM;
    return CUDA_SUCCESS;
}

/* ---- errors ---- */

static const char *error_name(CUresult error)
{
    switch (error) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    default: return NULL;
    }
}

static const char *error_text(CUresult error)
{
    switch (error) {
    case CUDA_SUCCESS: return "no error";
    case CUDA_ERROR_INVALID_VALUE: return "invalid argument";
    case CUDA_ERROR_NOT_INITIALIZED: return "initialization error";
    case CUDA_ERROR_INVALID_DEVICE: return "invalid device ordinal";
    case CUDA_ERROR_INVALID_CONTEXT: return "invalid device context";
    case CUDA_ERROR_NOT_FOUND: return "named symbol not found";
    case CUDA_ERROR_NOT_SUPPORTED: return "operation not supported (simulated driver)";
    default: return NULL;
    }
}

CUresult cuGetErrorName(CUresult error, const char **out)
{
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *out = error_name(error);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **out)
{
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *out = error_text(error);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Any entry point this stand-in does not model: a clean, documented refusal. */
static CUresult unsupported_entry_point(void) { return CUDA_ERROR_NOT_SUPPORTED; }

CUresult cuGetExportTable(const void **table, const void *id)
{
    (void)id;
    if (table != NULL)
        *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- entry-point lookup, as cuda-python resolves every driver API ---- */

struct entry_point {
    const char *name;
    void *fn;
};

#define ENTRY(fn) { #fn, (void *)fn }
static const struct entry_point entry_points[] = {
    ENTRY(cuInit), ENTRY(cuDriverGetVersion), ENTRY(cuDeviceGetCount), ENTRY(cuDeviceGet),
    ENTRY(cuDeviceGetName), ENTRY(cuDeviceGetAttribute), ENTRY(cuDeviceComputeCapability),
    ENTRY(cuDeviceTotalMem), ENTRY(cuDeviceGetUuid), ENTRY(cuDevicePrimaryCtxRetain),
    ENTRY(cuDevicePrimaryCtxRelease), ENTRY(cuDevicePrimaryCtxGetState),
    {"cuDevicePrimaryCtxSetFlags", (void *)cuDevicePrimaryCtxSetFlags_v2},
    {"cuDevicePrimaryCtxReset", (void *)cuDevicePrimaryCtxReset_v2},
    ENTRY(cuCtxGetCurrent), ENTRY(cuCtxSetCurrent), ENTRY(cuCtxGetDevice), ENTRY(cuCtxSynchronize),
    {"cuMemGetInfo", (void *)cuMemGetInfo_v2},
    ENTRY(cuGetErrorName), ENTRY(cuGetErrorString), ENTRY(cuGetExportTable),
};
#undef ENTRY

/* Versioned names (cuFoo_v2, cuFoo_ptds) resolve to the modelled base entry point. */
static void *lookup_entry_point(const char *symbol)
{
    size_t n = strcspn(symbol, "_");
    for (size_t i = 0; i < sizeof(entry_points) / sizeof(entry_points[0]); i++) {
        const char *name = entry_points[i].name;
        if (strlen(name) == n && strncmp(name, symbol, n) == 0)
            return entry_points[i].fn;
    }
    return NULL;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, uint64_t flags,
                             int *symbol_status)
{
    (void)cuda_version;
    (void)flags;
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    void *fn = lookup_entry_point(symbol);
    *pfn = fn ? fn : (void *)unsupported_entry_point;
    if (symbol_status != NULL)
        *symbol_status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, uint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, NULL);
}
#endif /* DIAGTOOLS_INJECTION_ONLY */
