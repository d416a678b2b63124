/*
 * The one simulated GPU, as both the simulated CUDA driver (simcuda.c) and the
 * simulated NVML (simnvml.c) describe it, so every view of it agrees: an
 * H100-class board (compute capability 9.0, 132 SMs, 80 GiB) that is not there.
 */
#ifndef DIAGTOOLS_SIMWORLD_H
#define DIAGTOOLS_SIMWORLD_H

#include <stdlib.h>

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

#endif /* DIAGTOOLS_SIMWORLD_H */
