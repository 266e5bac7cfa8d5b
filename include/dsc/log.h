/* dsc/log.h — leveled logging with a rank prefix.
 *
 * The level comes from DSC_LOG_LEVEL (error, warn, info, debug; default info)
 * and is read once. Messages go to stderr as "[dsc rank 3 INFO] ...". Rank-0
 * only messages use dsc_log_rank0 so that a 64-rank job does not print 64
 * copies of the same line.
 *
 * Thread-safety: logging is safe from any thread (one fprintf per line, so
 * lines do not interleave). The level is one process-global value read
 * without a lock: call dsc_log_set_level before starting threads that log;
 * the rank prefix is dsc/status.h's. */
#ifndef DSC_LOG_H
#define DSC_LOG_H

#include "dsc/api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsc_log_level {
    DSC_LOG_ERROR = 0,
    DSC_LOG_WARN = 1,
    DSC_LOG_INFO = 2,
    DSC_LOG_DEBUG = 3
} dsc_log_level;

DSC_API void dsc_log(dsc_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
DSC_API void dsc_log_rank0(dsc_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
DSC_API dsc_log_level dsc_log_get_level(void);
DSC_API void dsc_log_set_level(dsc_log_level level);

#define DSC_LOG_ERR(...) dsc_log(DSC_LOG_ERROR, __VA_ARGS__)
#define DSC_LOG_WARN(...) dsc_log(DSC_LOG_WARN, __VA_ARGS__)
#define DSC_LOG_INFO(...) dsc_log(DSC_LOG_INFO, __VA_ARGS__)
#define DSC_LOG_DEBUG(...) dsc_log(DSC_LOG_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
