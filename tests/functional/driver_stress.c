/*
 * Stress test for the simulated CUDA driver: THREADS threads, released at once
 * by a barrier, each call cuInit, retain the primary context, make it current,
 * create a context of their own, and query device attributes ROUNDS times
 * while retaining and releasing the primary context, checking every answer.
 *
 * What it proves: init and reference counts survive concurrent callers (the
 * primary context is inactive again at the end, with no release refused), and
 * the current context is per thread (each thread still sees its own after all
 * the others set theirs).  Built also with -fsanitize=thread by the test.
 *
 * Usage: driver_stress PATH/libcuda.so.1; prints "ok ..." and exits 0, or
 * prints each failure and exits 1.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 16
#define ROUNDS 2000

typedef int CUresult;
typedef void *CUcontext;

static struct {
    CUresult (*init)(unsigned int);
    CUresult (*device_get)(int *, int);
    CUresult (*attribute)(int *, int, int);
    CUresult (*retain)(CUcontext *, int);
    CUresult (*release)(int);
    CUresult (*state)(int, unsigned int *, int *);
    CUresult (*create)(CUcontext *, unsigned int, int);
    CUresult (*destroy)(CUcontext);
    CUresult (*set_current)(CUcontext);
    CUresult (*get_current)(CUcontext *);
    CUresult (*pop_current)(CUcontext *);
} cu;

static pthread_barrier_t start, all_current;
static int failures = 0;
static CUcontext primaries[THREADS];

#define CHECK(what, condition)                                                        \
    do {                                                                              \
        if (!(condition)) {                                                           \
            fprintf(stderr, "thread %d: %s failed (%s)\n", index, what, #condition); \
            __atomic_add_fetch(&failures, 1, __ATOMIC_SEQ_CST);                       \
            return NULL;                                                              \
        }                                                                             \
    } while (0)

/* Device attributes by number (cuda.h) and what the simulated H100-class device answers. */
static const int attributes[][2] = {{1, 1024}, {10, 32}, {16, 132}, {75, 9}, {76, 0}};

static void *worker(void *arg)
{
    int index = (int)(long)arg;
    int device = -1, value = 0, round, a;
    CUcontext primary = NULL, mine = NULL, current = NULL, popped = NULL;
    pthread_barrier_wait(&start);
    CHECK("cuInit", cu.init(0) == 0);
    CHECK("cuDeviceGet", cu.device_get(&device, 0) == 0 && device == 0);
    CHECK("cuDevicePrimaryCtxRetain", cu.retain(&primary, 0) == 0 && primary != NULL);
    primaries[index] = primary;
    CHECK("cuCtxSetCurrent(primary)", cu.set_current(primary) == 0);
    CHECK("cuCtxGetCurrent is the primary", cu.get_current(&current) == 0 && current == primary);
    CHECK("cuCtxCreate", cu.create(&mine, 0, 0) == 0 && mine != NULL && mine != primary);
    pthread_barrier_wait(&all_current);
    /* Every thread has now made its own context current: each must still see its own. */
    CHECK("cuCtxGetCurrent is this thread's own", cu.get_current(&current) == 0 && current == mine);
    for (round = 0; round < ROUNDS; round++) {
        CUcontext again = NULL;
        for (a = 0; a < (int)(sizeof(attributes) / sizeof(attributes[0])); a++)
            CHECK("cuDeviceGetAttribute", cu.attribute(&value, attributes[a][0], 0) == 0 && value == attributes[a][1]);
        CHECK("retain in the loop", cu.retain(&again, 0) == 0 && again == primary);
        CHECK("release in the loop", cu.release(0) == 0);
    }
    CHECK("cuCtxPopCurrent gives back this thread's context", cu.pop_current(&popped) == 0 && popped == mine);
    CHECK("the primary is current again", cu.get_current(&current) == 0 && current == primary);
    CHECK("cuCtxDestroy", cu.destroy(mine) == 0);
    CHECK("cuCtxSetCurrent(NULL)", cu.set_current(NULL) == 0);
    CHECK("no context is current", cu.get_current(&current) == 0 && current == NULL);
    CHECK("cuDevicePrimaryCtxRelease", cu.release(0) == 0);
    return NULL;
}

static void *symbol(void *library, const char *name)
{
    void *found = dlsym(library, name);
    if (found == NULL) {
        fprintf(stderr, "missing %s\n", name);
        exit(2);
    }
    return found;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: driver_stress PATH/libcuda.so.1\n");
        return 2;
    }
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    cu.init = symbol(library, "cuInit");
    cu.device_get = symbol(library, "cuDeviceGet");
    cu.attribute = symbol(library, "cuDeviceGetAttribute");
    cu.retain = symbol(library, "cuDevicePrimaryCtxRetain");
    cu.release = symbol(library, "cuDevicePrimaryCtxRelease_v2");
    cu.state = symbol(library, "cuDevicePrimaryCtxGetState");
    cu.create = symbol(library, "cuCtxCreate_v2");
    cu.destroy = symbol(library, "cuCtxDestroy_v2");
    cu.set_current = symbol(library, "cuCtxSetCurrent");
    cu.get_current = symbol(library, "cuCtxGetCurrent");
    cu.pop_current = symbol(library, "cuCtxPopCurrent_v2");

    pthread_t threads[THREADS];
    pthread_barrier_init(&start, NULL, THREADS);
    pthread_barrier_init(&all_current, NULL, THREADS);
    for (long i = 0; i < THREADS; i++)
        if (pthread_create(&threads[i], NULL, worker, (void *)i) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 2;
        }
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);

    unsigned int flags = 0;
    int active = -1;
    CUcontext current = (CUcontext)1;
    for (int i = 1; i < THREADS; i++)
        if (primaries[i] != primaries[0]) {
            fprintf(stderr, "thread %d got another primary context\n", i);
            failures++;
        }
    if (cu.state(0, &flags, &active) != 0 || active != 0) {
        fprintf(stderr, "primary context still active (%d) after every retain was released\n", active);
        failures++;
    }
    if (cu.get_current(&current) != 0 || current != NULL) {
        fprintf(stderr, "main thread sees a current context it never set\n");
        failures++;
    }
    if (failures != 0)
        return 1;
    printf("ok threads=%d rounds=%d\n", THREADS, ROUNDS);
    return 0;
}
