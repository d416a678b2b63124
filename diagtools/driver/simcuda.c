/*
 * A stand-in for the CUDA driver library (libcuda.so.1) with no GPU behind it.
 *
 * It models what matters for import-time CUDA bugs: the driver's init state
 * and its fork semantics.  Before cuInit every modelled call answers
 * CUDA_ERROR_NOT_INITIALIZED; after cuInit there is one simulated device (see
 * simworld.h: compute capability 9.0, H100-class attributes); in a process
 * forked after the parent's cuInit, every call (cuInit included) answers
 * CUDA_ERROR_NOT_INITIALIZED again, as the real driver does.
 *
 * Every other driver API entry point exists too: the build generates a stub
 * for each name the installed cuda-bindings declares (simcuda_stubs.c in the
 * build directory), which answers CUDA_ERROR_NOT_SUPPORTED and is recorded as
 * a refusal.  cuGetExportTable, the undocumented door the CUDA runtime uses,
 * is refused and recorded the same way, and counts as the runtime's cuInit.
 * diagtools_sim_refusals() and
 * diagtools_sim_first_refusal() let a host ask afterwards whether the code it
 * ran hit the edge of the simulation.
 *
 * When the process hosting it is a Python interpreter that installed a hook as
 * sys._diagtools_on_cuinit, the first successful cuInit calls that hook while
 * the caller's Python frames are still on the stack, so the exact calling line
 * can be recorded whoever made the call (ctypes, cuda-python, C extensions).
 * The same hook is called from InitializeInjection, the entry point the real
 * driver calls in a library named by CUDA_INJECTION64_PATH.
 *
 * The driver never waits on the GIL without a bound: a caller that holds it
 * gets the hook on its own thread at once; any other caller has a helper
 * thread take the GIL and call the hook with the caller's thread id (its
 * frames stay put while it waits in the driver), for at most
 * DIAGTOOLS_SIMCUDA_HOOK_WAIT_MS (2000 ms).  A thread that holds the GIL while
 * it waits on the driver therefore cannot deadlock with one inside it; the
 * hook is then skipped and the scan's state probe sees the initialization.
 *
 * Thread safety follows the real driver: init and reference counts are
 * atomic, and each thread has its own context stack (cuCtxSetCurrent,
 * cuCtxPushCurrent and cuCtxPopCurrent act on the calling thread only).
 *
 * DIAGTOOLS_SIMCUDA_TRACE=1 prints every entry-point lookup and refusal to
 * stderr, to see what a library asks of the driver.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "simworld.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* ---- Python hooks: report driver events to an interested interpreter ---- */

#define CUINIT_HOOK "_diagtools_on_cuinit"
#define REFUSED_HOOK "_diagtools_on_cuda_refused"

/* The CPython C API the hooks use, resolved once per process (absent outside an interpreter). */
struct python_api {
    int (*is_initialized)(void);
    int (*gil_check)(void);
    int (*gil_ensure)(void);
    void (*gil_release)(int);
    void *(*sys_getobject)(const char *);
    void *(*call_function)(void *, const char *, ...);
    void (*decref)(void *);
    void (*err_clear)(void);
};

static struct python_api python;
static int python_found = 0;
static pthread_once_t python_once = PTHREAD_ONCE_INIT;

static void *python_symbol(const char *name, int *missing)
{
    void *symbol = dlsym(RTLD_DEFAULT, name);
    *missing |= symbol == NULL;
    return symbol;
}

static void resolve_python(void)
{
    int missing = 0;
    python.is_initialized = (int (*)(void))python_symbol("Py_IsInitialized", &missing);
    python.gil_check = (int (*)(void))python_symbol("PyGILState_Check", &missing);
    python.gil_ensure = (int (*)(void))python_symbol("PyGILState_Ensure", &missing);
    python.gil_release = (void (*)(int))python_symbol("PyGILState_Release", &missing);
    python.sys_getobject = (void *(*)(const char *))python_symbol("PySys_GetObject", &missing);
    python.call_function = (void *(*)(void *, const char *, ...))python_symbol("PyObject_CallFunction", &missing);
    python.decref = (void (*)(void *))python_symbol("Py_DecRef", &missing);
    python.err_clear = (void (*)(void))python_symbol("PyErr_Clear", &missing);
    python_found = !missing;
}

/* Whether this process is a running interpreter whose C API the hooks can call. */
static int python_running(void)
{
    pthread_once(&python_once, resolve_python);
    return python_found && python.is_initialized();
}

/* Call sys.<name>(thread) or sys.<name>(what, thread); the calling thread holds the GIL. */
static void call_hook(const char *name, const char *what, unsigned long thread)
{
    void *hook = python.sys_getobject(name);
    if (hook == NULL)
        return;
    void *result = what == NULL ? python.call_function(hook, "k", thread)
                                : python.call_function(hook, "sk", what, thread);
    if (result != NULL)
        python.decref(result);
    else
        python.err_clear();
}

/* One hook call handed to a helper thread; the helper and the waiting caller each own a reference. */
struct hook_call {
    const char *name;
    const char *what;
    unsigned long thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    enum { HOOK_WAITING, HOOK_CALLING, HOOK_DONE, HOOK_ABANDONED } state;
    int owners;
};

static void release_call(struct hook_call *call)
{
    if (__atomic_sub_fetch(&call->owners, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    pthread_cond_destroy(&call->changed);
    pthread_mutex_destroy(&call->lock);
    free(call);
}

static void set_state(struct hook_call *call, int state)
{
    pthread_mutex_lock(&call->lock);
    if (call->state != HOOK_ABANDONED)
        call->state = state;
    pthread_cond_broadcast(&call->changed);
    pthread_mutex_unlock(&call->lock);
}

/* The helper: take the GIL, then call the hook unless the caller stopped waiting meanwhile. */
static void *hook_helper(void *arg)
{
    struct hook_call *call = arg;
    int gil = python.gil_ensure();
    set_state(call, HOOK_CALLING);
    pthread_mutex_lock(&call->lock);
    int abandoned = call->state == HOOK_ABANDONED;
    pthread_mutex_unlock(&call->lock);
    if (!abandoned)
        call_hook(call->name, call->what, call->thread);
    python.gil_release(gil);
    set_state(call, HOOK_DONE);
    release_call(call);
    return NULL;
}

static long hook_wait_ms(void)
{
    const char *value = getenv("DIAGTOOLS_SIMCUDA_HOOK_WAIT_MS");
    return value != NULL && value[0] != '\0' ? atol(value) : 2000;
}

/* Wait for the helper: a bounded wait for the GIL, then as long as the hook runs. */
static void wait_for_helper(struct hook_call *call)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    long wait = hook_wait_ms();
    deadline.tv_sec += wait / 1000;
    deadline.tv_nsec += (wait % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&call->lock);
    while (call->state == HOOK_WAITING) {
        if (pthread_cond_timedwait(&call->changed, &call->lock, &deadline) == ETIMEDOUT &&
            call->state == HOOK_WAITING) {
            call->state = HOOK_ABANDONED;
            if (sim_tracing())
                fprintf(stderr, "diagtools simcuda: %s skipped: the GIL was not free within %ld ms\n",
                        call->name, wait);
        }
    }
    while (call->state == HOOK_CALLING)
        pthread_cond_wait(&call->changed, &call->lock);
    pthread_mutex_unlock(&call->lock);
}

/* Hand the hook call to a helper thread and wait for it, bounded; see the file's comment. */
static void call_hook_through_helper(const char *name, const char *what, unsigned long thread)
{
    struct hook_call *call = calloc(1, sizeof(*call));
    if (call == NULL)
        return;
    *call = (struct hook_call){.name = name, .what = what, .thread = thread, .state = HOOK_WAITING, .owners = 2};
    pthread_condattr_t attributes;
    pthread_condattr_init(&attributes);
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
    pthread_cond_init(&call->changed, &attributes);
    pthread_condattr_destroy(&attributes);
    pthread_mutex_init(&call->lock, NULL);
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    pthread_t helper;
    int started = pthread_create(&helper, &detached, hook_helper, call) == 0;
    pthread_attr_destroy(&detached);
    if (!started) {
        call->owners = 1;
        release_call(call);
        return;
    }
    wait_for_helper(call);
    release_call(call);
}

/*
 * Tell an interested interpreter about a driver event on the calling thread:
 * sys._diagtools_on_cuinit(thread) for the first cuInit, or
 * sys._diagtools_on_cuda_refused(call, thread) for a call refused in a child
 * forked after its parent's cuInit.
 */
static void notify_python(const char *name, const char *what)
{
    if (!python_running())
        return;
    unsigned long thread = (unsigned long)pthread_self();
    if (python.gil_check()) {
        call_hook(name, what, thread);
        return;
    }
    call_hook_through_helper(name, what, thread);
}

int InitializeInjection(void)
{
    notify_python(CUINIT_HOOK, NULL);
    return 1;
}

#ifndef DIAGTOOLS_INJECTION_ONLY

/* ---- init and fork semantics ---- */

static pid_t init_pid = 0; /* process that called cuInit, 0 if none; atomic */

static pid_t initialized_by(void) { return __atomic_load_n(&init_pid, __ATOMIC_ACQUIRE); }
static int initialized_here(void) { return initialized_by() != 0 && initialized_by() == getpid(); }
static int poisoned_by_fork(void) { return initialized_by() != 0 && initialized_by() != getpid(); }

/* Mark the driver initialized by this process: true for the one caller, of all threads, that did it. */
static int claim_init(void)
{
    pid_t expected = 0;
    return __atomic_compare_exchange_n(&init_pid, &expected, getpid(), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static void notify_refusal(const char *call) { notify_python(REFUSED_HOOK, call); }

/*
 * Hand the initialization made before a fork to this child, as if it had made it itself.
 *
 * The sweep imports a package once in a row child and forks each module below it from there,
 * without the fork handlers (see cuprobe.c, fork_continuing): each child goes on as the process
 * that imported the package.  The real driver's state does not survive a fork, so only the
 * simulation can do this.  Returns 1 when the driver was handed over, 0 when there was nothing to
 * hand over (never initialized, or initialized by this very process), and -1 when
 * DIAGTOOLS_SIMCUDA_NO_ADOPT asks the simulation to refuse, as the real driver would.
 */
int diagtools_sim_adopt_init(void)
{
    pid_t by = initialized_by();
    if (by == 0 || by == getpid())
        return 0;
    if (getenv("DIAGTOOLS_SIMCUDA_NO_ADOPT") != NULL)
        return -1;
    __atomic_store_n(&init_pid, getpid(), __ATOMIC_RELEASE);
    return 1;
}

/* Whether diagtools_sim_adopt_init would hand an initialization over (1) or refuse (0). */
int diagtools_sim_adoptable(void) { return getenv("DIAGTOOLS_SIMCUDA_NO_ADOPT") == NULL; }

/* The first cuInit of the process, unless DIAGTOOLS_SIMCUDA_NO_HOOK asks for silence. */
static void notify_cuinit(void)
{
    if (getenv("DIAGTOOLS_SIMCUDA_NO_HOOK") == NULL)
        notify_python(CUINIT_HOOK, NULL);
}

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
    if (claim_init())
        notify_cuinit();
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version)
{
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *version = sim_cuda_version();
    return CUDA_SUCCESS;
}

/* ---- refusals: where the simulation ends ---- */

#define DIAGTOOLS_SIM_REFUSED_EXPORT_TABLE 1u
#define DIAGTOOLS_SIM_REFUSED_ENTRY_POINT 2u
#define DIAGTOOLS_SIM_INIT_FOR_RUNTIME 4u

static struct sim_refusals refusals;
static char export_table_refusal[64];
static int export_table_named = 0; /* 0, 1 while one thread writes the name, 2 once written */

static void record_refusal(unsigned int kind, const char *what) { sim_refuse(&refusals, kind, what, "simcuda"); }

/*
 * What this process ran into at the edge of the simulation, as a bitmask:
 * 1 an export table was refused, 2 an unmodelled entry point was called,
 * 4 the driver was initialized on the runtime's behalf at an export-table
 * request (see cuGetExportTable) rather than by a cuInit call.
 */
unsigned int diagtools_sim_refusals(void) { return sim_refusal_mask(&refusals); }

/* The first refused call ("cuMemCreate", "cuGetExportTable"), or NULL. */
const char *diagtools_sim_first_refusal(void) { return sim_first_refusal(&refusals); }

/* Every generated stub lands here: a clean, documented refusal. */
CUresult diagtools_sim_unmodelled(const char *name)
{
    /* Before cuInit (and in a poisoned child) the real driver answers every call this way. */
    if (!initialized_here()) {
        if (poisoned_by_fork())
            notify_refusal(name);
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    record_refusal(DIAGTOOLS_SIM_REFUSED_ENTRY_POINT, name);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* "cuGetExportTable(<id in hex>)" for the first table asked, written once by one thread;
 * a thread that finds another one writing it gets the plain name. */
static const char *export_table_name(const void *id)
{
    int expected = 0;
    if (!__atomic_compare_exchange_n(&export_table_named, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return expected == 2 ? export_table_refusal : "cuGetExportTable";
    const unsigned char *bytes = (const unsigned char *)id;
    int at = snprintf(export_table_refusal, sizeof(export_table_refusal), "cuGetExportTable(");
    for (int i = 0; i < 16 && at < (int)sizeof(export_table_refusal) - 3; i++)
        at += snprintf(export_table_refusal + at, sizeof(export_table_refusal) - (size_t)at, "%02x", bytes[i]);
    snprintf(export_table_refusal + at, sizeof(export_table_refusal) - (size_t)at, ")");
    __atomic_store_n(&export_table_named, 2, __ATOMIC_RELEASE);
    return export_table_refusal;
}

/*
 * cuGetExportTable is the CUDA runtime's private door into the driver, asked
 * while the runtime initializes, before the cuInit it then makes.  Its tables
 * have no public contract to simulate, so the request is refused; but on a
 * real driver that runtime goes on to initialize CUDA, so the simulated driver
 * initializes on its behalf right here (same caller, same Python frames, the
 * same hook as cuInit) and records both facts.  The runtime call then fails,
 * after the moment that matters has been seen.
 */
CUresult cuGetExportTable(const void **table, const void *id)
{
    if (table != NULL)
        *table = NULL;
    if (table == NULL || id == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (poisoned_by_fork())
        return CUDA_ERROR_NOT_INITIALIZED;
    record_refusal(DIAGTOOLS_SIM_REFUSED_EXPORT_TABLE, export_table_name(id));
    if (claim_init()) {
        __atomic_fetch_or(&refusals.mask, DIAGTOOLS_SIM_INIT_FOR_RUNTIME, __ATOMIC_SEQ_CST);
        notify_cuinit();
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- devices ---- */

static CUresult check_device(CUdevice dev) { return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }

#define REQUIRE_DEVICE(dev)                         \
    do {                                            \
        if (check_device(dev) != CUDA_SUCCESS)      \
            return CUDA_ERROR_INVALID_DEVICE;       \
    } while (0)

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
    REQUIRE_DEVICE(dev);
    strncpy(name, SIM_DEVICE_NAME, (size_t)len - 1);
    name[len - 1] = '\0';
    return CUDA_SUCCESS;
}

/*
 * Every CUdevice_attribute of an H100 SXM-class board, by number (cuda.h's
 * CUdevice_attribute enum, through CUDA 13).  Numbers past the table are
 * attributes this driver is too old to know: CUDA_ERROR_INVALID_VALUE, as a
 * real older driver answers.
 */
static const int attribute_values[] = {
    [1] = 1024,          /* MAX_THREADS_PER_BLOCK */
    [2] = 1024,          /* MAX_BLOCK_DIM_X */
    [3] = 1024,          /* MAX_BLOCK_DIM_Y */
    [4] = 64,            /* MAX_BLOCK_DIM_Z */
    [5] = 2147483647,    /* MAX_GRID_DIM_X */
    [6] = 65535,         /* MAX_GRID_DIM_Y */
    [7] = 65535,         /* MAX_GRID_DIM_Z */
    [8] = 49152,         /* MAX_SHARED_MEMORY_PER_BLOCK */
    [9] = 65536,         /* TOTAL_CONSTANT_MEMORY */
    [10] = 32,           /* WARP_SIZE */
    [11] = 2147483647,   /* MAX_PITCH */
    [12] = 65536,        /* MAX_REGISTERS_PER_BLOCK */
    [13] = 1980000,      /* CLOCK_RATE, kHz */
    [14] = 512,          /* TEXTURE_ALIGNMENT */
    [15] = 1,            /* GPU_OVERLAP */
    [16] = SIM_MULTIPROCESSORS, /* MULTIPROCESSOR_COUNT */
    [17] = 0,            /* KERNEL_EXEC_TIMEOUT */
    [18] = 0,            /* INTEGRATED */
    [19] = 1,            /* CAN_MAP_HOST_MEMORY */
    [20] = 0,            /* COMPUTE_MODE: default */
    [21] = 131072,       /* MAXIMUM_TEXTURE1D_WIDTH */
    [22] = 131072,       /* MAXIMUM_TEXTURE2D_WIDTH */
    [23] = 65536,        /* MAXIMUM_TEXTURE2D_HEIGHT */
    [24] = 16384,        /* MAXIMUM_TEXTURE3D_WIDTH */
    [25] = 16384,        /* MAXIMUM_TEXTURE3D_HEIGHT */
    [26] = 16384,        /* MAXIMUM_TEXTURE3D_DEPTH */
    [27] = 32768,        /* MAXIMUM_TEXTURE2D_LAYERED_WIDTH */
    [28] = 32768,        /* MAXIMUM_TEXTURE2D_LAYERED_HEIGHT */
    [29] = 2048,         /* MAXIMUM_TEXTURE2D_LAYERED_LAYERS */
    [30] = 512,          /* SURFACE_ALIGNMENT */
    [31] = 1,            /* CONCURRENT_KERNELS */
    [32] = 1,            /* ECC_ENABLED */
    [33] = SIM_PCI_BUS,  /* PCI_BUS_ID */
    [34] = SIM_PCI_DEVICE, /* PCI_DEVICE_ID */
    [35] = 0,            /* TCC_DRIVER */
    [36] = 2619000,      /* MEMORY_CLOCK_RATE, kHz */
    [37] = 5120,         /* GLOBAL_MEMORY_BUS_WIDTH, bits */
    [38] = 52428800,     /* L2_CACHE_SIZE */
    [39] = 2048,         /* MAX_THREADS_PER_MULTIPROCESSOR */
    [40] = 3,            /* ASYNC_ENGINE_COUNT */
    [41] = 1,            /* UNIFIED_ADDRESSING */
    [42] = 32768,        /* MAXIMUM_TEXTURE1D_LAYERED_WIDTH */
    [43] = 2048,         /* MAXIMUM_TEXTURE1D_LAYERED_LAYERS */
    [44] = 1,            /* CAN_TEX2D_GATHER */
    [45] = 32768,        /* MAXIMUM_TEXTURE2D_GATHER_WIDTH */
    [46] = 32768,        /* MAXIMUM_TEXTURE2D_GATHER_HEIGHT */
    [47] = 8192,         /* MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE */
    [48] = 8192,         /* MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE */
    [49] = 32768,        /* MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE */
    [50] = SIM_PCI_DOMAIN, /* PCI_DOMAIN_ID */
    [51] = 32,           /* TEXTURE_PITCH_ALIGNMENT */
    [52] = 32768,        /* MAXIMUM_TEXTURECUBEMAP_WIDTH */
    [53] = 32768,        /* MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH */
    [54] = 2046,         /* MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS */
    [55] = 32768,        /* MAXIMUM_SURFACE1D_WIDTH */
    [56] = 131072,       /* MAXIMUM_SURFACE2D_WIDTH */
    [57] = 65536,        /* MAXIMUM_SURFACE2D_HEIGHT */
    [58] = 16384,        /* MAXIMUM_SURFACE3D_WIDTH */
    [59] = 16384,        /* MAXIMUM_SURFACE3D_HEIGHT */
    [60] = 16384,        /* MAXIMUM_SURFACE3D_DEPTH */
    [61] = 32768,        /* MAXIMUM_SURFACE1D_LAYERED_WIDTH */
    [62] = 2048,         /* MAXIMUM_SURFACE1D_LAYERED_LAYERS */
    [63] = 32768,        /* MAXIMUM_SURFACE2D_LAYERED_WIDTH */
    [64] = 32768,        /* MAXIMUM_SURFACE2D_LAYERED_HEIGHT */
    [65] = 2048,         /* MAXIMUM_SURFACE2D_LAYERED_LAYERS */
    [66] = 32768,        /* MAXIMUM_SURFACECUBEMAP_WIDTH */
    [67] = 32768,        /* MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH */
    [68] = 2046,         /* MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS */
    [69] = 268435456,    /* MAXIMUM_TEXTURE1D_LINEAR_WIDTH */
    [70] = 131072,       /* MAXIMUM_TEXTURE2D_LINEAR_WIDTH */
    [71] = 65000,        /* MAXIMUM_TEXTURE2D_LINEAR_HEIGHT */
    [72] = 2097120,      /* MAXIMUM_TEXTURE2D_LINEAR_PITCH */
    [73] = 32768,        /* MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH */
    [74] = 32768,        /* MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT */
    [75] = SIM_CC_MAJOR, /* COMPUTE_CAPABILITY_MAJOR */
    [76] = SIM_CC_MINOR, /* COMPUTE_CAPABILITY_MINOR */
    [77] = 32768,        /* MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH */
    [78] = 1,            /* STREAM_PRIORITIES_SUPPORTED */
    [79] = 1,            /* GLOBAL_L1_CACHE_SUPPORTED */
    [80] = 1,            /* LOCAL_L1_CACHE_SUPPORTED */
    [81] = 233472,       /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    [82] = 65536,        /* MAX_REGISTERS_PER_MULTIPROCESSOR */
    [83] = 1,            /* MANAGED_MEMORY */
    [84] = 0,            /* MULTI_GPU_BOARD */
    [85] = 0,            /* MULTI_GPU_BOARD_GROUP_ID */
    [86] = 0,            /* HOST_NATIVE_ATOMIC_SUPPORTED */
    [87] = 2,            /* SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO */
    [88] = 0,            /* PAGEABLE_MEMORY_ACCESS */
    [89] = 1,            /* CONCURRENT_MANAGED_ACCESS */
    [90] = 1,            /* COMPUTE_PREEMPTION_SUPPORTED */
    [91] = 0,            /* CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM */
    [92] = 0,            /* CAN_USE_STREAM_MEM_OPS_V1 */
    [93] = 0,            /* CAN_USE_64_BIT_STREAM_MEM_OPS_V1 */
    [94] = 0,            /* CAN_USE_STREAM_WAIT_VALUE_NOR_V1 */
    [95] = 1,            /* COOPERATIVE_LAUNCH */
    [96] = 0,            /* COOPERATIVE_MULTI_DEVICE_LAUNCH */
    [97] = 232448,       /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    [98] = 0,            /* CAN_FLUSH_REMOTE_WRITES */
    [99] = 1,            /* HOST_REGISTER_SUPPORTED */
    [100] = 0,           /* PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES */
    [101] = 0,           /* DIRECT_MANAGED_MEM_ACCESS_FROM_HOST */
    [102] = 1,           /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    [103] = 1,           /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
    [104] = 0,           /* HANDLE_TYPE_WIN32_HANDLE_SUPPORTED */
    [105] = 0,           /* HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED */
    [106] = 32,          /* MAX_BLOCKS_PER_MULTIPROCESSOR */
    [107] = 1,           /* GENERIC_COMPRESSION_SUPPORTED */
    [108] = 39321600,    /* MAX_PERSISTING_L2_CACHE_SIZE */
    [109] = 134213632,   /* MAX_ACCESS_POLICY_WINDOW_SIZE */
    [110] = 1,           /* GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED */
    [111] = 1024,        /* RESERVED_SHARED_MEMORY_PER_BLOCK */
    [112] = 1,           /* SPARSE_CUDA_ARRAY_SUPPORTED */
    [113] = 1,           /* READ_ONLY_HOST_REGISTER_SUPPORTED */
    [114] = 1,           /* TIMELINE_SEMAPHORE_INTEROP_SUPPORTED */
    [115] = 1,           /* MEMORY_POOLS_SUPPORTED */
    [116] = 1,           /* GPU_DIRECT_RDMA_SUPPORTED */
    [117] = 1,           /* GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: host */
    [118] = 0,           /* GPU_DIRECT_RDMA_WRITES_ORDERING: none */
    [119] = 1,           /* MEMPOOL_SUPPORTED_HANDLE_TYPES: POSIX fd */
    [120] = 1,           /* CLUSTER_LAUNCH */
    [121] = 1,           /* DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED */
    [122] = 1,           /* CAN_USE_64_BIT_STREAM_MEM_OPS */
    [123] = 1,           /* CAN_USE_STREAM_WAIT_VALUE_NOR */
    [124] = 1,           /* DMA_BUF_SUPPORTED */
    [125] = 1,           /* IPC_EVENT_SUPPORTED */
    [126] = 4,           /* MEM_SYNC_DOMAIN_COUNT */
    [127] = 1,           /* TENSOR_MAP_ACCESS_SUPPORTED */
    [128] = 0,           /* HANDLE_TYPE_FABRIC_SUPPORTED */
    [129] = 1,           /* UNIFIED_FUNCTION_POINTERS */
    [130] = 0,           /* NUMA_CONFIG: none */
    [131] = -1,          /* NUMA_ID */
    [132] = 0,           /* MULTICAST_SUPPORTED */
    [133] = 0,           /* MPS_ENABLED */
    [134] = 0,           /* HOST_NUMA_ID */
    [135] = 0,           /* D3D12_CIG_SUPPORTED */
    [136] = 0,           /* MEM_DECOMPRESS_ALGORITHM_MASK */
    [137] = 0,           /* MEM_DECOMPRESS_MAXIMUM_LENGTH */
    [138] = 0,           /* VULKAN_CIG_SUPPORTED */
    [139] = (int)SIM_PCI_DEVICE_ID, /* GPU_PCI_DEVICE_ID: device << 16 | vendor */
    [140] = (int)SIM_PCI_SUBSYSTEM_ID, /* GPU_PCI_SUBSYSTEM_ID */
    [141] = 0,           /* HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    [142] = 0,           /* HOST_NUMA_MEMORY_POOLS_SUPPORTED */
    [143] = 0,           /* HOST_NUMA_MULTINODE_IPC_SUPPORTED */
    [144] = 0,           /* HOST_MEMORY_POOLS_SUPPORTED */
    [145] = 0,           /* HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    [146] = 0,           /* HOST_ALLOC_DMA_BUF_SUPPORTED */
    [147] = 0,           /* ONLY_PARTIAL_HOST_NATIVE_ATOMIC_SUPPORTED */
    [148] = 0,           /* ATOMIC_REDUCTION_SUPPORTED */
    [149] = 1,           /* LOCALITY_DOMAIN_COUNT */
    [150] = 0,           /* MAX_OVERSIZED_SHARED_MEMORY_PER_BLOCK */
    [151] = 0,           /* D3D12_CIG_STREAMS_SUPPORTED */
    [152] = 0,           /* DMA_BUF_MMAP_SUPPORTED */
    [153] = 0,           /* LOGICAL_ENDPOINT_UNICAST_SUPPORTED */
    [154] = 0,           /* LOGICAL_ENDPOINT_MULTICAST_SUPPORTED */
    [155] = 0,           /* LOGICAL_ENDPOINT_COUNTED_OPS_SUPPORTED */
    [156] = 0,           /* LOGICAL_ENDPOINT_UNICAST_ACCESS_ON_OWNER_DEVICE_SUPPORTED */
    [157] = SIM_MULTIPROCESSORS, /* LOCALITY_DOMAIN_MULTIPROCESSOR_COUNT */
    [158] = 0,           /* LOGICAL_ENDPOINT_SUPPORTED_HANDLE_TYPES */
    [159] = 0,           /* VULKAN_CIG_STREAMS_SUPPORTED */
    [160] = 0,           /* TENSOR_MAP_LARGE_TENSOR_MIN_SIZE */
    [161] = 0,           /* GPU_DIRECT_RDMA_WITH_LOCALIZED_MEMORY_SUPPORTED */
};

#define ATTRIBUTE_COUNT ((int)(sizeof(attribute_values) / sizeof(attribute_values[0])))

CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev)
{
    REQUIRE_INIT();
    if (value == NULL || attrib <= 0 || attrib >= ATTRIBUTE_COUNT)
        return CUDA_ERROR_INVALID_VALUE;
    REQUIRE_DEVICE(dev);
    *value = attribute_values[attrib];
    return CUDA_SUCCESS;
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    REQUIRE_INIT();
    if (major == NULL || minor == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    REQUIRE_DEVICE(dev);
    *major = SIM_CC_MAJOR;
    *minor = SIM_CC_MINOR;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    REQUIRE_INIT();
    if (bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    REQUIRE_DEVICE(dev);
    *bytes = (size_t)SIM_TOTAL_MEM;
    return CUDA_SUCCESS;
}

/* The pre-3.2 entry point reports a 32-bit size. */
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t total = 0;
    CUresult result = cuDeviceTotalMem_v2(bytes ? &total : NULL, dev);
    if (result == CUDA_SUCCESS)
        *bytes = total > 0xffffffffu ? 0xffffffffu : (unsigned int)total;
    return result;
}

CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice dev)
{
    REQUIRE_INIT();
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    REQUIRE_DEVICE(dev);
    for (int i = 0; i < 16; i++)
        uuid[i] = SIM_UUID_BYTE(i);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev)
{
    REQUIRE_INIT();
    if (bus_id == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    REQUIRE_DEVICE(dev);
    strncpy(bus_id, SIM_PCI_BUS_ID_LEGACY, (size_t)len - 1);
    bus_id[len - 1] = '\0';
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *bus_id)
{
    REQUIRE_INIT();
    if (dev == NULL || bus_id == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (strcasecmp(bus_id, SIM_PCI_BUS_ID_LEGACY) != 0 && strcasecmp(bus_id, SIM_PCI_BUS_ID) != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int *can_access, CUdevice dev, CUdevice peer)
{
    REQUIRE_INIT();
    if (can_access == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    REQUIRE_DEVICE(dev);
    REQUIRE_DEVICE(peer);
    *can_access = 0;
    return CUDA_SUCCESS;
}

/* ---- contexts: the primary one, created ones, and each thread's stack ---- */

#define MAX_CREATED_CONTEXTS 64
#define CONTEXT_STACK_DEPTH 64

/* A context made by cuCtxCreate; its address is the CUcontext handle. */
struct sim_context {
    int live; /* atomic: 1 from cuCtxCreate to cuCtxDestroy */
    unsigned int flags;
};

static int primary_token = 0; /* its address is the primary context's handle */
static int primary_refcount = 0;      /* atomic */
static unsigned int primary_flags = 0; /* atomic */
static struct sim_context created[MAX_CREATED_CONTEXTS];

/* The calling thread's context stack: as with the real driver, "current" is per thread. */
static __thread CUcontext context_stack[CONTEXT_STACK_DEPTH];
static __thread int context_depth = 0;

static CUcontext primary_context(void) { return (CUcontext)&primary_token; }

/* The live created context behind a handle, or NULL. */
static struct sim_context *created_context(CUcontext ctx)
{
    uintptr_t offset = (uintptr_t)ctx - (uintptr_t)created;
    if ((uintptr_t)ctx < (uintptr_t)created || offset >= sizeof(created) || offset % sizeof(created[0]) != 0)
        return NULL;
    struct sim_context *context = &created[offset / sizeof(created[0])];
    return __atomic_load_n(&context->live, __ATOMIC_ACQUIRE) ? context : NULL;
}

static int valid_context(CUcontext ctx) { return ctx == primary_context() || created_context(ctx) != NULL; }

static CUcontext current_context(void) { return context_depth > 0 ? context_stack[context_depth - 1] : NULL; }

static unsigned int context_flags(CUcontext ctx)
{
    struct sim_context *context = created_context(ctx);
    return context != NULL ? __atomic_load_n(&context->flags, __ATOMIC_RELAXED)
                           : __atomic_load_n(&primary_flags, __ATOMIC_RELAXED);
}

static CUresult push_context(CUcontext ctx)
{
    if (context_depth == CONTEXT_STACK_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    context_stack[context_depth++] = ctx;
    return CUDA_SUCCESS;
}

/* Take ctx off the calling thread's stack wherever it is (a destroyed or reset context). */
static void forget_context(CUcontext ctx)
{
    int kept = 0;
    for (int i = 0; i < context_depth; i++)
        if (context_stack[i] != ctx)
            context_stack[kept++] = context_stack[i];
    context_depth = kept;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    REQUIRE_INIT();
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    REQUIRE_DEVICE(dev);
    __atomic_add_fetch(&primary_refcount, 1, __ATOMIC_ACQ_REL);
    *ctx = primary_context();
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(dev);
    int count = __atomic_load_n(&primary_refcount, __ATOMIC_ACQUIRE);
    do {
        if (count == 0)
            return CUDA_ERROR_INVALID_CONTEXT;
    } while (!__atomic_compare_exchange_n(&primary_refcount, &count, count - 1, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    REQUIRE_INIT();
    if (flags == NULL || active == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    REQUIRE_DEVICE(dev);
    *flags = __atomic_load_n(&primary_flags, __ATOMIC_RELAXED);
    *active = __atomic_load_n(&primary_refcount, __ATOMIC_ACQUIRE) > 0;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(dev);
    __atomic_store_n(&primary_flags, flags, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) { return cuDevicePrimaryCtxSetFlags_v2(dev, flags); }

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(dev);
    __atomic_store_n(&primary_refcount, 0, __ATOMIC_RELEASE);
    forget_context(primary_context());
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

/* A new context with its flags, made current on the calling thread (pushed), as cuCtxCreate does. */
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    REQUIRE_INIT();
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    REQUIRE_DEVICE(dev);
    if (context_depth == CONTEXT_STACK_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < MAX_CREATED_CONTEXTS; i++) {
        int expected = 0;
        if (__atomic_compare_exchange_n(&created[i].live, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&created[i].flags, flags, __ATOMIC_RELAXED);
            *pctx = (CUcontext)&created[i];
            return push_context(*pctx);
        }
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) { return cuCtxCreate_v2(pctx, flags, dev); }

/* CUDA 13's cuCtxCreate: execution-affinity and CIG parameters are not modelled, so only NULL is accepted. */
CUresult cuCtxCreate_v4(CUcontext *pctx, void *params, unsigned int flags, CUdevice dev)
{
    if (params != NULL)
        return diagtools_sim_unmodelled("cuCtxCreate_v4");
    return cuCtxCreate_v2(pctx, flags, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    REQUIRE_INIT();
    struct sim_context *context = created_context(ctx);
    int live = 1;
    if (context == NULL ||
        !__atomic_compare_exchange_n(&context->live, &live, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_INVALID_CONTEXT;
    forget_context(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    REQUIRE_INIT();
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = current_context();
    return CUDA_SUCCESS;
}

/* Replace the top of the calling thread's stack (push onto an empty one); NULL pops. */
CUresult cuCtxSetCurrent(CUcontext ctx)
{
    REQUIRE_INIT();
    if (ctx == NULL) {
        if (context_depth > 0)
            context_depth--;
        return CUDA_SUCCESS;
    }
    if (!valid_context(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (context_depth == 0)
        return push_context(ctx);
    context_stack[context_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    REQUIRE_INIT();
    if (!valid_context(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    return push_context(ctx);
}

CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
    REQUIRE_INIT();
    if (context_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext top = context_stack[--context_depth];
    if (ctx != NULL)
        *ctx = top;
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }
CUresult cuCtxPopCurrent(CUcontext *ctx) { return cuCtxPopCurrent_v2(ctx); }

CUresult cuCtxGetDevice(CUdevice *dev)
{
    REQUIRE_INIT();
    if (dev == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (current_context() == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = 0;
    return CUDA_SUCCESS;
}

static CUresult context_or_current(CUcontext *ctx)
{
    if (*ctx == NULL)
        *ctx = current_context();
    return *ctx != NULL && valid_context(*ctx) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult cuCtxGetDevice_v2(CUdevice *dev, CUcontext ctx)
{
    REQUIRE_INIT();
    if (dev == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (context_or_current(&ctx) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = 0;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    REQUIRE_INIT();
    return context_or_current(&ctx);
}

CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    REQUIRE_INIT();
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (context_or_current(&ctx) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_CONTEXT;
    *version = 3020;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetFlags(unsigned int *flags)
{
    REQUIRE_INIT();
    if (flags == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (current_context() == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    *flags = context_flags(current_context());
    return CUDA_SUCCESS;
}

CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    REQUIRE_INIT();
    if (current_context() == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (least != NULL)
        *least = 0;
    if (greatest != NULL)
        *greatest = -5;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
    REQUIRE_INIT();
    return current_context() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    REQUIRE_INIT();
    if (free_bytes == NULL || total_bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (current_context() == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    *total_bytes = (size_t)SIM_TOTAL_MEM;
    *free_bytes = (size_t)SIM_TOTAL_MEM;
    return CUDA_SUCCESS;
}

/* The pre-3.2 entry point reports 32-bit sizes. */
CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    size_t free_wide = 0, total_wide = 0;
    CUresult result = cuMemGetInfo_v2(free_bytes ? &free_wide : NULL, total_bytes ? &total_wide : NULL);
    if (result == CUDA_SUCCESS) {
        *free_bytes = free_wide > 0xffffffffu ? 0xffffffffu : (unsigned int)free_wide;
        *total_bytes = total_wide > 0xffffffffu ? 0xffffffffu : (unsigned int)total_wide;
    }
    return result;
}

/* ---- log callbacks: accepted; the simulated driver has nothing to log ---- */

static int log_callback_token = 0;

CUresult cuLogsRegisterCallback(void *callback, void *user_data, void **handle)
{
    (void)user_data;
    if (callback == NULL || handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *handle = &log_callback_token;
    return CUDA_SUCCESS;
}

CUresult cuLogsUnregisterCallback(void *handle)
{
    return handle == &log_callback_token ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
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

/* ---- entry-point lookup (cuGetProcAddress), over the generated tables ---- */

/* Every exported entry point by symbol name, sorted (simcuda_stubs.c). */
struct sim_entry {
    const char *name;
    void *fn;
};

/* What a base name resolves to: the newest versioned symbol, and its per-thread-stream form. */
struct sim_version {
    const char *base;
    const char *legacy_stream;
    const char *per_thread_stream;
};

extern const struct sim_entry diagtools_sim_entries[];
extern const size_t diagtools_sim_entry_count;
extern const struct sim_version diagtools_sim_versions[];
extern const size_t diagtools_sim_version_count;

enum {
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2,
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
};

static int compare_entry(const void *key, const void *element)
{
    return strcmp((const char *)key, ((const struct sim_entry *)element)->name);
}

static int compare_version(const void *key, const void *element)
{
    return strcmp((const char *)key, ((const struct sim_version *)element)->base);
}

static void *exported(const char *name)
{
    const struct sim_entry *found =
        bsearch(name, diagtools_sim_entries, diagtools_sim_entry_count, sizeof(struct sim_entry), compare_entry);
    return found ? found->fn : NULL;
}

/* The symbol a base name means: its newest version, per-thread-stream when asked and one exists. */
static void *resolve_base(const char *base, uint64_t flags)
{
    const struct sim_version *version = bsearch(base, diagtools_sim_versions, diagtools_sim_version_count,
                                                sizeof(struct sim_version), compare_version);
    if (version != NULL) {
        if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && version->per_thread_stream != NULL)
            return exported(version->per_thread_stream);
        return exported(version->legacy_stream);
    }
    return exported(base);
}

/* Strip one _ptds/_ptsz and then one _vN suffix: "cuMemcpyHtoD_v2_ptds" -> "cuMemcpyHtoD". */
static size_t base_length(const char *symbol)
{
    size_t n = strlen(symbol);
    if (n > 5 && (strcmp(symbol + n - 5, "_ptds") == 0 || strcmp(symbol + n - 5, "_ptsz") == 0))
        n -= 5;
    size_t digits = 0;
    while (digits < n && symbol[n - 1 - digits] >= '0' && symbol[n - 1 - digits] <= '9')
        digits++;
    if (digits > 0 && n > digits + 2 && symbol[n - digits - 1] == 'v' && symbol[n - digits - 2] == '_')
        n -= digits + 2;
    return n;
}

static void *lookup_entry_point(const char *symbol, uint64_t flags)
{
    void *fn = resolve_base(symbol, flags);
    if (fn != NULL)
        return fn;
    fn = exported(symbol);
    if (fn != NULL)
        return fn;
    char base[256];
    size_t n = base_length(symbol);
    if (n == strlen(symbol) || n >= sizeof(base))
        return NULL;
    memcpy(base, symbol, n);
    base[n] = '\0';
    return resolve_base(base, flags);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, uint64_t flags,
                             int *symbol_status)
{
    (void)cuda_version; /* every version of a modelled entry point behaves the same here */
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = lookup_entry_point(symbol, flags);
    if (sim_tracing())
        fprintf(stderr, "diagtools simcuda: cuGetProcAddress(%s, %d, %llu) -> %s\n", symbol, cuda_version,
                (unsigned long long)flags, *pfn ? "found" : "not found");
    if (symbol_status != NULL)
        *symbol_status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, uint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, NULL);
}
#endif /* DIAGTOOLS_INJECTION_ONLY */
