/* DeepSpeed's comms_logger: every profiled operation's latency, by operation
 * and message size, summarised as deepspeed.comm.log_summary prints it
 * (count, total and trimmed-mean latency, algorithmic and bus bandwidth in
 * Gbps), and with `verbose` a line per operation as it completes.
 *
 * Message sizes and bandwidths follow DeepSpeed's calc_bw_log: the size is
 * the whole tensor (all-gather's output, reduce-scatter's input); all-reduce
 * moves it twice (busbw * 2(n-1)/n), all-gather, reduce-scatter and
 * all-to-all (n-1)/n, point-to-point and broadcast once. n is the size of
 * the operation's communicator (DeepSpeed uses the world size for every
 * group, which overstates subgroup bandwidth). With `debug` each record also
 * names its communicator, where DeepSpeed names the calling function.
 *
 * One logger per process, fed from the thread that calls the communicator. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm_internal.h"

typedef struct size_record {
    char name[96]; /* DeepSpeed's op name, plus " | [Communicator: x]" with debug */
    dsc_comm_op op;
    int n; /* the communicator's size */
    int64_t bytes;
    double *latency_s;
    int64_t count, cap;
} size_record;

static struct {
    dsc_comm_logger_options o;
    size_record *rec;
    int n, cap;
    bool out_of_memory;
} logger;

/* DeepSpeed's record names (deepspeed/comm/comm.py). */
static const char *ds_name(dsc_comm_op op) {
    static const char *const names[DSC_COMM_OP_COUNT] = {
        [DSC_COMM_OP_ALLREDUCE] = "all_reduce",
        [DSC_COMM_OP_REDUCE_SCATTER] = "reduce_scatter_tensor",
        [DSC_COMM_OP_ALLGATHER] = "all_gather_into_tensor",
        [DSC_COMM_OP_ALLTOALL] = "all_to_all_single",
        [DSC_COMM_OP_ALLTOALLV] = "all_to_all_single",
        [DSC_COMM_OP_BROADCAST] = "broadcast",
        [DSC_COMM_OP_SEND] = "send",
        [DSC_COMM_OP_RECV] = "recv",
        [DSC_COMM_OP_BARRIER] = "barrier",
    };
    return (unsigned)op < DSC_COMM_OP_COUNT ? names[op] : "?";
}

static void clear_records(void) {
    for (int i = 0; i < logger.n; i++)
        free(logger.rec[i].latency_s);
    free(logger.rec);
    logger.rec = NULL;
    logger.n = logger.cap = 0;
    logger.out_of_memory = false;
}

void dsc_comm_logger_configure(const dsc_comm_logger_options *o) {
    clear_records();
    logger.o = *o;
}

bool comm_log_enabled(void) {
    return logger.o.enabled && logger.o.prof_all;
}

static size_record *record_for(const dsc_comm *c, dsc_comm_op op, int64_t bytes) {
    char name[96];
    if (logger.o.debug)
        snprintf(name, sizeof name, "%s | [Communicator: %s]", ds_name(op), c->name);
    else
        snprintf(name, sizeof name, "%s", ds_name(op));
    for (int i = 0; i < logger.n; i++)
        if (logger.rec[i].bytes == bytes && logger.rec[i].n == c->size && strcmp(logger.rec[i].name, name) == 0)
            return &logger.rec[i];
    if (logger.n == logger.cap) {
        int cap = logger.cap ? 2 * logger.cap : 16;
        size_record *grown = realloc(logger.rec, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        logger.rec = grown, logger.cap = cap;
    }
    size_record *r = &logger.rec[logger.n++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->op = op, r->n = c->size, r->bytes = bytes;
    return r;
}

/* calc_bw_log, in Gbps. */
static void bandwidths(dsc_comm_op op, int n, int64_t bytes, double s, double *algbw, double *busbw) {
    double size = (double)bytes, f = n > 0 ? (double)(n - 1) / n : 0.0;
    *algbw = s > 0 ? size / s : 0.0;
    *busbw = *algbw;
    switch (op) {
    case DSC_COMM_OP_ALLREDUCE:
        *busbw = *algbw * 2.0 * f;
        *algbw *= 2.0;
        break;
    case DSC_COMM_OP_ALLGATHER:
    case DSC_COMM_OP_REDUCE_SCATTER:
    case DSC_COMM_OP_ALLTOALL:
    case DSC_COMM_OP_ALLTOALLV:
        *busbw = *algbw * f;
        break;
    default:
        break;
    }
    *algbw *= 8e-9, *busbw *= 8e-9;
}

static const char *human_bytes(int64_t b, char *buf, size_t len) { /* DeepSpeed's convert_size */
    static const char *const units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
    if (b <= 0) return snprintf(buf, len, "0B"), buf;
    int i = (int)floor(log((double)b) / log(1024.0));
    if (i > 5) i = 5;
    /* Python's str(round(x, 2)): "1.0", "1.5", "678.86" */
    char num[32];
    snprintf(num, sizeof num, "%.2f", (double)b / pow(1024.0, i));
    size_t n = strlen(num);
    while (n > 0 && num[n - 1] == '0' && num[n - 2] != '.')
        num[--n] = '\0';
    snprintf(buf, len, "%s %s", num, units[i]);
    return buf;
}

void comm_log_record(const dsc_comm *c, dsc_comm_op op, int64_t bytes, double seconds) {
    if (!logger.o.enabled || !logger.o.prof_all || logger.out_of_memory) return;
    size_record *r = record_for(c, op, bytes);
    if (r && r->count == r->cap) {
        int64_t cap = r->cap ? 2 * r->cap : 16;
        double *grown = realloc(r->latency_s, (size_t)cap * sizeof *grown);
        if (grown) r->latency_s = grown, r->cap = cap;
    }
    if (!r || r->count == r->cap) {
        logger.out_of_memory = true; /* the summary says so rather than print partial numbers */
        return;
    }
    r->latency_s[r->count++] = seconds;
    if (logger.o.verbose) {
        double algbw, busbw;
        char size[32];
        bandwidths(op, c->size, bytes, seconds, &algbw, &busbw);
        printf("comm op: %s | time (ms): %.2f | msg size: %s | algbw (Gbps): %.2f | busbw (Gbps): %.2f\n", r->name,
               1e3 * seconds, human_bytes(bytes, size, sizeof size), algbw, busbw);
    }
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* deepspeed.utils.timer.trim_mean: sort, drop round(10% of n) from each end
 * (Python rounds half to even, as nearbyint does by default). */
static double trim_mean(double *v, int64_t n) {
    if (n == 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, by_value);
    int64_t k = (int64_t)nearbyint((double)n * 0.1);
    double sum = 0;
    for (int64_t i = k; i < n - k; i++)
        sum += v[i];
    return n - 2 * k > 0 ? sum / (double)(n - 2 * k) : 0.0;
}

static int by_name_then_size(const void *a, const void *b) {
    const size_record *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return (x->bytes > y->bytes) - (x->bytes < y->bytes);
}

dsc_status dsc_comm_logger_summary(FILE *out) {
    DSC_CHECK(!logger.out_of_memory, DSC_ERR_NOMEM, "comms_logger: ran out of memory recording latencies");
    qsort(logger.rec, (size_t)logger.n, sizeof *logger.rec, by_name_then_size);
    fprintf(out, "%-20s%-20s%-20s%-20s%-20s%-20s%-20s\n", "Comm. Op", "Message Size", "Count", "Total Latency(ms)",
            "Avg Latency(ms)", "tput_avg (Gbps)", "busbw_avg (Gbps)");
    int64_t most = 0;
    for (int i = 0; i < logger.n; i++)
        most = logger.rec[i].count > most ? logger.rec[i].count : most;
    double *alg = malloc((size_t)(most > 0 ? most : 1) * sizeof *alg);
    double *bus = malloc((size_t)(most > 0 ? most : 1) * sizeof *bus);
    double *lat = malloc((size_t)(most > 0 ? most : 1) * sizeof *lat);
    if (!alg || !bus || !lat) {
        free(alg), free(bus), free(lat);
        return dsc_error(DSC_ERR_NOMEM, "comms_logger: summary of %lld operations", (long long)most);
    }
    for (int i = 0; i < logger.n; i++) {
        const size_record *r = &logger.rec[i];
        if (i == 0 || strcmp(r->name, logger.rec[i - 1].name) != 0) fprintf(out, "%s\n", r->name);
        double total = 0;
        for (int64_t j = 0; j < r->count; j++) {
            lat[j] = r->latency_s[j] * 1e3;
            total += lat[j];
            bandwidths(r->op, r->n, r->bytes, r->latency_s[j], &alg[j], &bus[j]);
        }
        char size[32];
        fprintf(out, "%-20s%-20s%-20lld%-20.2f%-20.2f%-20.2f%-20.2f\n", "",
                human_bytes(r->bytes, size, sizeof size), (long long)r->count, total, trim_mean(lat, r->count),
                trim_mean(alg, r->count), trim_mean(bus, r->count));
    }
    free(alg), free(bus), free(lat);
    fflush(out);
    return NULL;
}
