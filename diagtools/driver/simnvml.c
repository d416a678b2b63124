/*
 * A stand-in for NVML (libnvidia-ml.so.1) describing the same one simulated
 * GPU as the simulated CUDA driver (simworld.h): same name, UUID, memory,
 * compute capability and PCI identity, so platform detection that asks NVML
 * (pynvml, vLLM's CUDA platform plugin, torch's device count) sees a GPU box.
 *
 * As with the real NVML, nothing here touches the CUDA driver: NVML calls
 * never count as CUDA initialization.  Functions it does not model exist all
 * the same (the build generates simnvml_stubs.c from the installed
 * declarations) and answer NVML_ERROR_NOT_SUPPORTED; the first one called is
 * remembered for diagtools_simnvml_first_refusal().
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "simworld.h"

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

struct sim_nvml_device {
    int index;
};

typedef struct sim_nvml_device *nvmlDevice_t;

static struct sim_nvml_device the_device = {0};
static int init_count = 0;

/* ---- refusals ---- */

static struct sim_refusals refusals;

/* Bitmask of what was refused in this process: 2 an unmodelled function. */
unsigned int diagtools_simnvml_refusals(void) { return sim_refusal_mask(&refusals); }

/* The first unmodelled NVML function called, or NULL. */
const char *diagtools_simnvml_first_refusal(void) { return sim_first_refusal(&refusals); }

nvmlReturn_t diagtools_simnvml_unmodelled(const char *name)
{
    sim_refuse(&refusals, 2u, name, "simnvml");
    return NVML_ERROR_NOT_SUPPORTED;
}

/* ---- init ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    __atomic_add_fetch(&init_count, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    int count = __atomic_load_n(&init_count, __ATOMIC_SEQ_CST);
    while (count > 0 && !__atomic_compare_exchange_n(&init_count, &count, count - 1, 0, __ATOMIC_SEQ_CST,
                                                     __ATOMIC_SEQ_CST)) {
    }
    return count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

#define REQUIRE_INIT()                                      \
    do {                                                    \
        if (__atomic_load_n(&init_count, __ATOMIC_SEQ_CST) <= 0) \
            return NVML_ERROR_UNINITIALIZED;                \
    } while (0)

#define REQUIRE_DEVICE(device)                   \
    do {                                         \
        if ((device) != &the_device)             \
            return NVML_ERROR_INVALID_ARGUMENT;  \
    } while (0)

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (length < strlen(value) + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* ---- system ---- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    REQUIRE_INIT();
    return copy_string(version, length, SIM_DRIVER_RELEASE);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    REQUIRE_INIT();
    return copy_string(version, length, SIM_NVML_VERSION);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = sim_cuda_version();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

/* ---- finding the device ---- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    REQUIRE_INIT();
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    if (device == NULL || index != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &the_device;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static void format_uuid(char *out, size_t size)
{
    char hex[33];
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", SIM_UUID_BYTE(i));
    snprintf(out, size, "GPU-%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12, hex + 16, hex + 20);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    char ours[48];
    format_uuid(ours, sizeof(ours));
    if (strcasecmp(uuid, ours) != 0)
        return NVML_ERROR_NOT_FOUND;
    *device = &the_device;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    if (bus_id == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strcasecmp(bus_id, SIM_PCI_BUS_ID) != 0 && strcasecmp(bus_id, SIM_PCI_BUS_ID_LEGACY) != 0)
        return NVML_ERROR_NOT_FOUND;
    *device = &the_device;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

/* ---- identity ---- */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    return copy_string(name, length, SIM_DEVICE_NAME);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    char ours[48];
    format_uuid(ours, sizeof(ours));
    return copy_string(uuid, length, ours);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (index == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (minor == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minor = SIM_MINOR_NUMBER;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (major == NULL || minor == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = SIM_CC_MAJOR;
    *minor = SIM_CC_MINOR;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (arch == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *arch = 9; /* NVML_DEVICE_ARCH_HOPPER */
    return NVML_SUCCESS;
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    strncpy(pci->busIdLegacy, SIM_PCI_BUS_ID_LEGACY, sizeof(pci->busIdLegacy) - 1);
    strncpy(pci->busId, SIM_PCI_BUS_ID, sizeof(pci->busId) - 1);
    pci->domain = SIM_PCI_DOMAIN;
    pci->bus = SIM_PCI_BUS;
    pci->device = SIM_PCI_DEVICE;
    pci->pciDeviceId = SIM_PCI_DEVICE_ID;
    pci->pciSubSystemId = SIM_PCI_SUBSYSTEM_ID;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(device, pci); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(device, pci); }

/* ---- memory and state ---- */

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = SIM_TOTAL_MEM;
    memory->free = SIM_TOTAL_MEM;
    memory->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version >> 24 != 2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = SIM_TOTAL_MEM;
    memory->reserved = 0;
    memory->free = SIM_TOTAL_MEM;
    memory->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, int *mode)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (mode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = 0; /* NVML_COMPUTEMODE_DEFAULT */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (current == NULL || pending == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *current = 0;
    *pending = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (mode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = 1; /* enabled, as on a server */
    return NVML_SUCCESS;
}

static nvmlReturn_t no_processes(nvmlDevice_t device, unsigned int *count)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, void *infos)
{
    (void)infos;
    return no_processes(device, count);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count, void *infos)
{
    (void)infos;
    return no_processes(device, count);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count, void *infos)
{
    (void)infos;
    return no_processes(device, count);
}

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (utilization == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    utilization->gpu = 0;
    utilization->memory = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temperature)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (temperature == NULL || sensor != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temperature = 35;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (milliwatts == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *milliwatts = 70000;
    return NVML_SUCCESS;
}

/* Clock types: 0 graphics, 1 SM, 2 memory, 3 video; MHz. */
static nvmlReturn_t clock_mhz(nvmlDevice_t device, int type, unsigned int *mhz, int max)
{
    static const unsigned int current[] = {1980, 1980, 2619, 1755};
    static const unsigned int highest[] = {1980, 1980, 2619, 1755};
    REQUIRE_INIT();
    REQUIRE_DEVICE(device);
    if (mhz == NULL || type < 0 || type > 3)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mhz = max ? highest[type] : current[type];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *mhz)
{
    return clock_mhz(device, type, mhz, 0);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *mhz)
{
    return clock_mhz(device, type, mhz, 1);
}

/* ---- topology: one device, so every pair is the device with itself ---- */

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t first, nvmlDevice_t second, int caps_index, int *status)
{
    (void)caps_index;
    REQUIRE_INIT();
    REQUIRE_DEVICE(first);
    REQUIRE_DEVICE(second);
    if (status == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *status = 0; /* NVML_P2P_STATUS_OK */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t first, nvmlDevice_t second, int *level)
{
    REQUIRE_INIT();
    REQUIRE_DEVICE(first);
    REQUIRE_DEVICE(second);
    if (level == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *level = 0; /* NVML_TOPOLOGY_INTERNAL */
    return NVML_SUCCESS;
}

/* ---- errors ---- */

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported (simulated NVML)";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}
