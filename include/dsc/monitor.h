/* dsc/monitor.h — training monitors with DeepSpeed's file layouts: scalar
 * events (tag, value, step) written to TensorBoard event files
 * (`tensorboard`) and to one CSV file per tag (`csv_monitor`), as DeepSpeed's
 * monitor module writes them: output_path/job_name/, tags such as
 * "Train/Samples/train_loss" against the number of samples seen.
 *
 * One rank (the logging rank) owns a monitor; nothing here communicates.
 * Not here: what is measured (the engine decides the events). */
#ifndef DSC_MONITOR_H
#define DSC_MONITOR_H

#include <stdint.h>

#include "dsc/api.h"
#include "dsc/config.h"
#include "dsc/nn.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_monitor dsc_monitor;

/* The monitors the config enables (possibly none: *out is then NULL, and
 * every call below accepts NULL). Creates the output directories. */
DSC_API dsc_status dsc_monitor_create(const dsc_config *cfg, dsc_monitor **out);

/* One scalar event to every enabled monitor. */
DSC_API dsc_status dsc_monitor_write(dsc_monitor *m, const char *tag, double value, int64_t step);

/* Flushes and closes the files. */
DSC_API void dsc_monitor_destroy(dsc_monitor *m);

/* ---- the FLOPs profiler's report ------------------------------------------------------
 * What the profiled step was, beside the per-layer rows (dsc_layer_profile). */
typedef struct dsc_flops_report {
    int64_t step; /* 1-based number of the profiled step */
    int rank;     /* world rank writing the report */
    int dp_size, pp_size;
    int64_t samples_per_rank; /* sequences this rank computed in the step */
    double step_s;            /* the step's wall time */
} dsc_flops_report;

/* Writes DeepSpeed's print_model_profile layout to cfg->output_file (or
 * stdout): summary, top cfg->top_modules layers, and, when cfg->detailed, a
 * row per layer down to cfg->module_depth. */
DSC_API dsc_status dsc_flops_profile_write(const dsc_config_flops_profiler *cfg, const dsc_flops_report *r,
                                           const dsc_layer_profile *rows, int n);

/* ---- the TensorBoard event file writer, on its own ---------------------------------
 * TFRecord framing (length, masked CRC-32C of the length, Event protobuf,
 * masked CRC-32C of the data) around tensorflow.Event messages: a file_version
 * event first, then one Summary with a simple_value per scalar. */
typedef struct dsc_tfevents dsc_tfevents;
/* Opens DIR/events.out.tfevents.<seconds>.<host>.<pid> (DIR must exist). */
DSC_API dsc_status dsc_tfevents_open(const char *dir, dsc_tfevents **out);
DSC_API dsc_status dsc_tfevents_scalar(dsc_tfevents *w, const char *tag, float value, int64_t step,
                                       double wall_time);
DSC_API void dsc_tfevents_close(dsc_tfevents *w);
/* CRC-32C (Castagnoli) of `n` bytes, as TFRecord frames use it before masking. */
DSC_API uint32_t dsc_crc32c(const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
