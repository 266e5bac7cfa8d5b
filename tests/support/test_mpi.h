/* Helpers for tests: running cmocka groups on every rank of an MPI job, and
 * turning a dsc_status into a cmocka failure that prints its message. */
#ifndef DSC_TEST_MPI_H
#define DSC_TEST_MPI_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "dsc/status.h"

/* Initialises MPI (unless the test already did), sets the dsc rank, runs the group on every rank, and
 * aborts the job if any rank failed so that no rank waits forever in a
 * collective. Returns the process exit code. */
int dsc_test_run_mpi(const char *name, const struct CMUnitTest *tests, size_t count);
#define DSC_RUN_MPI_TESTS(tests) dsc_test_run_mpi(__FILE__, tests, sizeof(tests) / sizeof((tests)[0]))

/* Fails the current test with the status message when s is an error. */
void dsc_test_ok(dsc_status s, const char *expr, const char *file, int line);
#define assert_ok(expr) dsc_test_ok((expr), #expr, __FILE__, __LINE__)

/* Asserts that `s` is an error with `code` whose message contains `needle`; frees it. */
void dsc_test_err(dsc_status s, int code, const char *needle, const char *expr, const char *file, int line);
#define assert_err(expr, code, needle) dsc_test_err((expr), (code), (needle), #expr, __FILE__, __LINE__)

/* Largest relative error max|a-b| / max(max|b|, floor) over n floats; prints it with `what`. */
/* Whether the text between "<!-- NAME:begin -->\n" and "<!-- NAME:end -->" in
 * the file at `path` is `text` (generated tables kept in the docs). */
bool dsc_test_doc_block_is(const char *path, const char *name, const char *text);

double dsc_test_max_rel_err(const float *a, const float *b, int64_t n, double floor, const char *what);
/* max |a - b| / max(|b|, 1e-6) without printing (per-row checks inside loops). */
double dsc_test_rel_err(const float *a, const float *b, int64_t n);

#endif
