/* Shared by the libFuzzer harnesses: inputs that dsc reads from files are
 * written to a private scratch directory first, so each harness drives the
 * same public entry point a user's file would (no parser-internal hooks).
 * Not here: any parsing; the harnesses call dsc's own. */
#ifndef DSC_FUZZ_UTIL_H
#define DSC_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* The scratch directory (made once per process, removed at exit). */
const char *fuzz_dir(void);
/* Writes data to fuzz_dir()/name and returns that path (static storage per name slot). */
const char *fuzz_write(const char *name, const uint8_t *data, size_t size);
/* A NUL-terminated copy of data (the caller frees it). */
char *fuzz_text(const uint8_t *data, size_t size);

#endif
