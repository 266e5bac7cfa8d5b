/* DeepSpeed's comms_logger summary from known latencies: message sizes in
 * convert_size's spelling, trimmed means (10% off each end, Python's
 * rounding), and calc_bw_log's bandwidths, computed here by its formulas:
 * all_reduce algbw = 2 S / t, busbw = S / t * 2 (n - 1) / n; all_gather
 * algbw = S / t, busbw = S / t * (n - 1) / n; send busbw = algbw; all in
 * Gbps (* 8 / 1e9). And the records of real operations on this job's ranks. */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm_internal.h"
#include "test_mpi.h"

/* The table prints two decimals. */
#define TOL 0.006

/* The summary table into *text (malloc'd). The stream writes through the
 * caller's pointer, so it must outlive the stream: it is the caller's. */
static void summary(char **text) {
    size_t len = 0;
    *text = NULL;
    FILE *f = open_memstream(text, &len);
    assert_non_null(f);
    assert_ok(dsc_comm_logger_summary(f));
    fclose(f);
}

/* The row of `op` for message size `size`: the fields after the size. */
static void row(const char *text, const char *op, const char *size, char *out, size_t len) {
    const char *at = strstr(text, op);
    assert_non_null(at);
    const char *r = strstr(at, size);
    assert_non_null(r);
    const char *end = strchr(r, '\n');
    snprintf(out, len, "%.*s", (int)(end - r - strlen(size)), r + strlen(size));
}

static void test_summary_from_known_latencies(void **state) {
    (void)state;
    dsc_comm_logger_configure(&(dsc_comm_logger_options){.enabled = true, .prof_all = true});
    dsc_comm c = {.size = 4};
    snprintf(c.name, sizeof c.name, "dp");
    const int64_t mb = 1 << 20;
    for (int i = 0; i < 9; i++)
        comm_log_record(&c, DSC_COMM_OP_ALLREDUCE, mb, 1e-3);
    comm_log_record(&c, DSC_COMM_OP_ALLREDUCE, mb, 0.1); /* trimmed away with the fastest */
    comm_log_record(&c, DSC_COMM_OP_ALLGATHER, 3 * mb / 2, 2e-3);
    comm_log_record(&c, DSC_COMM_OP_SEND, 1000, 1e-6);
    char *text;
    summary(&text);
    printf("%s", text);
    char fields[256];
    double total, avg, alg, bus;
    long long count;
    row(text, "all_reduce\n", "1.0 MB", fields, sizeof fields);
    assert_int_equal(sscanf(fields, "%lld %lf %lf %lf %lf", &count, &total, &avg, &alg, &bus), 5);
    assert_int_equal(count, 10);
    assert_float_equal(total, 9 * 1.0 + 100.0, TOL);
    assert_float_equal(avg, 1.0, TOL);
    /* per-call algbw: 2 S / 1 ms nine times, 2 S / 100 ms once; the trimmed mean drops one of each end */
    assert_float_equal(alg, 2.0 * mb / 1e-3 * 8e-9, TOL);
    assert_float_equal(bus, mb / 1e-3 * 2.0 * 3 / 4 * 8e-9, TOL);
    row(text, "all_gather_into_tensor\n", "1.5 MB", fields, sizeof fields);
    assert_int_equal(sscanf(fields, "%lld %lf %lf %lf %lf", &count, &total, &avg, &alg, &bus), 5);
    assert_float_equal(alg, 1.5 * mb / 2e-3 * 8e-9, TOL);
    assert_float_equal(bus, 1.5 * mb / 2e-3 * 8e-9 * 3.0 / 4, TOL);
    row(text, "send\n", "1000.0 B", fields, sizeof fields);
    assert_int_equal(sscanf(fields, "%lld %lf %lf %lf %lf", &count, &total, &avg, &alg, &bus), 5);
    assert_float_equal(alg, 8.0, TOL);
    assert_float_equal(bus, alg, TOL);
    free(text);
    dsc_comm_logger_configure(&(dsc_comm_logger_options){0});
}

/* debug names the communicator; prof_all false logs nothing. */
static void test_debug_and_prof_all(void **state) {
    (void)state;
    dsc_comm c = {.size = 2};
    snprintf(c.name, sizeof c.name, "tensor");
    dsc_comm_logger_configure(&(dsc_comm_logger_options){.enabled = true, .prof_all = true, .debug = true});
    comm_log_record(&c, DSC_COMM_OP_ALLREDUCE, 64, 1e-5);
    char *text;
    summary(&text);
    assert_non_null(strstr(text, "all_reduce | [Communicator: tensor]"));
    free(text);
    dsc_comm_logger_configure(&(dsc_comm_logger_options){.enabled = true, .prof_all = false});
    comm_log_record(&c, DSC_COMM_OP_ALLREDUCE, 64, 1e-5);
    summary(&text);
    assert_null(strstr(text, "all_reduce"));
    free(text);
    dsc_comm_logger_configure(&(dsc_comm_logger_options){0});
}

/* Operations on this job's communicator land in the records, by message size. */
static void test_real_operations(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int n = dsc_comm_size(world);
    static float buf[1024], gathered[1024 * 8];
    int64_t len = 1024, all = 1024 * n;
    dsc_tensor t = dsc_tensor_view(buf, DSC_DTYPE_F32, 1, &len, DSC_CPU);
    dsc_tensor g = dsc_tensor_view(gathered, DSC_DTYPE_F32, 1, &all, DSC_CPU);
    dsc_comm_logger_configure(&(dsc_comm_logger_options){.enabled = true, .prof_all = true});
    for (int i = 0; i < 3; i++)
        assert_ok(dsc_comm_allreduce(world, &t, DSC_REDUCE_OP_SUM));
    assert_ok(dsc_comm_allgather(world, &t, &g, NULL));
    assert_ok(dsc_comm_broadcast(world, &t, 0));
    char *text;
    summary(&text);
    char fields[256], size[32];
    long long count;
    row(text, "all_reduce\n", "4.0 KB", fields, sizeof fields);
    assert_int_equal(sscanf(fields, "%lld", &count), 1);
    assert_int_equal(count, 3);
    snprintf(size, sizeof size, "%d.0 KB", 4 * n); /* all-gather's size is its output */
    row(text, "all_gather_into_tensor\n", size, fields, sizeof fields);
    assert_int_equal(sscanf(fields, "%lld", &count), 1);
    assert_int_equal(count, 1);
    row(text, "broadcast\n", "4.0 KB", fields, sizeof fields);
    free(text);
    dsc_comm_logger_configure(&(dsc_comm_logger_options){0});
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_summary_from_known_latencies),
        cmocka_unit_test(test_debug_and_prof_all),
        cmocka_unit_test(test_real_operations),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
