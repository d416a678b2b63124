/*
 * Helpers for the driver's GIL test, called through ctypes.
 *
 * init_then_signal (through ctypes.CDLL, so without the GIL) says it is in C,
 * waits for the go, calls the library's init function (cuInit(0), or the
 * injection library's InitializeInjection()), then says it is done.
 * signal_and_wait (through ctypes.PyDLL, so holding the GIL) gives the go and
 * waits for done: a thread that holds the GIL while it waits on the driver.
 */
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>

int init_then_signal(const char *library, const char *function, int ready_fd, int go_fd, int done_fd)
{
    char byte = 0;
    void *handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    void *found = handle ? dlsym(handle, function) : NULL;
    if (found == NULL)
        return -1;
    if (write(ready_fd, "r", 1) != 1 || read(go_fd, &byte, 1) != 1)
        return -2;
    int result = strcmp(function, "InitializeInjection") == 0 ? ((int (*)(void))found)()
                                                               : ((int (*)(unsigned int))found)(0);
    if (write(done_fd, "d", 1) != 1)
        return -3;
    return result;
}

int signal_and_wait(int go_fd, int done_fd)
{
    char byte = 0;
    if (write(go_fd, "g", 1) != 1 || read(done_fd, &byte, 1) != 1)
        return -1;
    return 0;
}
