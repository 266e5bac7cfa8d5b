/* pipe/schedule.c — the dsc_schedule object: argument checks, storage of the
 * step table, accessors, names and the canonical text form.
 *
 * Which instructions go into which step is decided elsewhere
 * (schedule_deepspeed.c, schedule_timeline.c); this file only stores them.
 * It knows nothing of tensors, ranks or MPI. */
#include <string.h>

#include "dsc/memory.h"
#include "pipe/schedule_internal.h"

static const char *const instr_names[DSC_INSTR_TYPE_COUNT] = {
    "LoadMicroBatch", "ForwardPass", "BackwardPass",    "SendActivation", "RecvActivation",
    "SendGrad",       "RecvGrad",    "ReduceTiedGrads", "ReduceGrads",    "OptimizerStep",
};

static const char *const kind_names[DSC_SCHEDULE_KIND_COUNT] = {"train", "infer", "dp", "gpipe", "interleaved"};

const char *dsc_instr_name(dsc_instr_type type) {
    if ((unsigned)type >= DSC_INSTR_TYPE_COUNT) return "UnknownInstruction";
    return instr_names[type];
}

const char *dsc_schedule_kind_name(dsc_schedule_kind kind) {
    if ((unsigned)kind >= DSC_SCHEDULE_KIND_COUNT) return "unknown";
    return kind_names[kind];
}

dsc_status dsc_schedule_kind_from_name(const char *name, dsc_schedule_kind *out) {
    for (int k = 0; k < DSC_SCHEDULE_KIND_COUNT; k++) {
        if (strcmp(name, kind_names[k]) == 0) {
            *out = (dsc_schedule_kind)k;
            return NULL;
        }
    }
    return dsc_error(DSC_ERR_INVALID, "unknown schedule \"%s\" (expected train, infer, dp, gpipe or interleaved)",
                     name);
}

static dsc_status check_args(dsc_schedule_kind kind, int micro_batches, int stages, int stage_id, int chunks) {
    DSC_CHECK((unsigned)kind < DSC_SCHEDULE_KIND_COUNT, DSC_ERR_INVALID, "schedule kind %d is unknown", (int)kind);
    const char *name = kind_names[kind];
    DSC_CHECK(micro_batches >= 1, DSC_ERR_INVALID, "%s schedule: micro_batches must be >= 1, got %d", name,
              micro_batches);
    DSC_CHECK(stages >= 1, DSC_ERR_INVALID, "%s schedule: stages must be >= 1, got %d", name, stages);
    DSC_CHECK(stage_id >= 0 && stage_id < stages, DSC_ERR_INVALID,
              "%s schedule: stage_id %d is out of range for %d stages", name, stage_id, stages);
    /* Steps, slots and instruction counts are ints; keep them far from overflow. */
    DSC_CHECK((long long)micro_batches + stages <= 100000000LL, DSC_ERR_INVALID,
              "%s schedule: M + P = %lld is too large", name, (long long)micro_batches + stages);
    if (kind != DSC_SCHEDULE_INTERLEAVED) {
        DSC_CHECK(chunks == 1, DSC_ERR_INVALID, "%s schedule: chunks must be 1, got %d (only interleaved uses v)",
                  name, chunks);
    } else {
        DSC_CHECK(chunks >= 2, DSC_ERR_INVALID, "interleaved schedule: chunks v must be >= 2, got %d", chunks);
        DSC_CHECK(stages >= 2, DSC_ERR_INVALID, "interleaved schedule: stages must be >= 2, got %d", stages);
        DSC_CHECK(micro_batches % stages == 0, DSC_ERR_INVALID,
                  "interleaved schedule: micro_batches %d must be a multiple of stages %d", micro_batches, stages);
    }
    if (kind == DSC_SCHEDULE_GPIPE || kind == DSC_SCHEDULE_INTERLEAVED)
        DSC_CHECK((long long)micro_batches * stages * chunks <= 50000000LL, DSC_ERR_INVALID,
                  "%s schedule: M*P*v = %lld is too large", name, (long long)micro_batches * stages * chunks);
    return NULL;
}

dsc_status dsc_schedule_create(dsc_schedule_kind kind, int micro_batches, int stages, int stage_id, int chunks,
                               dsc_schedule **out) {
    *out = NULL;
    DSC_TRY(check_args(kind, micro_batches, stages, stage_id, chunks));
    dsc_schedule *s;
    DSC_TRY(dsc_mem_alloc((void **)&s, sizeof *s, DSC_MEM_OTHER, DSC_CPU));
    s->kind = kind;
    s->micro_batches = micro_batches;
    s->stages = stages;
    s->stage_id = stage_id;
    s->chunks = chunks;
    dsc_status st = kind == DSC_SCHEDULE_GPIPE || kind == DSC_SCHEDULE_INTERLEAVED ? dsc_sched_build_timeline(s)
                                                                                   : dsc_sched_build_deepspeed(s);
    if (st) {
        dsc_schedule_destroy(s);
        return dsc_error_wrap(st, "building %s schedule (M=%d, P=%d, S=%d)", kind_names[kind], micro_batches,
                              stages, stage_id);
    }
    DSC_ASSERT(s->steps_closed == s->num_steps);
    *out = s;
    return NULL;
}

void dsc_schedule_destroy(dsc_schedule *s) {
    if (!s) return;
    dsc_mem_free(s->step_start, (size_t)(s->num_steps + 1) * sizeof *s->step_start, DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(s->instrs, (size_t)s->capacity * sizeof *s->instrs, DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(s, sizeof *s, DSC_MEM_OTHER, DSC_CPU);
}

dsc_status dsc_sched_reserve(dsc_schedule *s, int num_steps, int capacity) {
    DSC_TRY(dsc_mem_alloc((void **)&s->step_start, (size_t)(num_steps + 1) * sizeof *s->step_start, DSC_MEM_OTHER,
                          DSC_CPU));
    s->num_steps = num_steps;
    DSC_TRY(dsc_mem_alloc((void **)&s->instrs, (size_t)capacity * sizeof *s->instrs, DSC_MEM_OTHER, DSC_CPU));
    s->capacity = capacity;
    return NULL;
}

void dsc_sched_push(dsc_schedule *s, dsc_instr_type type, int buffer, int micro_batch, int chunk, int peer_stage,
                    int peer_chunk) {
    DSC_ASSERT(s->count < s->capacity && s->steps_closed < s->num_steps);
    s->instrs[s->count++] = (dsc_instr){type, buffer, micro_batch, chunk, peer_stage, peer_chunk};
}

void dsc_sched_push_batch_end(dsc_schedule *s, int tied) {
    if (tied) dsc_sched_push(s, DSC_INSTR_REDUCE_TIED_GRADS, -1, -1, -1, -1, -1);
    dsc_sched_push(s, DSC_INSTR_REDUCE_GRADS, -1, -1, -1, -1, -1);
    dsc_sched_push(s, DSC_INSTR_OPTIMIZER_STEP, -1, -1, -1, -1, -1);
}

void dsc_sched_end_step(dsc_schedule *s) {
    DSC_ASSERT(s->steps_closed < s->num_steps);
    s->step_start[++s->steps_closed] = s->count;
}

dsc_schedule_kind dsc_schedule_get_kind(const dsc_schedule *s) {
    return s->kind;
}
int dsc_schedule_micro_batches(const dsc_schedule *s) {
    return s->micro_batches;
}
int dsc_schedule_stages(const dsc_schedule *s) {
    return s->stages;
}
int dsc_schedule_stage_id(const dsc_schedule *s) {
    return s->stage_id;
}
int dsc_schedule_chunks(const dsc_schedule *s) {
    return s->chunks;
}
int dsc_schedule_num_steps(const dsc_schedule *s) {
    return s->num_steps;
}
int dsc_schedule_num_buffers(const dsc_schedule *s) {
    return s->num_buffers;
}

const dsc_instr *dsc_schedule_step(const dsc_schedule *s, int t, int *count) {
    if (t < 0 || t >= s->num_steps) {
        *count = 0;
        return NULL;
    }
    *count = s->step_start[t + 1] - s->step_start[t];
    return s->instrs + s->step_start[t];
}

dsc_status dsc_schedule_print(const dsc_schedule *s, FILE *out) {
    for (int t = 0; t < s->num_steps; t++) {
        int n;
        const dsc_instr *in = dsc_schedule_step(s, t, &n);
        fprintf(out, "step %d:", t);
        for (int i = 0; i < n; i++) {
            if (in[i].buffer < 0)
                fprintf(out, " %s()", dsc_instr_name(in[i].type));
            else
                fprintf(out, " %s(buf=%d)", dsc_instr_name(in[i].type), in[i].buffer);
        }
        fputc('\n', out);
    }
    DSC_CHECK(!ferror(out), DSC_ERR_IO, "writing %s schedule of stage %d: output error", kind_names[s->kind],
              s->stage_id);
    return NULL;
}
