/*
 * _diagtools_cuprobe: the subkernel's window onto the CUDA driver's state.
 *
 * The scan asks the driver itself whether it is initialized, by calling
 * cuDeviceGetCount: CUDA_ERROR_NOT_INITIALIZED (3) means nobody called cuInit
 * yet.  Doing that from C keeps the probe free of imports (no ctypes), so the
 * import tree being measured stays exactly the target's.  It also asks the
 * kernel to kill the subkernel if the process that started it dies, and asks
 * the simulated driver and NVML what they refused (simulation_refusals).
 *
 * The driver library is opened RTLD_LOCAL, so its symbols never join the
 * global namespace of the process being measured; calls that only read state
 * use RTLD_NOLOAD and never load it.
 */
#define PY_SSIZE_T_CLEAN
/* The stable ABI of 3.10: one build serves every supported interpreter (scan --python). */
#define Py_LIMITED_API 0x030A0000
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

typedef int (*device_get_count_fn)(int *);

static void *libcuda = NULL;
static device_get_count_fn device_get_count = NULL;
static int load_attempted = 0;

static void load_driver(void)
{
    if (load_attempted)
        return;
    load_attempted = 1;
    libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (libcuda != NULL)
        device_get_count = (device_get_count_fn)dlsym(libcuda, "cuDeviceGetCount");
}

/* The driver's answer to cuDeviceGetCount; -1 when no driver library loads, -2 when the library that
 * loads has no cuDeviceGetCount (its state cannot be asked). */
static PyObject *driver_state(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    load_driver();
    if (device_get_count == NULL)
        return PyLong_FromLong(libcuda == NULL ? -1 : -2);
    int count = 0;
    int result = device_get_count(&count);
    return PyLong_FromLong(result);
}

/* Where the driver library was found, or None. */
static PyObject *driver_path(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    load_driver();
    Dl_info info;
    void *symbol = libcuda == NULL ? NULL : dlsym(libcuda, "cuInit");
    if (symbol == NULL || dladdr(symbol, &info) == 0 || info.dli_fname == NULL)
        Py_RETURN_NONE;
    return PyUnicode_DecodeFSDefault(info.dli_fname);
}

typedef unsigned int (*refusals_fn)(void);
typedef const char *(*first_refusal_fn)(void);

static PyObject *text_or_none(const char *text)
{
    if (text == NULL)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
}

/*
 * What the simulated libraries refused so far: (driver bitmask, first refused
 * driver call, NVML bitmask, first refused NVML call), or None when no driver
 * is loaded or it is not the simulated one.  Neither library is loaded to ask.
 */
static PyObject *simulation_refusals(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver == NULL)
        Py_RETURN_NONE;
    refusals_fn driver_refusals = (refusals_fn)dlsym(driver, "diagtools_sim_refusals");
    first_refusal_fn driver_first = (first_refusal_fn)dlsym(driver, "diagtools_sim_first_refusal");
    unsigned int driver_mask = driver_refusals != NULL ? driver_refusals() : 0;
    const char *driver_text = driver_first != NULL ? driver_first() : NULL;
    dlclose(driver);
    if (driver_refusals == NULL || driver_first == NULL)
        Py_RETURN_NONE;
    unsigned int nvml_mask = 0;
    const char *nvml_first = NULL;
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (nvml != NULL) {
        refusals_fn nvml_refusals = (refusals_fn)dlsym(nvml, "diagtools_simnvml_refusals");
        first_refusal_fn nvml_first_fn = (first_refusal_fn)dlsym(nvml, "diagtools_simnvml_first_refusal");
        if (nvml_refusals != NULL && nvml_first_fn != NULL) {
            nvml_mask = nvml_refusals();
            nvml_first = nvml_first_fn();
        }
        dlclose(nvml);
    }
    PyObject *first = text_or_none(driver_text);
    PyObject *second = text_or_none(nvml_first);
    if (first == NULL || second == NULL) {
        Py_XDECREF(first);
        Py_XDECREF(second);
        return NULL;
    }
    return Py_BuildValue("(ININ)", driver_mask, first, nvml_mask, second);
}

/*
 * What the simulated CUDA runtime refused so far: (bitmask, first refused call), or None when
 * no simulated runtime is loaded.  Never loads one: a process that never used the runtime
 * has nothing to report.
 */
static PyObject *runtime_refusals(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    static const char *const sonames[] = {"libcudart.so.13", "libcudart.so.12"};
    for (size_t i = 0; i < sizeof(sonames) / sizeof(sonames[0]); i++) {
        void *runtime = dlopen(sonames[i], RTLD_NOW | RTLD_NOLOAD);
        if (runtime == NULL)
            continue;
        refusals_fn mask = (refusals_fn)dlsym(runtime, "diagtools_simcudart_refusals");
        first_refusal_fn first = (first_refusal_fn)dlsym(runtime, "diagtools_simcudart_first_refusal");
        PyObject *result = NULL;
        if (mask != NULL && first != NULL) {
            PyObject *text = text_or_none(first());
            result = text == NULL ? NULL : Py_BuildValue("(IN)", mask(), text);
        }
        dlclose(runtime);
        if (mask != NULL && first != NULL)
            return result;
    }
    Py_RETURN_NONE;
}

/* cuDeviceGetCount's answer from a libcuda.so.1 the process already loaded; -1 when none is, -2 when
 * the loaded one has no cuDeviceGetCount.  Never loads the library, so asking cannot change the process. */
static PyObject *loaded_driver_state(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL)
        return PyLong_FromLong(-1);
    device_get_count_fn fn = (device_get_count_fn)dlsym(handle, "cuDeviceGetCount");
    int count = 0;
    int result = fn != NULL ? fn(&count) : -2;
    dlclose(handle);
    return PyLong_FromLong(result);
}

static PyObject *die_with_parent(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

typedef int (*adopt_fn)(void);

/* Call the loaded simulated driver's ``name`` (an int function of no argument); -2 when no
 * driver is loaded or it is not the simulated one.  Never loads the library. */
static long call_simulation(const char *name)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver == NULL)
        return -2;
    adopt_fn fn = (adopt_fn)dlsym(driver, name);
    long result = fn != NULL ? fn() : -2;
    dlclose(driver);
    return result;
}

/* 1 when the simulated driver handed the parent's initialization to this process, 0 when there
 * was none to hand over, -1 when it refused, -2 when the loaded driver (if any) is not simulated. */
static PyObject *adopt_parent_init(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    return PyLong_FromLong(call_simulation("diagtools_sim_adopt_init"));
}

/* Whether the loaded driver would hand its initialization to a continuing child. */
static PyObject *driver_adoptable(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    return PyBool_FromLong(call_simulation("diagtools_sim_adoptable") == 1);
}

typedef pid_t (*plain_fork_fn)(void);

static plain_fork_fn plain_fork(void)
{
    static plain_fork_fn found = NULL;
    static int looked = 0;
    if (!looked) {
        looked = 1;
        found = (plain_fork_fn)dlsym(RTLD_DEFAULT, "_Fork"); /* glibc 2.34 and later */
    }
    return found;
}

/*
 * Fork without running the handlers libraries registered with pthread_atfork, for a child that
 * goes on as this process rather than as a forked one: torch's handler marks CUDA unusable in
 * every child ("Cannot re-initialize CUDA in forked subprocess"), which the process that
 * imported a package never is.  The interpreter's own fork work runs as in os.fork.  Only for a
 * process with one thread (no other thread can hold a lock the handlers would have taken).
 * Returns the pid (0 in the child); raises OSError when the C library has no _Fork.
 */
static PyObject *fork_continuing(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    plain_fork_fn fn = plain_fork();
    if (fn == NULL) {
        PyErr_SetString(PyExc_OSError, "this C library has no _Fork");
        return NULL;
    }
    PyOS_BeforeFork();
    pid_t pid = fn();
    if (pid == 0) {
        PyOS_AfterFork_Child();
        return PyLong_FromLong(0);
    }
    int saved = errno;
    PyOS_AfterFork_Parent();
    if (pid < 0) {
        errno = saved;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong((long)pid);
}

/* Whether fork_continuing can work here. */
static PyObject *can_fork_continuing(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    return PyBool_FromLong(plain_fork() != NULL);
}

/* Become the reaper of orphaned descendants, so a zygote can wait for one its child left behind. */
static PyObject *become_subreaper(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* Huge pages for a zygote's memory, so that every fork is cheap.
 *
 * fork() copies one page-table entry per 4 KiB page of private anonymous
 * memory, and the child's exit drops them again: for a zygote that preloaded
 * torch and a large package (600 MiB and more), that is tens of milliseconds
 * of kernel time in every scan child.  MADV_COLLAPSE (Linux 6.1) moves the
 * memory already there into transparent huge pages, one entry per 2 MiB; a
 * child that writes into one is given its own 4 KiB copy, as before.  Only a
 * 2 MiB block that is at least half resident is collapsed, so memory an
 * allocator reserved but never touched is never filled in.  Nothing changes
 * in what the process can see. */
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
#define HUGE_PAGE_BYTES (2UL << 20)

static int mostly_resident(unsigned long start, unsigned char *pages, unsigned long count)
{
    if (mincore((void *)start, HUGE_PAGE_BYTES, pages) != 0)
        return 0;
    unsigned long resident = 0;
    for (unsigned long i = 0; i < count; i++)
        resident += pages[i] & 1;
    return resident * 2 >= count;
}

static unsigned long collapse_range(unsigned long start, unsigned long end, unsigned char *pages, unsigned long count)
{
    unsigned long done = 0;
    start = (start + HUGE_PAGE_BYTES - 1) & ~(HUGE_PAGE_BYTES - 1);
    for (unsigned long at = start; at + HUGE_PAGE_BYTES <= end; at += HUGE_PAGE_BYTES) {
        if (!mostly_resident(at, pages, count))
            continue;
        if (madvise((void *)at, HUGE_PAGE_BYTES, MADV_COLLAPSE) == 0)
            done += HUGE_PAGE_BYTES;
        else if (errno == EINVAL || errno == EPERM)
            break; /* not for this mapping: an older kernel, huge pages off, or the mapping refuses them */
    }
    return done;
}

/* Collapse the private anonymous memory (and the heap) into huge pages; the bytes collapsed. */
static PyObject *collapse_to_huge_pages(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    long page = sysconf(_SC_PAGESIZE);
    unsigned long count = HUGE_PAGE_BYTES / (unsigned long)(page > 0 ? page : 4096);
    unsigned char pages[HUGE_PAGE_BYTES / 4096];
    FILE *maps = count <= sizeof pages ? fopen("/proc/self/maps", "re") : NULL; /* pages under 4 KiB: none */
    if (maps == NULL)
        return PyLong_FromLong(0);
    unsigned long done = 0;
    char line[4096];
    while (fgets(line, sizeof line, maps) != NULL) {
        unsigned long start, end, inode;
        char perms[5];
        int path_at = 0;
        if (sscanf(line, "%lx-%lx %4s %*x %*x:%*x %lu %n", &start, &end, perms, &inode, &path_at) < 4)
            continue;
        const char *path = line + path_at;
        int anonymous = inode == 0 && (path[0] == '\n' || path[0] == '\0' || strncmp(path, "[heap]", 6) == 0);
        if (anonymous && strcmp(perms, "rw-p") == 0)
            done += collapse_range(start, end, pages, count);
    }
    fclose(maps);
    return PyLong_FromUnsignedLong(done);
}

/* Fault dumps that never land in a program's own file.
 *
 * faulthandler writes a dump to a descriptor number.  A program may put its own
 * file on that number (dup2 over the high descriptors), and a crash or the
 * runner's stack request would then write the dump into that file.  The guard
 * wraps faulthandler's handlers: before faulthandler runs, the number's file is
 * compared (device, inode) with the dump file; when it is another, the number
 * is pointed back at the dump file through a spare descriptor, or at /dev/null
 * when the spare is gone too.  The program's descriptor is given up only in a
 * process that is crashing or about to be killed, never its file's bytes.
 * Everything here is async-signal-safe (fstat, dup2, open). */
#define GUARDED_SIGNALS 8
static volatile sig_atomic_t dump_fd = -1, spare_fd = -1;
static dev_t dump_dev;
static ino_t dump_ino;
static int guarded_signals[GUARDED_SIGNALS];
static struct sigaction wrapped[GUARDED_SIGNALS];
static int guarded_count = 0;

static int holds_dump_file(int fd)
{
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == dump_dev && st.st_ino == dump_ino;
}

static void restore_dump_descriptor(void)
{
    if (dump_fd < 0 || holds_dump_file(dump_fd))
        return;
    if (holds_dump_file(spare_fd)) {
        dup2(spare_fd, dump_fd);
        return;
    }
    int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null_fd >= 0) {
        dup2(null_fd, dump_fd);
        close(null_fd);
    }
}

static void guarded_handler(int signum, siginfo_t *info, void *context)
{
    restore_dump_descriptor();
    for (int i = 0; i < guarded_count; i++) {
        if (guarded_signals[i] != signum)
            continue;
        struct sigaction *previous = &wrapped[i];
        if (previous->sa_flags & SA_SIGINFO) {
            previous->sa_sigaction(signum, info, context);
        } else if (previous->sa_handler != SIG_IGN && previous->sa_handler != SIG_DFL) {
            previous->sa_handler(signum);
        } else if (previous->sa_handler == SIG_DFL) {
            sigaction(signum, previous, NULL);
            raise(signum);
        }
        return;
    }
}

/* guard_fault_dumps(dump_fd, spare_fd, signals): wrap the handlers now installed for ``signals``. */
static PyObject *guard_fault_dumps(PyObject *self, PyObject *args)
{
    (void)self;
    int dump = -1, spare = -1;
    PyObject *signals = NULL;
    if (!PyArg_ParseTuple(args, "iiO", &dump, &spare, &signals))
        return NULL;
    struct stat st;
    if (fstat(dump, &st) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_ssize_t count = PySequence_Size(signals);
    if (count < 0)
        return NULL;
    dump_fd = -1; /* a signal arriving meanwhile leaves the descriptors alone */
    dump_dev = st.st_dev;
    dump_ino = st.st_ino;
    spare_fd = spare;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *item = PySequence_GetItem(signals, k);
        if (item == NULL)
            return NULL;
        int signum = (int)PyLong_AsLong(item);
        Py_DECREF(item);
        if (signum == -1 && PyErr_Occurred())
            return NULL;
        struct sigaction current;
        if (sigaction(signum, NULL, &current) != 0)
            return PyErr_SetFromErrno(PyExc_OSError);
        if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == guarded_handler)
            continue; /* wrapped already: faulthandler re-enabled keeps its handler and takes the new number */
        if (guarded_count == GUARDED_SIGNALS)
            break;
        struct sigaction guarded = current;
        guarded.sa_sigaction = guarded_handler;
        guarded.sa_flags = current.sa_flags | SA_SIGINFO;
        guarded_signals[guarded_count] = signum;
        wrapped[guarded_count] = current;
        guarded_count++;
        if (sigaction(signum, &guarded, NULL) != 0) {
            guarded_count--;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    }
    dump_fd = dump;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"driver_state", driver_state, METH_NOARGS, "cuDeviceGetCount's result code, -1 without a driver."},
    {"driver_path", driver_path, METH_NOARGS, "Path of the loaded libcuda.so.1, or None."},
    {"simulation_refusals", simulation_refusals, METH_NOARGS,
     "(driver bitmask, first refused driver call, NVML bitmask, first refused NVML call), or None."},
    {"runtime_refusals", runtime_refusals, METH_NOARGS,
     "(bitmask, first refused call) of the simulated CUDA runtime, or None when none is loaded."},
    {"loaded_driver_state", loaded_driver_state, METH_NOARGS,
     "cuDeviceGetCount's result code from an already-loaded driver, -1 when none is loaded."},
    {"die_with_parent", die_with_parent, METH_NOARGS, "Ask for SIGKILL when the parent process exits."},
    {"adopt_parent_init", adopt_parent_init, METH_NOARGS,
     "Hand the simulated driver's initialization made before a fork to this child (1), or say why not."},
    {"driver_adoptable", driver_adoptable, METH_NOARGS, "Whether the loaded driver can hand over its initialization."},
    {"fork_continuing", fork_continuing, METH_NOARGS, "Fork without the pthread_atfork handlers; the pid, 0 in the child."},
    {"can_fork_continuing", can_fork_continuing, METH_NOARGS, "Whether fork_continuing can work here."},
    {"guard_fault_dumps", guard_fault_dumps, METH_VARARGS,
     "Check the dump descriptor's file before faulthandler writes to it (dump_fd, spare_fd, signals)."},
    {"become_subreaper", become_subreaper, METH_NOARGS, "Reap orphaned descendants (PR_SET_CHILD_SUBREAPER)."},
    {"collapse_to_huge_pages", collapse_to_huge_pages, METH_NOARGS,
     "Move private anonymous memory into transparent huge pages, so forks copy less; the bytes moved."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_diagtools_cuprobe", NULL, -1, methods};

PyMODINIT_FUNC PyInit__diagtools_cuprobe(void) { return PyModule_Create(&module); }
