/*
 * libdiagtools_starts.so: every Python program a watched command starts, named the moment it starts.
 *
 * ``diagtools run`` preloads this library (LD_PRELOAD) into the command's whole
 * process tree.  Its constructor runs in each new program image before main():
 * when the image is a Python interpreter it appends one line to the run's
 * ``starts`` file, ``PID PPID HEX``, HEX being the command line's NUL-separated
 * words (at most 600 bytes) in hexadecimal.  One write with O_APPEND: lines of
 * processes starting at once never mix.  The host compares these lines with the
 * agents' records; a Python process that never reported is named, however short
 * it lived, where polling /proc could miss it.  Nothing else is done: no
 * allocation, no symbol is exported, errno is left as it was.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The protocol's names (diagtools/protocol.py: RUN_DIR, RUN_STARTS), passed by the build with -D. */
#ifndef RUN_DIR_VARIABLE
#error "build with -DRUN_DIR_VARIABLE=\"...\" -DSTARTS_FILE=\"...\" (diagtools.driver.build_starts_library)"
#endif

#define ARGV_LIMIT 600

static int is_python(const char *name)
{
    if (strncmp(name, "python", 6) != 0)
        return 0;
    for (const char *c = name + 6; *c; c++)
        if ((*c < '0' || *c > '9') && *c != '.')
            return 0;
    return 1;
}

static size_t read_cmdline(unsigned char *words, size_t limit)
{
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t got = 0;
    while (got < limit) {
        ssize_t n = read(fd, words + got, limit - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    while (got > 0 && words[got - 1] == 0)
        got--;
    return got;
}

__attribute__((constructor)) static void note_start(void)
{
    int saved_errno = errno;
    const char *directory = getenv(RUN_DIR_VARIABLE);
    char exe[PATH_MAX];
    ssize_t length = directory && *directory ? readlink("/proc/self/exe", exe, sizeof exe - 1) : -1;
    if (length > 0) {
        exe[length] = 0;
        const char *name = strrchr(exe, '/');
        if (is_python(name ? name + 1 : exe)) {
            unsigned char words[ARGV_LIMIT];
            size_t size = read_cmdline(words, sizeof words);
            char line[64 + 2 * ARGV_LIMIT];
            int at = snprintf(line, sizeof line, "%d %d ", (int)getpid(), (int)getppid());
            static const char hex[] = "0123456789abcdef";
            for (size_t i = 0; i < size && at + 3 < (int)sizeof line; i++) {
                line[at++] = hex[words[i] >> 4];
                line[at++] = hex[words[i] & 15];
            }
            line[at++] = '\n';
            char path[PATH_MAX];
            if (snprintf(path, sizeof path, "%s/%s", directory, STARTS_FILE) < (int)sizeof path) {
                int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
                if (fd >= 0) {
                    ssize_t written = write(fd, line, (size_t)at);
                    (void)written;
                    close(fd);
                }
            }
        }
    }
    errno = saved_errno;
}
