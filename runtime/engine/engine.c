/* The training engine: the one loop over steps. Each step hands the batch's
 * data to the runner, averages the loss over the ranks that computed it,
 * stops cleanly on a non-finite loss, has the optimizer reduce and step at the
 * scheduled learning rate, then reports (log line, metrics JSONL, monitors,
 * progress bar), evaluates on the val split when due, and calls the step-end hook.
 *
 * Not here: what a step computes (runners), how gradients are reduced
 * (optimizers), checkpoint files (the checkpoint subsystem via on_step_end). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, fileno */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsc/comm.h"
#include "dsc/engine.h"
#include "dsc/monitor.h"
#include "dsc/precision.h"

struct dsc_engine {
    dsc_engine_options o;
    int64_t steps_done;
    bool stop;            /* dsc_engine_request_stop: no further step */
    double t_start;       /* when dsc_engine_train started (monotonic seconds) */
    FILE *metrics;        /* JSON lines, or NULL */
    dsc_monitor *monitor; /* tensorboard / csv_monitor, or NULL */
    bool bar;             /* the progress bar is on */
};

double dsc_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *dsc_phase_name(dsc_phase phase) {
    static const char *const names[DSC_PHASE_COUNT] = {"forward", "backward", "p2p", "reduce", "optimizer"};
    return (unsigned)phase < DSC_PHASE_COUNT ? names[phase] : "?";
}

/* Under mpirun every rank's stdout is a pseudo-terminal whatever the user's
 * stdout is, so there isatty says nothing; DSC_PROGRESS=1 / 0 decides
 * (scripts/main.sh sets it from its own stdout). */
static bool stdout_is_terminal(void) {
    const char *force = getenv("DSC_PROGRESS");
    if (force) return strcmp(force, "1") == 0;
    return isatty(STDOUT_FILENO) && !getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_RANK");
}

void dsc_engine_options_init(dsc_engine_options *eo, const dsc_config *cfg, dsc_batch_runner *runner,
                             dsc_optimizer *optimizer, dsc_data_loader *data, int64_t seq_len) {
    *eo = (dsc_engine_options){
        .cfg = cfg,
        .runner = runner,
        .optimizer = optimizer,
        .data = data,
        .micro_batches = (int)cfg->gradient_accumulation_steps,
        .global_tokens_per_step = cfg->train_batch_size * seq_len,
    };
}

dsc_status dsc_engine_create(const dsc_engine_options *opts, dsc_engine **out) {
    *out = NULL;
    DSC_CHECK(opts->cfg && opts->runner && opts->optimizer && opts->data, DSC_ERR_INVALID,
              "engine: config, runner, optimizer and data loader are all required");
    DSC_CHECK(opts->micro_batches >= 1, DSC_ERR_INVALID, "engine: micro_batches %d < 1", opts->micro_batches);
    dsc_engine *e = calloc(1, sizeof *e);
    DSC_CHECK(e, DSC_ERR_NOMEM, "engine: out of memory");
    e->o = *opts;
    e->bar = opts->progress && opts->log && stdout_is_terminal();
    *out = e;
    return NULL;
}

void dsc_engine_destroy(dsc_engine *e) {
    if (!e) return;
    if (e->metrics) fclose(e->metrics);
    dsc_monitor_destroy(e->monitor);
    free(e);
}

int64_t dsc_engine_steps_done(const dsc_engine *e) {
    return e->steps_done;
}
void dsc_engine_set_steps_done(dsc_engine *e, int64_t steps) {
    e->steps_done = steps;
}

void dsc_engine_request_stop(dsc_engine *e) {
    e->stop = true;
}

void dsc_engine_set_hook(dsc_engine *e, dsc_engine_hook hook, void *ctx) {
    e->o.on_step_end = hook;
    e->o.hook_ctx = ctx;
}

/* Mean of the loss over every rank that computed one: sums (loss, aux, count)
 * over the data-parallel group and then over the pipeline's stages. */
static dsc_status average_loss(dsc_engine *e, const dsc_batch_result *r, double *loss, double *aux) {
    float v[3] = {r->has_loss ? (float)r->loss : 0.0f, r->has_loss ? (float)r->aux_loss : 0.0f,
                  r->has_loss ? 1.0f : 0.0f};
    bool reduced = false;
    dsc_comm *groups[2] = {e->o.dp, e->o.pipe};
    for (int g = 0; g < 2; g++) {
        if (!groups[g] || dsc_comm_size(groups[g]) == 1) continue;
        int64_t three = 3;
        dsc_tensor t = dsc_tensor_view(v, DSC_DTYPE_F32, 1, &three, DSC_CPU);
        DSC_TRY(dsc_comm_allreduce(groups[g], &t, DSC_REDUCE_OP_SUM));
        reduced = true;
    }
    if (!reduced) { /* one rank: keep the double precision of the runner's sum */
        DSC_CHECK(r->has_loss, DSC_ERR_INTERNAL, "engine: the only rank computed no loss");
        *loss = r->loss;
        *aux = r->aux_loss;
        return NULL;
    }
    DSC_CHECK(v[2] > 0, DSC_ERR_INTERNAL, "engine: no rank of the group computed the loss");
    *loss = v[0] / v[2];
    *aux = v[1] / v[2];
    return NULL;
}

static dsc_status run_step(dsc_engine *e, dsc_step_metrics *m) {
    const dsc_config *cfg = e->o.cfg;
    int64_t index = e->steps_done, n = index + 1;
    double t0 = dsc_time_now();
    /* DeepSpeed does not step the schedule on a step skipped for overflow (mixed precision) */
    int64_t sched = index - dsc_precision_skipped_steps(e->o.optimizer);
    double lr = dsc_lr_schedule_at(&cfg->scheduler, cfg->optimizer.params.lr, sched);
    double beta1, beta2;
    if (dsc_lr_schedule_betas(&cfg->scheduler, sched, &beta1, &beta2))
        dsc_optimizer_set_betas(e->o.optimizer, (float)beta1, (float)beta2);

    dsc_loader_source src;
    dsc_loader_source_init(&src, e->o.data, DSC_DATA_SPLIT_TRAIN, index, e->o.micro_batches);
    dsc_batch_result res;
    dsc_status s = e->o.runner->ops->train_batch(e->o.runner, &src.base, &res);
    if (s) return dsc_error_wrap(s, "step %lld", (long long)n);
    double loss = 0, aux = 0; /* set by average_loss; initialised for gcc -O3, which cannot see it */
    DSC_TRY(average_loss(e, &res, &loss, &aux));
    DSC_CHECK(isfinite(loss) && isfinite(aux), DSC_ERR_NUMERIC,
              "step %lld: the loss is %g (aux %g); stopping before the optimizer step, parameters are those "
              "after step %lld (lower optimizer.params.lr or set gradient_clipping)",
              (long long)n, loss, aux, (long long)index);
    double t_reduce = dsc_time_now();
    s = dsc_optimizer_reduce_grads(e->o.optimizer);
    if (s) return dsc_error_wrap(s, "step %lld: reducing gradients", (long long)n);
    double t_step = dsc_time_now();
    dsc_optim_stats st;
    DSC_TRY(dsc_optimizer_step(e->o.optimizer, lr, &st));
    double scale;
    bool skipped = dsc_precision_last_step(e->o.optimizer, &scale);
    e->steps_done = n;

    double t1 = dsc_time_now();
    res.phase_s[DSC_PHASE_REDUCE] += t_step - t_reduce;
    res.phase_s[DSC_PHASE_OPTIMIZER] += t1 - t_step;
    if (m) {
        *m = (dsc_step_metrics){
            .step = n,
            .loss = loss,
            .aux_loss = aux,
            .lr = lr,
            .grad_norm = st.grad_norm,
            .tokens_per_s = t1 > t0 ? (double)e->o.global_tokens_per_step / (t1 - t0) : 0.0,
            .elapsed_s = e->t_start > 0 ? t1 - e->t_start : t1 - t0,
            .epoch = dsc_data_loader_epoch(e->o.data, index),
            .step_s = t1 - t0,
            .loss_scale = scale,
            .skipped = skipped,
        };
        memcpy(m->phase_s, res.phase_s, sizeof m->phase_s);
    }
    return NULL;
}

/* flops_profiler: the step runs with every layer call recorded; the logging
 * rank writes the report (DeepSpeed profiles on global rank 0). */
static dsc_status profiled_step(dsc_engine *e, dsc_step_metrics *m) {
    dsc_step_metrics own;
    if (!m) m = &own;
    dsc_layer_profile_begin();
    dsc_status s = run_step(e, m);
    dsc_layer_profile *rows;
    int n;
    dsc_status end = dsc_layer_profile_end(&rows, &n);
    if (s || end) {
        free(rows);
        dsc_status_free(s ? end : NULL);
        return s ? s : end;
    }
    const dsc_config *cfg = e->o.cfg;
    dsc_flops_report r = {
        .step = m->step,
        .rank = dsc_get_rank(),
        .dp_size = e->o.dp ? dsc_comm_size(e->o.dp) : 1,
        .pp_size = e->o.pipe ? dsc_comm_size(e->o.pipe) : 1,
        .samples_per_rank = (int64_t)e->o.micro_batches * cfg->train_micro_batch_size_per_gpu,
        .step_s = m->step_s,
    };
    if (e->o.log) s = dsc_flops_profile_write(&cfg->flops_profiler, &r, rows, n);
    free(rows);
    return s;
}

dsc_status dsc_engine_step(dsc_engine *e, dsc_step_metrics *m) {
    const dsc_config_flops_profiler *fp = &e->o.cfg->flops_profiler;
    if (fp->enabled && e->steps_done == fp->profile_step) return profiled_step(e, m);
    return run_step(e, m);
}

dsc_status dsc_engine_evaluate(dsc_engine *e, double *val_loss) {
    int iters = e->o.cfg->train.eval_iters;
    double sum = 0;
    for (int i = 0; i < iters; i++) {
        dsc_loader_source src;
        dsc_loader_source_init(&src, e->o.data, DSC_DATA_SPLIT_VAL, i, e->o.micro_batches);
        dsc_batch_result res;
        dsc_status s = e->o.runner->ops->eval_batch(e->o.runner, &src.base, &res);
        if (s) return dsc_error_wrap(s, "evaluation batch %d of %d", i + 1, iters);
        double loss = 0, aux = 0; /* as above */
        DSC_TRY(average_loss(e, &res, &loss, &aux));
        sum += loss;
    }
    *val_loss = sum / iters;
    return NULL;
}

/* ---- reporting --------------------------------------------------------------------- */

static void clear_bar(dsc_engine *e) {
    if (!e->bar) return;
    fputs("\r\033[K", stdout);
}

static void draw_bar(dsc_engine *e, const dsc_step_metrics *m) {
    if (!e->bar) return;
    int64_t total = e->o.cfg->train.steps;
    enum { WIDTH = 30 };
    int filled = (int)(WIDTH * m->step / (total > 0 ? total : 1));
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < filled ? '=' : ' ';
    bar[WIDTH] = '\0';
    double eta = m->step > 0 ? m->elapsed_s / (double)m->step * (double)(total - m->step) : 0.0;
    printf("\r[%s] %lld/%lld loss %.4f %.0f tok/s eta %.0fs", bar, (long long)m->step, (long long)total, m->loss,
           m->tokens_per_s, eta);
    fflush(stdout);
}

/* wall_clock_breakdown: this rank's step time per phase, as DeepSpeed prints it. */
static void log_breakdown(dsc_engine *e, const dsc_step_metrics *m) {
    double other = m->step_s;
    printf("step %5lld/%lld | time ms:", (long long)m->step, (long long)e->o.cfg->train.steps);
    for (int p = 0; p < DSC_PHASE_COUNT; p++) {
        printf(" %s %.2f |", dsc_phase_name((dsc_phase)p), 1e3 * m->phase_s[p]);
        other -= m->phase_s[p];
    }
    printf(" other %.2f | step %.2f\n", 1e3 * (other > 0 ? other : 0), 1e3 * m->step_s);
}

static void log_step(dsc_engine *e, const dsc_step_metrics *m) {
    clear_bar(e);
    printf("step %5lld/%lld | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s | %.1fs\n", (long long)m->step,
           (long long)e->o.cfg->train.steps, m->loss, m->lr, m->grad_norm, m->tokens_per_s, m->elapsed_s);
    if (m->skipped)
        printf("step %5lld/%lld | skipped: the gradients overflowed at loss scale %g\n", (long long)m->step,
               (long long)e->o.cfg->train.steps, m->loss_scale);
    if (e->o.cfg->wall_clock_breakdown) log_breakdown(e, m);
    fflush(stdout);
}

static void write_metrics(dsc_engine *e, const dsc_step_metrics *m) {
    if (!e->metrics) return;
    /* this rank's allocator accounting, so sharding (ZeRO) shows in the curve files */
    dsc_mem_stats mem;
    dsc_mem_get_stats(&mem);
    fprintf(e->metrics,
            "{\"step\": %lld, \"loss\": %.9g, \"aux_loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
            "\"tokens_per_s\": %.6g, \"elapsed_s\": %.6g, \"epoch\": %lld, \"mem_bytes\": {\"params\": %lld, "
            "\"grads\": %lld, \"optim\": %lld, \"activations\": %lld, \"comm\": %lld, \"total\": %lld, "
            "\"peak\": %lld}",
            (long long)m->step, m->loss, m->aux_loss, m->lr, m->grad_norm, m->tokens_per_s, m->elapsed_s,
            (long long)m->epoch, (long long)mem.current[DSC_MEM_PARAMS], (long long)mem.current[DSC_MEM_GRADS],
            (long long)mem.current[DSC_MEM_OPTIM], (long long)mem.current[DSC_MEM_ACTIVATIONS],
            (long long)mem.current[DSC_MEM_COMM], (long long)mem.total_current, (long long)mem.total_peak);
    if (m->loss_scale > 0)
        fprintf(e->metrics, ", \"loss_scale\": %.9g, \"skipped\": %s", m->loss_scale,
                m->skipped ? "true" : "false");
    if (e->o.cfg->wall_clock_breakdown) {
        fprintf(e->metrics, ", \"time_ms\": {\"step\": %.6g", 1e3 * m->step_s);
        for (int p = 0; p < DSC_PHASE_COUNT; p++)
            fprintf(e->metrics, ", \"%s\": %.6g", dsc_phase_name((dsc_phase)p), 1e3 * m->phase_s[p]);
        fputc('}', e->metrics);
    }
    fputs("}\n", e->metrics);
    fflush(e->metrics);
}

/* DeepSpeed's monitor events: against the samples seen so far. */
static dsc_status write_monitors(dsc_engine *e, const dsc_step_metrics *m) {
    int64_t samples = m->step * e->o.cfg->train_batch_size;
    DSC_TRY(dsc_monitor_write(e->monitor, "Train/Samples/train_loss", m->loss, samples));
    return dsc_monitor_write(e->monitor, "Train/Samples/lr", m->lr, samples);
}

static dsc_status maybe_evaluate(dsc_engine *e, const dsc_step_metrics *m) {
    int64_t interval = e->o.cfg->train.eval_interval;
    bool last = m->step == e->o.cfg->train.steps;
    if (interval <= 0 || (m->step % interval != 0 && !last)) return NULL;
    double val;
    DSC_TRY(dsc_engine_evaluate(e, &val));
    if (!e->o.log) return NULL;
    clear_bar(e);
    printf("step %5lld/%lld | val loss %.4f\n", (long long)m->step, (long long)e->o.cfg->train.steps, val);
    fflush(stdout);
    if (e->metrics) {
        fprintf(e->metrics, "{\"step\": %lld, \"val_loss\": %.9g}\n", (long long)m->step, val);
        fflush(e->metrics);
    }
    return NULL;
}

dsc_status dsc_engine_train(dsc_engine *e) {
    const dsc_config *cfg = e->o.cfg;
    if (e->o.log && e->o.metrics_path && !e->metrics) {
        /* A resumed run appends to the curve it continues. */
        e->metrics = fopen(e->o.metrics_path, e->steps_done > 0 ? "a" : "w");
        DSC_CHECK(e->metrics, DSC_ERR_IO, "metrics file %s: cannot open for writing", e->o.metrics_path);
    }
    if (e->o.log && !e->monitor) DSC_TRY(dsc_monitor_create(cfg, &e->monitor));
    const dsc_config_comms_logger *cl = &cfg->comms_logger;
    if (cl->enabled)
        dsc_comm_logger_configure(&(dsc_comm_logger_options){cl->enabled, cl->verbose, cl->prof_all, cl->debug});
    e->t_start = dsc_time_now();
    while (e->steps_done < cfg->train.steps && !e->stop) {
        dsc_step_metrics m;
        dsc_status s = dsc_engine_step(e, &m);
        if (s) {
            clear_bar(e);
            return s;
        }
        if (e->o.log) {
            write_metrics(e, &m);
            DSC_TRY(write_monitors(e, &m));
            if (m.step == 1 || m.step % cfg->steps_per_print == 0 || m.step == cfg->train.steps || m.skipped)
                log_step(e, &m);
            draw_bar(e, &m);
        }
        DSC_TRY(maybe_evaluate(e, &m));
        if (e->o.on_step_end) {
            s = e->o.on_step_end(e, &m, e->o.hook_ctx);
            if (s) return dsc_error_wrap(s, "after step %lld", (long long)m.step);
        }
    }
    clear_bar(e);
    if (e->bar) fflush(stdout);
    if (cl->enabled && e->o.log) { /* what deepspeed.comm.log_summary() prints */
        printf("comms_logger: the operations of rank %d in this run\n", dsc_get_rank());
        DSC_TRY(dsc_comm_logger_summary(stdout));
    }
    return NULL;
}
