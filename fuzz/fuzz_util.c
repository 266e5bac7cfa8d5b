/* Scratch files for the harnesses (see fuzz_util.h). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static void remove_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", dir);
}

const char *fuzz_dir(void) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/dsc_fuzz_XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(remove_dir);
    }
    return dir;
}

const char *fuzz_write(const char *name, const uint8_t *data, size_t size) {
    static char path[8][128];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, sizeof path[0], "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(p, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror("fuzz: writing the input");
        abort();
    }
    return p;
}

char *fuzz_text(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}
