/*
 * The one simulated GPU, as both the simulated CUDA driver (simcuda.c) and the
 * simulated NVML (simnvml.c) describe it, so every view of it agrees: an
 * H100-class board (compute capability 9.0, 132 SMs, 80 GiB) that is not there.
 */
#ifndef DIAGTOOLS_SIMWORLD_H
#define DIAGTOOLS_SIMWORLD_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_DEVICE_NAME "diagtools simulated GPU (no hardware)"
#define SIM_TOTAL_MEM ((unsigned long long)80 << 30)
#define SIM_CC_MAJOR 9
#define SIM_CC_MINOR 0
#define SIM_MULTIPROCESSORS 132
/* CUDA version the driver reports (cuDriverGetVersion, nvmlSystemGetCudaDriverVersion). */
#define SIM_CUDA_VERSION 13000
/* The kernel-mode driver release NVML reports; a CUDA 13.0 one. */
#define SIM_DRIVER_RELEASE "580.65.06"
#define SIM_NVML_VERSION "13.580.65.06"
/* PCI location and identity: 0000:01:00.0, device 0x2330 (H100 SXM), vendor 0x10de. */
#define SIM_PCI_DOMAIN 0
#define SIM_PCI_BUS 1
#define SIM_PCI_DEVICE 0
#define SIM_PCI_BUS_ID "00000000:01:00.0"
#define SIM_PCI_BUS_ID_LEGACY "0000:01:00.0"
#define SIM_PCI_DEVICE_ID 0x233010deu
#define SIM_PCI_SUBSYSTEM_ID 0x16c110deu
#define SIM_MINOR_NUMBER 0
/* The 16 UUID bytes; NVML prints them as "GPU-d1d2d3d4-d5d6-...". */
#define SIM_UUID_BYTE(i) ((unsigned char)(0xd1 + (i)))

/* DIAGTOOLS_SIMCUDA_VERSION overrides the CUDA version both libraries report. */
static inline int sim_cuda_version(void)
{
    const char *override = getenv("DIAGTOOLS_SIMCUDA_VERSION");
    return override ? atoi(override) : SIM_CUDA_VERSION;
}

/* ---- shared by both libraries: tracing and the record of refusals ---- */

/* Whether DIAGTOOLS_SIMCUDA_TRACE asks for every lookup and refusal on stderr (read once). */
static inline int sim_tracing(void)
{
    static int state = -1;
    int known = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (known < 0) {
        const char *value = getenv("DIAGTOOLS_SIMCUDA_TRACE");
        known = value != NULL && value[0] != '\0' && strcmp(value, "0") != 0;
        __atomic_store_n(&state, known, __ATOMIC_RELAXED);
    }
    return known;
}

/*
 * What a library refused in this process: a bitmask of kinds and the first
 * refused name.  Updated with atomics only, from any thread; `first` must
 * point at storage that outlives the process (a literal or a static buffer).
 */
struct sim_refusals {
    unsigned int mask;
    const char *first;
};

static inline void sim_refuse(struct sim_refusals *record, unsigned int kind, const char *what, const char *library)
{
    const char *expected = NULL;
    __atomic_fetch_or(&record->mask, kind, __ATOMIC_SEQ_CST);
    __atomic_compare_exchange_n(&record->first, &expected, what, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    if (sim_tracing())
        fprintf(stderr, "diagtools %s: refused %s\n", library, what);
}

static inline unsigned int sim_refusal_mask(struct sim_refusals *record)
{
    return __atomic_load_n(&record->mask, __ATOMIC_SEQ_CST);
}

static inline const char *sim_first_refusal(struct sim_refusals *record)
{
    return __atomic_load_n(&record->first, __ATOMIC_SEQ_CST);
}

#endif /* DIAGTOOLS_SIMWORLD_H */
