/* TensorBoard event files written by hand: each record is TFRecord-framed
 * (uint64 length, masked CRC-32C of those 8 bytes, the payload, masked CRC-32C
 * of the payload; little-endian) and each payload is a tensorflow.Event
 * protobuf encoded field by field: wall_time (1, double), step (2, varint),
 * file_version (3, string) or summary (5, message) holding one
 * Summary.Value with tag (1, string) and simple_value (2, float). That is all
 * TensorBoard needs for scalar charts. Not here: which scalars (monitor.c). */
#define _POSIX_C_SOURCE 200809L /* gethostname */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsc/monitor.h"

struct dsc_tfevents {
    FILE *f;
    char path[1024];
};

uint32_t dsc_crc32c(const void *data, size_t n) {
    static uint32_t table[256];
    static int ready;
    if (!ready) { /* reflected Castagnoli polynomial; the table is the same whichever thread builds it */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    const unsigned char *p = data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

/* TFRecord's masking, so that a CRC of data that holds CRCs stays useful. */
static uint32_t masked_crc(const void *data, size_t n) {
    uint32_t crc = dsc_crc32c(data, n);
    return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

/* A growing protobuf message in a fixed buffer (events here are small). */
typedef struct pb {
    unsigned char b[1024];
    size_t n;
    int overflow;
} pb;

static void put(pb *m, const void *src, size_t n) {
    if (m->n + n > sizeof m->b) {
        m->overflow = 1;
        return;
    }
    memcpy(m->b + m->n, src, n);
    m->n += n;
}

static void varint(pb *m, uint64_t v) {
    unsigned char out[10];
    size_t n = 0;
    do {
        out[n] = (unsigned char)(v & 0x7F);
        v >>= 7;
        if (v) out[n] |= 0x80;
        n++;
    } while (v);
    put(m, out, n);
}

static void le(unsigned char *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++)
        out[i] = (unsigned char)(v >> (8 * i));
}

/* A fixed-width field: 8 bytes (wire type 1, double) or 4 (wire type 5, float). */
static void field_fixed(pb *m, int field, uint64_t bits, int bytes) {
    unsigned char out[8];
    le(out, bits, bytes);
    varint(m, (uint64_t)field << 3 | (bytes == 8 ? 1 : 5));
    put(m, out, (size_t)bytes);
}

static void field_double(pb *m, int field, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    field_fixed(m, field, bits, 8);
}

static void field_float(pb *m, int field, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    field_fixed(m, field, bits, 4);
}

static void field_bytes(pb *m, int field, const void *data, size_t n) {
    varint(m, (uint64_t)field << 3 | 2);
    varint(m, n);
    put(m, data, n);
}

static dsc_status write_record(dsc_tfevents *w, const pb *m) {
    DSC_CHECK(!m->overflow, DSC_ERR_INVALID, "%s: event larger than %zu bytes", w->path, sizeof m->b);
    unsigned char len[8], crc[4], data_crc[4];
    le(len, m->n, 8);
    le(crc, masked_crc(len, 8), 4);
    le(data_crc, masked_crc(m->b, m->n), 4);
    int ok = fwrite(len, 1, 8, w->f) == 8 && fwrite(crc, 1, 4, w->f) == 4 && fwrite(m->b, 1, m->n, w->f) == m->n &&
             fwrite(data_crc, 1, 4, w->f) == 4 && fflush(w->f) == 0;
    DSC_CHECK(ok, DSC_ERR_IO, "%s: writing an event: %s", w->path, strerror(errno));
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

dsc_status dsc_tfevents_open(const char *dir, dsc_tfevents **out) {
    *out = NULL;
    dsc_tfevents *w = calloc(1, sizeof *w);
    DSC_CHECK(w, DSC_ERR_NOMEM, "tensorboard writer for %s", dir);
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d", dir, (long long)time(NULL), host,
             (int)getpid());
    w->f = fopen(w->path, "wb");
    if (!w->f) {
        dsc_status s = dsc_error(DSC_ERR_IO, "%s: cannot create: %s", w->path, strerror(errno));
        free(w);
        return s;
    }
    pb m = {0};
    field_double(&m, 1, now_s());
    field_bytes(&m, 3, "brain.Event:2", 13);
    dsc_status s = write_record(w, &m);
    if (s) {
        dsc_tfevents_close(w);
        return s;
    }
    *out = w;
    return NULL;
}

dsc_status dsc_tfevents_scalar(dsc_tfevents *w, const char *tag, float value, int64_t step, double wall_time) {
    pb v = {0}, summary = {0}, event = {0};
    field_bytes(&v, 1, tag, strlen(tag));
    field_float(&v, 2, value);
    field_bytes(&summary, 1, v.b, v.n);
    field_double(&event, 1, wall_time > 0 ? wall_time : now_s());
    varint(&event, 2 << 3 | 0);
    varint(&event, (uint64_t)step);
    field_bytes(&event, 5, summary.b, summary.n);
    event.overflow |= v.overflow | summary.overflow;
    return write_record(w, &event);
}

void dsc_tfevents_close(dsc_tfevents *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    free(w);
}
