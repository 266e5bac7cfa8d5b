/* dsc/status.h — the error type every fallible dsc call returns.
 *
 * A dsc_status is NULL on success and an owned error object otherwise. The
 * message is formatted once, at the failure site, and is prefixed with the
 * rank ("rank 3: ...") so that logs from many processes stay readable.
 * Callers either propagate it (DSC_TRY) or consume it (dsc_status_free).
 * Library code never exits; only apps decide what an error means.
 *
 * Thread-safety: creating, wrapping and freeing statuses is safe from any
 * thread. The rank prefix is one process-global value: set it once
 * (dsc_set_rank, done by the communicator at start-up) before threads that
 * report errors exist; it is read without a lock. */
#ifndef DSC_STATUS_H
#define DSC_STATUS_H

#include "dsc/api.h"
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsc_code {
    DSC_OK = 0,
    DSC_ERR_INVALID,     /* bad argument, shape or value from the caller */
    DSC_ERR_CONFIG,      /* bad configuration file or override */
    DSC_ERR_IO,          /* file missing, unreadable, unwritable */
    DSC_ERR_CORRUPT,     /* file readable but its content is wrong */
    DSC_ERR_NOMEM,       /* allocation failed or budget exceeded */
    DSC_ERR_COMM,        /* MPI / NCCL failure */
    DSC_ERR_TIMEOUT,     /* a peer did not answer in time */
    DSC_ERR_PEER,        /* another rank reported an error */
    DSC_ERR_NUMERIC,     /* NaN / Inf where a finite value was required */
    DSC_ERR_UNSUPPORTED, /* valid request that dsc does not implement */
    DSC_ERR_BACKEND,     /* CUDA / cuBLAS / BLAS failure */
    DSC_ERR_INTERNAL     /* a bug in dsc */
} dsc_code;

typedef struct dsc_status_s *dsc_status;

/* Creates an error with a printf-style message; never returns NULL (the
 * attribute tells the compiler so, which lets it see that a DSC_CHECK
 * failure always leaves the function and never reads what it skipped). */
DSC_API dsc_status dsc_error(dsc_code code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), returns_nonnull));
DSC_API dsc_status dsc_verror(dsc_code code, const char *fmt, va_list ap) __attribute__((returns_nonnull));

/* Prefixes context to an existing error ("loading checkpoint x: <inner>"),
 * consuming it. Returns NULL when inner is NULL. */
DSC_API dsc_status dsc_error_wrap(dsc_status inner, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

DSC_API dsc_code dsc_status_code(dsc_status s);
DSC_API const char *dsc_status_message(dsc_status s); /* "ok" for NULL */
DSC_API const char *dsc_code_name(dsc_code code);
DSC_API void dsc_status_free(dsc_status s);

/* The rank that prefixes messages; -1 (the default) prints no prefix. */
DSC_API void dsc_set_rank(int rank);
DSC_API int dsc_get_rank(void);

#define DSC_TRY(expr)                                                                                             \
    do {                                                                                                          \
        dsc_status dsc_try_s_ = (expr);                                                                           \
        if (dsc_try_s_) return dsc_try_s_;                                                                        \
    } while (0)

/* For functions with cleanup: stores the error in `st` and jumps to `label`. */
#define DSC_TRY_GOTO(st, expr, label)                                                                             \
    do {                                                                                                          \
        (st) = (expr);                                                                                            \
        if (st) goto label;                                                                                       \
    } while (0)

/* Returns an error of `code` when `cond` does not hold. */
#define DSC_CHECK(cond, code, ...)                                                                                \
    do {                                                                                                          \
        if (!(cond)) return dsc_error((code), __VA_ARGS__);                                                       \
    } while (0)

/* Internal invariants (bugs, not bad input): prints file:line and rank. */
DSC_API void dsc_assert_fail(const char *expr, const char *file, int line);
#define DSC_ASSERT(cond)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) dsc_assert_fail(#cond, __FILE__, __LINE__);                                                  \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
