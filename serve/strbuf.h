/* A growing byte string for building prompts, JSON-free text responses and
 * SSE frames (allocation failure is sticky, `oom`, so that callers check
 * once at the end), and the growth rule of dsc-serve's other arrays. */
#ifndef DSC_SERVE_STRBUF_H
#define DSC_SERVE_STRBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct serve_buf {
    char *p; /* NUL-terminated when len > 0 */
    size_t len, cap;
    bool oom;
} serve_buf;

void serve_buf_add(serve_buf *b, const char *s, size_t n);
void serve_buf_puts(serve_buf *b, const char *s);
void serve_buf_printf(serve_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void serve_buf_free(serve_buf *b);

/* Grows *buf (elements of `size` bytes, capacity *cap) to hold `need`,
 * doubling; false when out of memory (the buffer is then unchanged). */
bool serve_grow(void **buf, int64_t *cap, int64_t need, size_t size);

#endif
