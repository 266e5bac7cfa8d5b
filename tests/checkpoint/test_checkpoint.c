/* Checkpoints of a parameter store and a sharded optimizer state: exact
#define _POSIX_C_SOURCE 200809L
 * round trips, restore into other layouts (state sharded over 4, 2 and 1
 * ranks), and the bad-checkpoint cases, each with its own error and with the
 * live state left untouched. The optimizer here is a minimal test double
 * that shards one Adam-like moment per parameter over its communicator, as
 * ZeRO does, so resharding is exercised without the real optimizers. */
#define _POSIX_C_SOURCE 200809L
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/checkpoint.h"
#include "dsc/tensor_file.h"
#include "runtime/checkpoint/ckpt_dir.h"
#include "test_mpi.h"

static int world_rank, world_size;
static char save_dir[512];

/* ---- a sharded test optimizer --------------------------------------------------------- */

typedef struct shard_opt {
    dsc_optimizer base;
    dsc_param_store *params;
    float *moment[4]; /* this rank's shard of each parameter's moment */
    int64_t begin[4], count[4];
    int64_t step[1];
} shard_opt;

static int shard_count(const dsc_optimizer *o) {
    return dsc_params_count(((const shard_opt *)o)->params) + 1;
}

static void shard_at(dsc_optimizer *o, int i, dsc_optim_state *out) {
    shard_opt *s = (shard_opt *)o;
    memset(out, 0, sizeof *out);
    if (i == dsc_params_count(s->params)) {
        snprintf(out->name, sizeof out->name, "step");
        int64_t one = 1;
        out->local = dsc_tensor_view(s->step, DSC_DTYPE_I64, 1, &one, DSC_CPU);
        return;
    }
    dsc_param *p = dsc_params_at(s->params, i);
    snprintf(out->name, sizeof out->name, "exp_avg/%s", p->name);
    out->param = p;
    out->offset = s->begin[i];
    out->local = dsc_tensor_view(s->moment[i], DSC_DTYPE_F32, 1, &s->count[i], DSC_CPU);
}

static const dsc_optimizer_ops shard_ops = {
    .name = "test-shard", .state_count = shard_count, .state_at = shard_at};

static const char *names[4] = {"embed.wte.weight", "layers.0.mlp.fc.weight", "layers.0.norm1.bias", "head.weight"};
static const int64_t shapes[4][2] = {{8, 6}, {5, 7}, {3, 1}, {2, 2}};
/* When set, the third parameter is declared (1, 3) instead of (3, 1). */
static int transposed_bias;

static float param_value(int p, int64_t i, float salt) {
    return (float)(p * 100 + i) * 0.25f + salt;
}

/* Parameters and a moment sharded over `comm`, filled from `salt`. */
static void build(MPI_Comm comm, float salt, dsc_param_store **store, shard_opt *opt, int n_params) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    assert_ok(dsc_params_create(store, DSC_CPU, 1));
    for (int p = 0; p < n_params; p++) {
        dsc_param *param;
        int64_t shape[2] = {shapes[p][0], shapes[p][1]};
        if (p == 2 && transposed_bias) shape[0] = 1, shape[1] = 3;
        assert_ok(dsc_params_declare(*store, names[p], 2, shape, 0, DSC_INIT_ZEROS, 0, &param));
    }
    assert_ok(dsc_params_finalize(*store));
    memset(opt, 0, sizeof *opt);
    opt->base.ops = &shard_ops;
    opt->params = *store;
    opt->step[0] = (int64_t)salt;
    for (int p = 0; p < n_params; p++) {
        dsc_param *param = dsc_params_at(*store, p);
        int64_t n = dsc_tensor_numel(&param->value);
        for (int64_t i = 0; i < n; i++)
            ((float *)param->value.data)[i] = param_value(p, i, salt);
        opt->begin[p] = n * rank / size;
        opt->count[p] = n * (rank + 1) / size - opt->begin[p];
        opt->moment[p] = calloc((size_t)opt->count[p] + 1, sizeof(float));
        for (int64_t i = 0; i < opt->count[p]; i++)
            opt->moment[p][i] = -param_value(p, opt->begin[p] + i, salt);
    }
}

static void release(dsc_param_store *store, shard_opt *opt) {
    for (int p = 0; p < 4; p++)
        free(opt->moment[p]);
    dsc_params_destroy(store);
}

static void expect_values(dsc_param_store *store, shard_opt *opt, float salt, int n_params) {
    for (int p = 0; p < n_params; p++) {
        dsc_param *param = dsc_params_at(store, p);
        for (int64_t i = 0; i < dsc_tensor_numel(&param->value); i++)
            assert_true(((float *)param->value.data)[i] == param_value(p, i, salt));
        for (int64_t i = 0; i < opt->count[p]; i++)
            assert_true(opt->moment[p][i] == -param_value(p, opt->begin[p] + i, salt));
    }
    assert_int_equal(opt->step[0], (int64_t)salt);
}

static dsc_checkpoint_state state_of(MPI_Comm comm, dsc_param_store *store, shard_opt *opt, dsc_rng *rngs,
                                     const char *signature) {
    return (dsc_checkpoint_state){.comm = comm,
                                  .params = store,
                                  .optimizer = &opt->base,
                                  .global_step = 7,
                                  .config_json = "{\"seed\": 3}",
                                  .layout_json = "{\"dp\": 4}",
                                  .model_signature = signature,
                                  .engine_json = "{\"lr\": 0.5}",
                                  .rngs = rngs,
                                  .n_rngs = 1};
}

static void fresh_dir(const char *name) {
    snprintf(save_dir, sizeof save_dir, "%s/ckpt_test_np%d_%s", DSC_BINARY_DIR, world_size, name);
    if (world_rank == 0) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", save_dir);
        assert_int_equal(system(cmd), 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Saves salt-1 state sharded over the world as tag global_step7. */
static void save_reference(void) {
    dsc_param_store *store;
    shard_opt opt;
    build(MPI_COMM_WORLD, 1.0f, &store, &opt, 3);
    dsc_rng rng;
    dsc_rng_init(&rng, 5, world_rank, DSC_RNG_DATA);
    dsc_checkpoint_state st = state_of(MPI_COMM_WORLD, store, &opt, &rng, "{\"arch\": \"gpt\"}");
    assert_ok(dsc_checkpoint_save(&st, save_dir, "global_step7", 2));
    assert_err(dsc_checkpoint_save(&st, save_dir, "global_step7", 2), DSC_ERR_IO, "refusing to overwrite");
    release(store, &opt);
}

static void test_round_trip_same_layout(void **state) {
    (void)state;
    fresh_dir("roundtrip");
    save_reference();
    dsc_param_store *store;
    shard_opt opt;
    build(MPI_COMM_WORLD, 9.0f, &store, &opt, 3);
    dsc_rng rng, expected;
    dsc_rng_init(&rng, 77, world_rank, DSC_RNG_DATA);
    dsc_rng_init(&expected, 5, world_rank, DSC_RNG_DATA);
    dsc_checkpoint_state st = state_of(MPI_COMM_WORLD, store, &opt, &rng, "{\"arch\": \"gpt\"}");
    st.global_step = 0;
    char *engine;
    assert_ok(dsc_checkpoint_load(&st, save_dir, "latest", DSC_CHECKPOINT_FULL, &engine));
    expect_values(store, &opt, 1.0f, 3);
    assert_int_equal(st.global_step, 7);
    assert_string_equal(engine, "{\"lr\": 0.5}");
    free(engine);
    assert_true(dsc_rng_u64(&rng) == dsc_rng_u64(&expected));
    release(store, &opt);
}

/* The world saved its state sharded 4 (or 2) ways; ranks now restore it
 * sharded 2 ways (pairs) and unsharded (each rank alone). */
static void test_restore_into_other_layouts(void **state) {
    (void)state;
    fresh_dir("reshard");
    save_reference();
    MPI_Comm pairs;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank / 2, world_rank, &pairs);
    MPI_Comm comms[2] = {pairs, MPI_COMM_SELF};
    for (int c = 0; c < 2; c++) {
        dsc_param_store *store;
        shard_opt opt;
        build(comms[c], 9.0f, &store, &opt, 3);
        dsc_rng rng;
        dsc_rng_init(&rng, 77, 0, DSC_RNG_DATA);
        dsc_checkpoint_state st = state_of(comms[c], store, &opt, &rng, "{\"arch\": \"gpt\"}");
        assert_ok(dsc_checkpoint_load(&st, save_dir, NULL, DSC_CHECKPOINT_FULL, NULL));
        expect_values(store, &opt, 1.0f, 3);
        release(store, &opt);
    }
    MPI_Comm_free(&pairs);
}

/* Loads into a fresh salt-9 job and expects `code`/`needle`, and that
 * nothing live changed. */
static void expect_load_error(const char *signature, int n_params, const char *tag, int code, const char *needle) {
    dsc_param_store *store;
    shard_opt opt;
    build(MPI_COMM_WORLD, 9.0f, &store, &opt, n_params);
    dsc_rng rng;
    dsc_rng_init(&rng, 77, world_rank, DSC_RNG_DATA);
    dsc_checkpoint_state st = state_of(MPI_COMM_WORLD, store, &opt, &rng, signature);
    assert_err(dsc_checkpoint_load(&st, save_dir, tag, DSC_CHECKPOINT_FULL, NULL), code, needle);
    expect_values(store, &opt, 9.0f, n_params);
    release(store, &opt);
}

static void corrupt_file(const char *how) {
    char file[1100];
    snprintf(file, sizeof file, "%s/global_step7/%s", save_dir, DSC_CKPT_FILE);
    if (world_rank == 0) {
        if (strcmp(how, "truncate") == 0) {
            assert_int_equal(truncate(file, 3000), 0);
        } else if (strcmp(how, "garbage") == 0) {
            FILE *f = fopen(file, "wb");
            fputs("garbage", f);
            fclose(f);
        } else { /* flip a byte inside the data of layers.0.mlp.fc.weight: value 100*0.25+1 = 26.0f */
            FILE *f = fopen(file, "r+b");
            float needle = param_value(1, 4, 1.0f);
            float word;
            long at = -1;
            for (long off = 0; at < 0 && fseek(f, off, SEEK_SET) == 0 && fread(&word, 4, 1, f) == 1; off += 4)
                if (word == needle) at = off;
            assert_true(at > 0);
            fseek(f, at + 2, SEEK_SET);
            fputc(0x55, f);
            fclose(f);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void rewrite_attr(const char *name, int64_t value) {
    char file[1100];
    snprintf(file, sizeof file, "%s/global_step7/%s", save_dir, DSC_CKPT_FILE);
    if (world_rank == 0) {
        hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
        hid_t a = H5Aopen(f, name, H5P_DEFAULT);
        assert_true(H5Awrite(a, H5T_NATIVE_INT64, &value) >= 0);
        H5Aclose(a);
        H5Fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void delete_attr(const char *name) {
    char file[1100];
    snprintf(file, sizeof file, "%s/global_step7/%s", save_dir, DSC_CKPT_FILE);
    if (world_rank == 0) {
        hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
        assert_true(H5Adelete(f, name) >= 0);
        H5Fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void write_latest(const char *text) {
    if (world_rank == 0) {
        char file[700];
        snprintf(file, sizeof file, "%s/latest", save_dir);
        FILE *f = fopen(file, "w");
        fputs(text, f);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_bad_checkpoints(void **state) {
    (void)state;
    const char *gpt = "{\"arch\": \"gpt\"}";
    fresh_dir("bad");
    expect_load_error(gpt, 3, "latest", DSC_ERR_IO, "no checkpoint to resume");
    save_reference();
    expect_load_error(gpt, 3, "global_step99", DSC_ERR_IO, "global_step99/state.h5: cannot open: no such file");
    expect_load_error(
        "{\"arch\": \"llama\"}", 3, NULL, DSC_ERR_CORRUPT,
        "checkpoint holds a different model: saved {\"arch\": \"gpt\"}, this job builds {\"arch\": \"llama\"}");
    expect_load_error(gpt, 4, NULL, DSC_ERR_CORRUPT, "state.h5: tensor model/head.weight is missing");
    transposed_bias = 1;
    expect_load_error(gpt, 3, NULL, DSC_ERR_CORRUPT,
                      "tensor model/layers.0.norm1.bias has shape (3, 1) f32, expected (1, 3) f32");
    transposed_bias = 0;
    write_latest("");
    expect_load_error(gpt, 3, NULL, DSC_ERR_CORRUPT, "latest is empty");
    write_latest("global_step7\n");

    rewrite_attr("format_version", 99);
    expect_load_error(gpt, 3, NULL, DSC_ERR_UNSUPPORTED,
                      "checkpoint format version 99 is newer than this dsc supports");
    rewrite_attr("format_version", 0);
    expect_load_error(gpt, 3, NULL, DSC_ERR_CORRUPT, "invalid checkpoint format version 0");
    rewrite_attr("format_version", 1);
    delete_attr("model_signature");
    expect_load_error(gpt, 3, NULL, DSC_ERR_CORRUPT, "attribute model_signature is missing");

    fresh_dir("bad");
    save_reference();
    corrupt_file("flip");
    expect_load_error(gpt, 3, NULL, DSC_ERR_CORRUPT, "tensor model/layers.0.mlp.fc.weight: checksum mismatch");
    fresh_dir("bad");
    save_reference();
    corrupt_file("truncate");
    expect_load_error(gpt, 3, NULL, DSC_ERR_CORRUPT, "state.h5: not an HDF5 file or truncated");
    corrupt_file("garbage");
    expect_load_error(gpt, 3, NULL, DSC_ERR_CORRUPT, "state.h5: not an HDF5 file or truncated");
}

/* Model-only restore reads parameters and leaves optimizer state and step alone. */
static void test_model_only(void **state) {
    (void)state;
    fresh_dir("model_only");
    save_reference();
    dsc_param_store *store;
    shard_opt opt;
    build(MPI_COMM_SELF, 9.0f, &store, &opt, 3);
    dsc_checkpoint_state st = {.comm = MPI_COMM_SELF, .params = store, .model_signature = "{\"arch\": \"gpt\"}"};
    assert_ok(dsc_checkpoint_load(&st, save_dir, NULL, DSC_CHECKPOINT_MODEL_ONLY, NULL));
    for (int64_t i = 0; i < 48; i++)
        assert_true(((float *)dsc_params_at(store, 0)->value.data)[i] == param_value(0, i, 1.0f));
    assert_true(opt.moment[1][0] == -param_value(1, 0, 9.0f));
    assert_int_equal(st.global_step, 0);
    release(store, &opt);
}

int main(void) {
    MPI_Init(NULL, NULL);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_same_layout),
        cmocka_unit_test(test_restore_into_other_layouts),
        cmocka_unit_test(test_bad_checkpoints),
        cmocka_unit_test(test_model_only),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
