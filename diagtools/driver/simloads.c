/*
 * Keeps the simulated world whole when a library is loaded by its path.
 *
 * The loader reuses an already-loaded library whose SONAME matches a name it is asked for,
 * which is how the preloaded simulated runtime stands in for the one torch's libtorch_cuda.so
 * names.  A load by path gets no such reuse: torch 2.14 loads every CUDA library of its nvidia
 * wheels by path (_preload_cuda_deps: ctypes.CDLL(".../nvidia/cu13/lib/libcudart.so.13")), which
 * would map the real runtime beside the simulated one, so that a call into it could never be
 * seen.  Preloaded before every other library of a simulated subkernel, this dlopen sends a load
 * by path of a library the simulated world holds (same file name: libcudart.so.13, libcuda.so.1,
 * libnvidia-ml.so.1) to the world's copy, as the machine would have it with no GPU and these
 * stand-ins installed.  Every other load goes through unchanged.
 *
 * The world's folder comes from DIAGTOOLS_SIMULATED_WORLD; with it unset nothing is redirected.
 * diagtools_simloads_redirected() counts the loads sent to the world's copy.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void *(*dlopen_fn)(const char *, int);

static atomic_uint redirected;

unsigned int diagtools_simloads_redirected(void) { return atomic_load(&redirected); }

static dlopen_fn next_dlopen(void) {
    static _Atomic(dlopen_fn) next;
    dlopen_fn found = atomic_load(&next);
    if (found == NULL) {
        found = (dlopen_fn)dlsym(RTLD_NEXT, "dlopen");
        atomic_store(&next, found);
    }
    return found;
}

/* Whether ``name`` names one of the libraries a simulated world can hold. */
static int simulated_name(const char *name) {
    return strncmp(name, "libcuda.so", 10) == 0 || strncmp(name, "libcudart.so", 12) == 0 ||
           strncmp(name, "libnvidia-ml.so", 15) == 0;
}

/* The world's copy of the library at ``file``, written into ``out``; 0 when there is none to use. */
static int world_copy(const char *file, char *out, size_t size) {
    const char *world = getenv("DIAGTOOLS_SIMULATED_WORLD");
    const char *slash = strrchr(file, '/');
    if (world == NULL || *world == '\0' || slash == NULL || !simulated_name(slash + 1)) return 0;
    size_t length = strlen(world);
    if (strncmp(file, world, length) == 0 && file[length] == '/') return 0; /* already the world's */
    int written = snprintf(out, size, "%s/%s", world, slash + 1);
    if (written < 0 || (size_t)written >= size) return 0;
    return access(out, F_OK) == 0;
}

void *dlopen(const char *file, int mode) {
    dlopen_fn next = next_dlopen();
    if (next == NULL) return NULL;
    char copy[PATH_MAX];
    if (file != NULL && world_copy(file, copy, sizeof copy)) {
        atomic_fetch_add(&redirected, 1);
        return next(copy, mode);
    }
    return next(file, mode);
}
