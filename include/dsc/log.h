/* dsc/log.h — leveled logging with a rank prefix.
 *
 * The level comes from DSC_LOG_LEVEL (error, warn, info, debug; default info)
 * and is read once. Messages go to stderr as "[dsc rank 3 INFO] ...". Rank-0
 * only messages use dsc_log_rank0 so that a 64-rank job does not print 64
 * copies of the same line. */
#ifndef DSC_LOG_H
#define DSC_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsc_log_level {
    DSC_LOG_ERROR = 0,
    DSC_LOG_WARN = 1,
    DSC_LOG_INFO = 2,
    DSC_LOG_DEBUG = 3
} dsc_log_level;

void dsc_log(dsc_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void dsc_log_rank0(dsc_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
dsc_log_level dsc_log_get_level(void);
void dsc_log_set_level(dsc_log_level level);

#define DSC_LOG_ERR(...) dsc_log(DSC_LOG_ERROR, __VA_ARGS__)
#define DSC_LOG_WARN(...) dsc_log(DSC_LOG_WARN, __VA_ARGS__)
#define DSC_LOG_INFO(...) dsc_log(DSC_LOG_INFO, __VA_ARGS__)
#define DSC_LOG_DEBUG(...) dsc_log(DSC_LOG_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
