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
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>

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

/* The driver's answer to cuDeviceGetCount; -1 when no driver library loads. */
static PyObject *driver_state(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    load_driver();
    if (device_get_count == NULL)
        return PyLong_FromLong(-1);
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
    if (device_get_count == NULL || dladdr((void *)device_get_count, &info) == 0 || info.dli_fname == NULL)
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

/* cuDeviceGetCount's answer from a libcuda.so.1 the process already loaded; -1 when none is.
 * Never loads the library, so asking cannot change the process. */
static PyObject *loaded_driver_state(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL)
        return PyLong_FromLong(-1);
    device_get_count_fn fn = (device_get_count_fn)dlsym(handle, "cuDeviceGetCount");
    int count = 0;
    int result = fn != NULL ? fn(&count) : -1;
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
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_diagtools_cuprobe", NULL, -1, methods};

PyMODINIT_FUNC PyInit__diagtools_cuprobe(void) { return PyModule_Create(&module); }
