/*
 * A stand-in for the CUDA runtime library (libcudart.so.13, or .so.12) on the simulated GPU.
 *
 * The real runtime cannot run on the simulated driver: right after its cuInit it asks the
 * driver for undocumented export tables (cuGetExportTable), which have no public contract to
 * simulate.  This runtime is built instead, against the headers of the installed real runtime
 * (so cudaDeviceProp and every prototype have that release's layout), with the same SONAME,
 * symbol version node and exported names, generated from that library (see _generate.py).
 * Loaded before a library that needs the runtime (torch's libtorch_cuda.so finds its own
 * copy through DT_RPATH, but the loader reuses an already-loaded library whose SONAME
 * matches), it is the runtime that library binds to.
 *
 * What it models, over the simulated driver (libcuda.so.1, opened on first use):
 * - the driver's cuInit on the first call that needs a device, as the real runtime does, so
 *   the simulated driver sees the caller's Python frames; in a process forked after its
 *   parent's cuInit, those calls fail with cudaErrorInitializationError, as on a GPU box;
 * - device count, current device, properties and attributes (from the driver's attribute
 *   table, so both views of the GPU agree), names, versions, errors, memory information;
 * - fat-binary, function and variable registration (accepted; nothing is loaded);
 * - allocations served from host memory (cudaMalloc, cudaMallocHost, ...), copies and memsets
 *   done on the host, streams and events as handles with nothing queued on them;
 * - driver entry points (cudaGetDriverEntryPoint*) through the driver's cuGetProcAddress.
 * Kernel launches are refused (cudaErrorNotSupported, 801) and recorded: no GPU code runs
 * here.  Every other exported function is a generated stub that answers 801 and is recorded
 * the same way; diagtools_simcudart_refusals() and diagtools_simcudart_first_refusal() tell a
 * host afterwards.  DIAGTOOLS_SIMCUDA_TRACE=1 prints each refusal to stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "simworld.h"

#define SIMCUDART_KERNEL_LAUNCH 1u
#define SIMCUDART_UNMODELLED 2u
#define HANDLE_STREAM 1u
#define HANDLE_EVENT 2u

static int stream_ok(cudaStream_t stream); /* a stream this runtime made, or a special one */

/* ---- refusals: where the simulation ends ---- */

static struct sim_refusals refusals; /* simworld.h: updated with atomics, from any thread */

static void record_refusal(unsigned int kind, const char *what) { sim_refuse(&refusals, kind, what, "simcudart"); }

/* What this process ran into: 1 a kernel launch was refused, 2 an unmodelled function was called. */
unsigned int diagtools_simcudart_refusals(void) { return sim_refusal_mask(&refusals); }

/* The first refused call ("cudaLaunchKernel", "cudaGraphCreate"), or NULL. */
const char *diagtools_simcudart_first_refusal(void) { return sim_first_refusal(&refusals); }

/* The last error of this thread, as cudaGetLastError / cudaPeekAtLastError report it. */
static __thread cudaError_t last_error = cudaSuccess;
static __thread int current_device = 0;

static cudaError_t fail(cudaError_t error)
{
    if (error != cudaSuccess)
        last_error = error;
    return error;
}

/* Every generated stub lands here. */
int diagtools_simcudart_unmodelled(const char *name)
{
    record_refusal(SIMCUDART_UNMODELLED, name);
    return fail(cudaErrorNotSupported);
}

static cudaError_t refuse_launch(const char *name)
{
    record_refusal(SIMCUDART_KERNEL_LAUNCH, name);
    return fail(cudaErrorNotSupported);
}

/* ---- the simulated driver underneath, opened on first use ---- */

typedef int (*cu_init_fn)(unsigned int);
typedef int (*cu_int_fn)(int *);
typedef int (*cu_attribute_fn)(int *, int, int);
typedef int (*cu_name_fn)(char *, int, int);
typedef int (*cu_proc_fn)(const char *, void **, int, uint64_t, int *);

static struct {
    cu_init_fn init;
    cu_int_fn driver_version;
    cu_int_fn device_count;
    cu_attribute_fn attribute;
    cu_name_fn name;
    cu_proc_fn get_proc_address;
} driver;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void open_driver(void)
{
    void *library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); /* the driver stays out of the global namespace */
    if (library == NULL)
        return;
    driver.init = (cu_init_fn)dlsym(library, "cuInit");
    driver.driver_version = (cu_int_fn)dlsym(library, "cuDriverGetVersion");
    driver.device_count = (cu_int_fn)dlsym(library, "cuDeviceGetCount");
    driver.attribute = (cu_attribute_fn)dlsym(library, "cuDeviceGetAttribute");
    driver.name = (cu_name_fn)dlsym(library, "cuDeviceGetName");
    driver.get_proc_address = (cu_proc_fn)dlsym(library, "cuGetProcAddress_v2");
}

static int have_driver(void)
{
    pthread_once(&driver_once, open_driver);
    return driver.init != NULL && driver.device_count != NULL && driver.attribute != NULL && driver.name != NULL;
}

/* The runtime's lazy initialization: the driver's cuInit on first use, checked on every call
 * (cheap), so a child forked after the parent's cuInit sees the driver's refusal. */
static cudaError_t ensure_init(void)
{
    static pid_t initialized_in = 0;
    if (__atomic_load_n(&initialized_in, __ATOMIC_ACQUIRE) == getpid())
        return cudaSuccess;
    if (!have_driver())
        return fail(cudaErrorInsufficientDriver);
    int result = driver.init(0);
    if (result == 3) /* CUDA_ERROR_NOT_INITIALIZED: forked after the parent's cuInit */
        return fail(cudaErrorInitializationError);
    if (result != 0)
        return fail(cudaErrorNoDevice);
    int count = 0;
    if (driver.device_count(&count) != 0 || count == 0)
        return fail(cudaErrorNoDevice);
    __atomic_store_n(&initialized_in, getpid(), __ATOMIC_RELEASE);
    return cudaSuccess;
}

#define REQUIRE_INIT()                           \
    do {                                         \
        cudaError_t init_error = ensure_init();  \
        if (init_error != cudaSuccess)           \
            return init_error;                   \
    } while (0)

#define REQUIRE(condition, error)    \
    do {                             \
        if (!(condition))            \
            return fail(error);      \
    } while (0)

static int attribute(enum cudaDeviceAttr what)
{
    int value = 0;
    driver.attribute(&value, (int)what, 0);
    return value;
}

/* ---- versions and errors ---- */

cudaError_t cudaRuntimeGetVersion(int *version)
{
    REQUIRE(version != NULL, cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version)
{
    REQUIRE(version != NULL, cudaErrorInvalidValue);
    *version = 0;
    if (have_driver() && driver.driver_version != NULL)
        driver.driver_version(version);
    return cudaSuccess;
}

static const struct {
    cudaError_t code;
    const char *name;
    const char *text;
} errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorPeerAccessUnsupported, "cudaErrorPeerAccessUnsupported", "peer access is not supported between these two devices"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported (simulated CUDA runtime: no GPU code runs here)"},
};

static int error_index(cudaError_t error)
{
    for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
        if (errors[i].code == error)
            return (int)i;
    return -1;
}

const char *cudaGetErrorName(cudaError_t error)
{
    int i = error_index(error);
    return i >= 0 ? errors[i].name : "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error)
{
    int i = error_index(error);
    return i >= 0 ? errors[i].text : "unrecognized error code";
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t error = last_error;
    last_error = cudaSuccess;
    return error;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

/* ---- devices ---- */

cudaError_t cudaGetDeviceCount(int *count)
{
    REQUIRE(count != NULL, cudaErrorInvalidValue);
    *count = 0;
    REQUIRE_INIT();
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    REQUIRE(device != NULL, cudaErrorInvalidValue);
    REQUIRE_INIT();
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    REQUIRE_INIT();
    REQUIRE(device == 0, cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaInitDevice(int device, unsigned int device_flags, unsigned int flags)
{
    (void)device_flags;
    (void)flags;
    REQUIRE_INIT();
    REQUIRE(device == 0, cudaErrorInvalidDevice);
    return cudaSuccess;
}

static unsigned int device_flags = 0;

cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
    REQUIRE_INIT();
    device_flags = flags;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceFlags(unsigned int *flags)
{
    REQUIRE(flags != NULL, cudaErrorInvalidValue);
    REQUIRE_INIT();
    *flags = device_flags;
    return cudaSuccess;
}

cudaError_t cudaDeviceReset(void)
{
    REQUIRE_INIT();
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    REQUIRE_INIT();
    return cudaSuccess; /* nothing ever runs, so nothing is pending */
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    REQUIRE(value != NULL, cudaErrorInvalidValue);
    REQUIRE_INIT();
    REQUIRE(device == 0, cudaErrorInvalidDevice);
    /* cudaDeviceAttr numbers are the driver's CUdevice_attribute numbers */
    return driver.attribute(value, (int)attr, device) == 0 ? cudaSuccess : fail(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    REQUIRE_INIT();
    if (least != NULL)
        *least = 0;
    if (greatest != NULL)
        *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can_access, int device, int peer)
{
    REQUIRE(can_access != NULL, cudaErrorInvalidValue);
    REQUIRE_INIT();
    REQUIRE(device == 0 && peer == 0, cudaErrorInvalidDevice);
    *can_access = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device)
{
    REQUIRE(bus_id != NULL && len > 0, cudaErrorInvalidValue);
    REQUIRE_INIT();
    REQUIRE(device == 0, cudaErrorInvalidDevice);
    snprintf(bus_id, (size_t)len, "%s", SIM_PCI_BUS_ID_LEGACY);
    return cudaSuccess;
}

static void fill_properties(struct cudaDeviceProp *prop)
{
    memset(prop, 0, sizeof(*prop));
    driver.name(prop->name, (int)sizeof(prop->name), 0);
    for (int i = 0; i < 16; i++)
        prop->uuid.bytes[i] = (char)SIM_UUID_BYTE(i);
    prop->totalGlobalMem = (size_t)SIM_TOTAL_MEM;
    prop->sharedMemPerBlock = (size_t)attribute(cudaDevAttrMaxSharedMemoryPerBlock);
    prop->regsPerBlock = attribute(cudaDevAttrMaxRegistersPerBlock);
    prop->warpSize = attribute(cudaDevAttrWarpSize);
    prop->memPitch = (size_t)attribute(cudaDevAttrMaxPitch);
    prop->maxThreadsPerBlock = attribute(cudaDevAttrMaxThreadsPerBlock);
    prop->maxThreadsDim[0] = attribute(cudaDevAttrMaxBlockDimX);
    prop->maxThreadsDim[1] = attribute(cudaDevAttrMaxBlockDimY);
    prop->maxThreadsDim[2] = attribute(cudaDevAttrMaxBlockDimZ);
    prop->maxGridSize[0] = attribute(cudaDevAttrMaxGridDimX);
    prop->maxGridSize[1] = attribute(cudaDevAttrMaxGridDimY);
    prop->maxGridSize[2] = attribute(cudaDevAttrMaxGridDimZ);
    prop->totalConstMem = (size_t)attribute(cudaDevAttrTotalConstantMemory);
    prop->major = SIM_CC_MAJOR;
    prop->minor = SIM_CC_MINOR;
    prop->textureAlignment = (size_t)attribute(cudaDevAttrTextureAlignment);
    prop->multiProcessorCount = attribute(cudaDevAttrMultiProcessorCount);
    prop->integrated = attribute(cudaDevAttrIntegrated);
    prop->canMapHostMemory = attribute(cudaDevAttrCanMapHostMemory);
    prop->concurrentKernels = attribute(cudaDevAttrConcurrentKernels);
    prop->ECCEnabled = attribute(cudaDevAttrEccEnabled);
    prop->pciBusID = SIM_PCI_BUS;
    prop->pciDeviceID = SIM_PCI_DEVICE;
    prop->pciDomainID = SIM_PCI_DOMAIN;
    prop->asyncEngineCount = attribute(cudaDevAttrAsyncEngineCount);
    prop->unifiedAddressing = attribute(cudaDevAttrUnifiedAddressing);
    prop->memoryBusWidth = attribute(cudaDevAttrGlobalMemoryBusWidth);
    prop->l2CacheSize = attribute(cudaDevAttrL2CacheSize);
    prop->maxThreadsPerMultiProcessor = attribute(cudaDevAttrMaxThreadsPerMultiProcessor);
    prop->streamPrioritiesSupported = attribute(cudaDevAttrStreamPrioritiesSupported);
    prop->sharedMemPerMultiprocessor = (size_t)attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
    prop->regsPerMultiprocessor = attribute(cudaDevAttrMaxRegistersPerMultiprocessor);
    prop->managedMemory = attribute(cudaDevAttrManagedMemory);
    prop->cooperativeLaunch = attribute(cudaDevAttrCooperativeLaunch);
    prop->sharedMemPerBlockOptin = (size_t)attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    prop->maxBlocksPerMultiProcessor = attribute(cudaDevAttrMaxBlocksPerMultiprocessor);
    prop->reservedSharedMemPerBlock = (size_t)attribute(cudaDevAttrReservedSharedMemoryPerBlock);
    prop->memoryPoolsSupported = attribute(cudaDevAttrMemoryPoolsSupported);
#if CUDART_VERSION < 13000
    prop->clockRate = attribute(cudaDevAttrClockRate);
    prop->memoryClockRate = attribute(cudaDevAttrMemoryClockRate);
#endif
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    REQUIRE(prop != NULL, cudaErrorInvalidValue);
    REQUIRE_INIT();
    REQUIRE(device == 0, cudaErrorInvalidDevice);
    fill_properties(prop);
    return cudaSuccess;
}

/* ---- memory: host memory stands in for device memory ---- */

/* Each block is an anonymous mapping with one header page in front that records its size,
 * after a magic word, so a pointer this runtime never handed out is refused, not unmapped. */
#define BLOCK_HEADER 4096
#define BLOCK_MAGIC 0xd1a6c0dad1a6c0daull
static size_t allocated = 0;

struct block_header {
    unsigned long long magic;
    size_t total;
};

static void *map_block(size_t size)
{
    size_t total = size + BLOCK_HEADER;
    void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return NULL;
    ((struct block_header *)base)->magic = BLOCK_MAGIC;
    ((struct block_header *)base)->total = total;
    __atomic_fetch_add(&allocated, total, __ATOMIC_SEQ_CST);
    return (char *)base + BLOCK_HEADER;
}

/* Whether ``pointer`` starts a block this runtime mapped (its header page is readable and marked). */
static struct block_header *block_of(void *pointer)
{
    if (pointer == NULL || ((uintptr_t)pointer & (BLOCK_HEADER - 1)) != 0)
        return NULL;
    struct block_header *header = (struct block_header *)((char *)pointer - BLOCK_HEADER);
    unsigned char resident;
    if (mincore(header, BLOCK_HEADER, &resident) != 0) /* not mapped at all */
        return NULL;
    return header->magic == BLOCK_MAGIC ? header : NULL;
}

static cudaError_t unmap_block(void *pointer)
{
    if (pointer == NULL)
        return cudaSuccess;
    struct block_header *header = block_of(pointer);
    if (header == NULL)
        return fail(cudaErrorInvalidValue);
    size_t total = header->total;
    header->magic = 0;
    __atomic_fetch_sub(&allocated, total, __ATOMIC_SEQ_CST);
    munmap(header, total);
    return cudaSuccess;
}

static cudaError_t allocate(void **pointer, size_t size)
{
    REQUIRE(pointer != NULL, cudaErrorInvalidValue);
    REQUIRE_INIT();
    if (size == 0) {
        *pointer = NULL;
        return cudaSuccess;
    }
    if (size > (size_t)SIM_TOTAL_MEM - __atomic_load_n(&allocated, __ATOMIC_SEQ_CST))
        return fail(cudaErrorMemoryAllocation);
    *pointer = map_block(size);
    return *pointer != NULL ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaMalloc(void **pointer, size_t size) { return allocate(pointer, size); }

cudaError_t cudaMallocAsync(void **pointer, size_t size, cudaStream_t stream)
{
    REQUIRE(stream_ok(stream), cudaErrorInvalidResourceHandle);
    return allocate(pointer, size);
}

cudaError_t cudaMallocHost(void **pointer, size_t size) { return allocate(pointer, size); }

cudaError_t cudaHostAlloc(void **pointer, size_t size, unsigned int flags)
{
    (void)flags;
    return allocate(pointer, size);
}

cudaError_t cudaMallocManaged(void **pointer, size_t size, unsigned int flags)
{
    (void)flags;
    return allocate(pointer, size);
}

cudaError_t cudaFree(void *pointer)
{
    REQUIRE_INIT();
    return unmap_block(pointer);
}

cudaError_t cudaFreeAsync(void *pointer, cudaStream_t stream)
{
    REQUIRE(stream_ok(stream), cudaErrorInvalidResourceHandle);
    return cudaFree(pointer);
}

cudaError_t cudaFreeHost(void *pointer) { return cudaFree(pointer); }

cudaError_t cudaHostGetDevicePointer(void **device_pointer, void *host_pointer, unsigned int flags)
{
    (void)flags;
    REQUIRE(device_pointer != NULL, cudaErrorInvalidValue);
    *device_pointer = host_pointer;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    REQUIRE(free_bytes != NULL && total_bytes != NULL, cudaErrorInvalidValue);
    REQUIRE_INIT();
    *total_bytes = (size_t)SIM_TOTAL_MEM;
    *free_bytes = (size_t)SIM_TOTAL_MEM - __atomic_load_n(&allocated, __ATOMIC_SEQ_CST);
    return cudaSuccess;
}

/* ---- copies and memsets: checked first, so a bad pointer is cudaErrorInvalidValue, never a crash ---- */

/* Whether every page of [pointer, pointer + count) is mapped (mincore fails with ENOMEM on a hole). */
static int mapped(const void *pointer, size_t count)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)pointer & ~(page - 1);
    if (pointer == NULL || count > (size_t)SIM_TOTAL_MEM || (uintptr_t)pointer > UINTPTR_MAX - count)
        return 0;
    uintptr_t end = (uintptr_t)pointer + count;
    unsigned char resident[256];
    while (start < end) {
        uintptr_t span = end - start < 256 * page ? end - start : 256 * page;
        if (mincore((void *)start, span, resident) != 0)
            return 0;
        start += (span + page - 1) & ~(page - 1);
    }
    return 1;
}

/* Whether [pointer, pointer + count) can be written: the kernel fills it from /dev/zero and says EFAULT
 * where it cannot (a read-only mapping), so only a call about to overwrite the range may ask. */
static int writable(void *pointer, size_t count)
{
    static int zero = -2;
    if (__atomic_load_n(&zero, __ATOMIC_ACQUIRE) == -2) {
        int fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
        int expected = -2;
        if (!__atomic_compare_exchange_n(&zero, &expected, fd, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) && fd >= 0)
            close(fd);
    }
    int fd = __atomic_load_n(&zero, __ATOMIC_ACQUIRE);
    if (fd < 0)
        return 1; /* no /dev/zero: mapped() already said the pages exist */
    for (size_t done = 0; done < count;) {
        ssize_t got = read(fd, (char *)pointer + done, count - done);
        if (got <= 0)
            return 0;
        done += (size_t)got;
    }
    return 1;
}

/* Whether a range that starts an allocation of this runtime stays inside it, as the real runtime checks a
 * device allocation's bounds (a host pointer it never handed out is taken as it is, as the real one does). */
static int inside_block(const void *pointer, size_t count)
{
    struct block_header *header = block_of((void *)pointer);
    return header == NULL || count <= header->total - BLOCK_HEADER;
}

static int overlap(const void *a, const void *b, size_t count)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + count && y < x + count;
}

/* Every pointer is a host pointer here, so every kind of copy is a memmove. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    REQUIRE((unsigned)kind <= (unsigned)cudaMemcpyDefault, cudaErrorInvalidMemcpyDirection);
    REQUIRE_INIT();
    if (count == 0)
        return cudaSuccess;
    REQUIRE(mapped(dst, count) && mapped(src, count), cudaErrorInvalidValue);
    REQUIRE(inside_block(dst, count) && inside_block(src, count), cudaErrorInvalidValue);
    REQUIRE(overlap(dst, src, count) || writable(dst, count), cudaErrorInvalidValue);
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    REQUIRE(stream_ok(stream), cudaErrorInvalidResourceHandle);
    return cudaMemcpy(dst, src, count, kind);
}

cudaError_t cudaMemset(void *pointer, int value, size_t count)
{
    REQUIRE_INIT();
    if (count == 0)
        return cudaSuccess;
    REQUIRE(mapped(pointer, count) && inside_block(pointer, count), cudaErrorInvalidValue);
    REQUIRE(writable(pointer, count), cudaErrorInvalidValue);
    memset(pointer, value, count);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *pointer, int value, size_t count, cudaStream_t stream)
{
    REQUIRE(stream_ok(stream), cudaErrorInvalidResourceHandle);
    return cudaMemset(pointer, value, count);
}

/* ---- streams and events: handles with nothing ever queued on them ----
 * Every handle this runtime made is in a table until destroyed, so a handle it never made, one
 * destroyed already, the special streams (legacy, per-thread) passed to cudaStreamDestroy, or an
 * event passed as a stream are cudaErrorInvalidResourceHandle, as the real runtime answers. */

struct handle_table {
    pthread_mutex_t lock;
    const void **handles;
    unsigned char *kinds;
    size_t count, capacity;
};

static struct handle_table table = {PTHREAD_MUTEX_INITIALIZER, NULL, NULL, 0, 0};

/* The slot of ``handle`` of ``kind``, or -1; called with the lock held. */
static long slot_of(const void *handle, unsigned char kind)
{
    for (size_t i = 0; i < table.count; i++)
        if (table.handles[i] == handle && table.kinds[i] == kind)
            return (long)i;
    return -1;
}

static int add_handle(const void *handle, unsigned char kind)
{
    int ok = 1;
    pthread_mutex_lock(&table.lock);
    if (table.count == table.capacity) {
        size_t capacity = table.capacity ? table.capacity * 2 : 64;
        const void **handles = realloc(table.handles, capacity * sizeof *handles);
        if (handles != NULL)
            table.handles = handles;
        unsigned char *kinds = handles != NULL ? realloc(table.kinds, capacity) : NULL;
        if (kinds != NULL) {
            table.kinds = kinds;
            table.capacity = capacity;
        }
        ok = kinds != NULL;
    }
    if (ok) {
        table.handles[table.count] = handle;
        table.kinds[table.count++] = kind;
    }
    pthread_mutex_unlock(&table.lock);
    return ok;
}

static int live(const void *handle, unsigned char kind)
{
    pthread_mutex_lock(&table.lock);
    int found = slot_of(handle, kind) >= 0;
    pthread_mutex_unlock(&table.lock);
    return found;
}

/* Take ``handle`` out of the table and free it; 0 when the table never held it. */
static int drop_handle(void *handle, unsigned char kind)
{
    pthread_mutex_lock(&table.lock);
    long slot = slot_of(handle, kind);
    if (slot >= 0) {
        table.handles[slot] = table.handles[--table.count];
        table.kinds[slot] = table.kinds[table.count];
    }
    pthread_mutex_unlock(&table.lock);
    if (slot < 0)
        return 0;
    free(handle);
    return 1;
}

static int special_stream(cudaStream_t stream)
{
    return stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}

static int stream_ok(cudaStream_t stream) { return special_stream(stream) || live(stream, HANDLE_STREAM); }

static cudaError_t new_handle(void **handle, unsigned char kind)
{
    REQUIRE(handle != NULL, cudaErrorInvalidValue);
    REQUIRE_INIT();
    void *made = calloc(1, 64);
    if (made == NULL || !add_handle(made, kind)) {
        free(made);
        return fail(cudaErrorMemoryAllocation);
    }
    *handle = made;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return new_handle((void **)stream, HANDLE_STREAM); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    (void)flags;
    return new_handle((void **)stream, HANDLE_STREAM);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority)
{
    (void)flags;
    (void)priority;
    return new_handle((void **)stream, HANDLE_STREAM);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    REQUIRE(!special_stream(stream) && drop_handle(stream, HANDLE_STREAM), cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    REQUIRE_INIT();
    REQUIRE(stream_ok(stream), cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    REQUIRE_INIT();
    REQUIRE(stream_ok(stream), cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    (void)flags;
    REQUIRE_INIT();
    REQUIRE(stream_ok(stream) && live(event, HANDLE_EVENT), cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t stream, int *priority)
{
    REQUIRE(priority != NULL, cudaErrorInvalidValue);
    REQUIRE(stream_ok(stream), cudaErrorInvalidResourceHandle);
    *priority = 0;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status)
{
    REQUIRE(status != NULL, cudaErrorInvalidValue);
    REQUIRE(stream_ok(stream), cudaErrorInvalidResourceHandle);
    *status = cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    REQUIRE(mode != NULL, cudaErrorInvalidValue);
    static __thread enum cudaStreamCaptureMode current = cudaStreamCaptureModeGlobal;
    enum cudaStreamCaptureMode previous = current;
    current = *mode;
    *mode = previous;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return new_handle((void **)event, HANDLE_EVENT); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    (void)flags;
    return new_handle((void **)event, HANDLE_EVENT);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    REQUIRE(drop_handle(event, HANDLE_EVENT), cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    REQUIRE(live(event, HANDLE_EVENT) && stream_ok(stream), cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    REQUIRE(live(event, HANDLE_EVENT), cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    REQUIRE(live(event, HANDLE_EVENT), cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    REQUIRE(ms != NULL, cudaErrorInvalidValue);
    REQUIRE(live(start, HANDLE_EVENT) && live(end, HANDLE_EVENT), cudaErrorInvalidResourceHandle);
    *ms = 0.0f;
    return cudaSuccess;
}

/* ---- driver entry points, through the driver's cuGetProcAddress ---- */

static cudaError_t entry_point(const char *symbol, void **function, unsigned int cuda_version,
                               unsigned long long flags, enum cudaDriverEntryPointQueryResult *status)
{
    REQUIRE(symbol != NULL && function != NULL, cudaErrorInvalidValue);
    *function = NULL;
    if (!have_driver() || driver.get_proc_address == NULL)
        return fail(cudaErrorInsufficientDriver);
    int found = 1;
    int result = driver.get_proc_address(symbol, function, (int)cuda_version, flags, &found);
    if (status != NULL)
        *status = result == 0 ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess; /* as the real one: a missing symbol is reported through status */
}

cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **function, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *status)
{
    return entry_point(symbol, function, CUDART_VERSION, flags, status);
}

#if CUDART_VERSION >= 12050 /* added in CUDA 12.5 */
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **function, unsigned int cuda_version,
                                             unsigned long long flags, enum cudaDriverEntryPointQueryResult *status)
{
    return entry_point(symbol, function, cuda_version, flags, status);
}
#endif

/* ---- kernels: registration accepted, launches refused ---- */

typedef struct {
    unsigned int x, y, z;
} sim_dim3;

static int fat_binary_token = 0;

void **__cudaRegisterFatBinary(void *fat_cubin)
{
    (void)fat_cubin;
    return (void **)&fat_binary_token;
}

void __cudaRegisterFatBinaryEnd(void **handle) { (void)handle; }

void __cudaUnregisterFatBinary(void **handle) { (void)handle; }

void __cudaRegisterFunction(void **handle, const char *host_function, char *device_function, const char *name,
                            int thread_limit, void *tid, void *bid, void *block_dim, void *grid_dim, int *warp_size)
{
    (void)handle, (void)host_function, (void)device_function, (void)name, (void)thread_limit;
    (void)tid, (void)bid, (void)block_dim, (void)grid_dim, (void)warp_size;
}

void __cudaRegisterVar(void **handle, char *host_var, char *device_address, const char *device_name, int ext,
                       size_t size, int constant, int global)
{
    (void)handle, (void)host_var, (void)device_address, (void)device_name, (void)ext, (void)size;
    (void)constant, (void)global;
}

void __cudaRegisterManagedVar(void **handle, void **host_var_pointer, char *device_address,
                              const char *device_name, int ext, size_t size, int constant, int global)
{
    (void)handle, (void)host_var_pointer, (void)device_address, (void)device_name, (void)ext, (void)size;
    (void)constant, (void)global;
}

void __cudaRegisterSurface(void **handle, const void *host_var, const void **device_address,
                           const char *device_name, int dim, int ext)
{
    (void)handle, (void)host_var, (void)device_address, (void)device_name, (void)dim, (void)ext;
}

void __cudaRegisterTexture(void **handle, const void *host_var, const void **device_address,
                           const char *device_name, int dim, int norm, int ext)
{
    (void)handle, (void)host_var, (void)device_address, (void)device_name, (void)dim, (void)norm, (void)ext;
}

char __cudaInitModule(void **handle)
{
    (void)handle;
    return 1;
}

/* The <<<...>>> launch configuration: pushed before a launch, popped by the launch stub. */
static __thread sim_dim3 pushed_grid, pushed_block;
static __thread size_t pushed_shared;
static __thread void *pushed_stream;

unsigned int __cudaPushCallConfiguration(sim_dim3 grid, sim_dim3 block, size_t shared, void *stream)
{
    pushed_grid = grid, pushed_block = block, pushed_shared = shared, pushed_stream = stream;
    return 0;
}

cudaError_t __cudaPopCallConfiguration(sim_dim3 *grid, sim_dim3 *block, size_t *shared, void *stream)
{
    if (grid != NULL)
        *grid = pushed_grid;
    if (block != NULL)
        *block = pushed_block;
    if (shared != NULL)
        *shared = pushed_shared;
    if (stream != NULL)
        *(void **)stream = pushed_stream;
    return cudaSuccess;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared, cudaStream_t stream)
{
    (void)func, (void)grid, (void)block, (void)args, (void)shared, (void)stream;
    return refuse_launch("cudaLaunchKernel");
}

cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                                  cudaStream_t stream)
{
    (void)func, (void)grid, (void)block, (void)args, (void)shared, (void)stream;
    return refuse_launch("cudaLaunchKernel_ptsz");
}

/* CUDA 13's <<<...>>> path: the kernel handle is looked up (accepted), then launched (refused). */
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func)
{
    REQUIRE(kernel != NULL, cudaErrorInvalidValue);
    *kernel = (cudaKernel_t)func;
    return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared,
                               cudaStream_t stream)
{
    (void)kernel, (void)grid, (void)block, (void)args, (void)shared, (void)stream;
    return refuse_launch("__cudaLaunchKernel");
}

cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared,
                                    cudaStream_t stream)
{
    (void)kernel, (void)grid, (void)block, (void)args, (void)shared, (void)stream;
    return refuse_launch("__cudaLaunchKernel_ptsz");
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    (void)config, (void)func, (void)args;
    return refuse_launch("cudaLaunchKernelExC");
}

cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                                        cudaStream_t stream)
{
    (void)func, (void)grid, (void)block, (void)args, (void)shared, (void)stream;
    return refuse_launch("cudaLaunchCooperativeKernel");
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *data)
{
    (void)stream;
    REQUIRE(fn != NULL, cudaErrorInvalidValue);
    fn(data); /* nothing is queued before it, so it may run now */
    return cudaSuccess;
}
