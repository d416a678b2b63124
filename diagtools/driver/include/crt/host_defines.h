/*
 * The few host_defines.h macros the CUDA runtime headers need when compiled as plain C by
 * the host compiler, for a runtime wheel that ships cuda_runtime_api.h without the crt/
 * headers (nvidia-cuda-runtime without nvidia-cuda-crt).  Used only when the real
 * crt/host_defines.h is not found first on the include path.
 */
#ifndef __HOST_DEFINES_H__
#define __HOST_DEFINES_H__

#define __no_return__ __attribute__((noreturn))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a) __attribute__((a))
#define __location__(a) __annotate__(a)
#define CUDARTAPI
#define CUDARTAPI_CDECL
#define __specialization_static
#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __launch_bounds__(...)
#define __builtin_align__(a) __align__(a)
#define __grid_constant__
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __cudart_builtin__
#define __nv_pure__

#endif /* __HOST_DEFINES_H__ */
