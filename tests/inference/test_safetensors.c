/* safetensors: writer/reader round trip over every dsc dtype, a hand-made
 * file read independently of the writer, each corruption the reader must
 * reject (with the file and tensor named), and sharded checkpoints opened
 * through model.safetensors.index.json. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/safetensors.h"
#include "test_mpi.h"

static char dir[256];

static int make_dir(void **state) {
    (void)state;
    strcpy(dir, "/tmp/dsc_safetensors_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static const char *path_of(const char *name) {
    static char buf[4][512];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

/* Writes an 8-byte length (header_len, or strlen(header) when < 0), the header and `data`. */
static void write_raw(const char *path, const char *header, long long header_len, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    uint64_t len = header_len < 0 ? strlen(header) : (uint64_t)header_len;
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(len >> (8 * i));
    fwrite(le, 1, 8, fp);
    fwrite(header, 1, strlen(header), fp);
    if (n) fwrite(data, 1, n, fp);
    fclose(fp);
}

static void test_round_trip(void **state) {
    (void)state;
    float f32[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};
    uint16_t bf16[4], f16[4];
    const float halves[4] = {1.0f, -0.5f, 256.0f, 0.15625f};
    for (int i = 0; i < 4; i++) {
        bf16[i] = dsc_f32_to_bf16(halves[i]);
        f16[i] = dsc_f32_to_f16(halves[i]);
    }
    int32_t i32[3] = {-1, 7, 1 << 20};
    int64_t i64[2] = {-5, 1LL << 40};
    uint8_t u8[5] = {0, 1, 128, 254, 255};
    dsc_tensor t[7] = {
        dsc_tensor_view(f32, DSC_DTYPE_F32, 2, (int64_t[]){2, 3}, DSC_CPU),
        dsc_tensor_view(bf16, DSC_DTYPE_BF16, 1, (int64_t[]){4}, DSC_CPU),
        dsc_tensor_view(f16, DSC_DTYPE_F16, 2, (int64_t[]){2, 2}, DSC_CPU),
        dsc_tensor_view(i32, DSC_DTYPE_I32, 1, (int64_t[]){3}, DSC_CPU),
        dsc_tensor_view(i64, DSC_DTYPE_I64, 1, (int64_t[]){2}, DSC_CPU),
        dsc_tensor_view(u8, DSC_DTYPE_U8, 1, (int64_t[]){5}, DSC_CPU),
        dsc_tensor_view(NULL, DSC_DTYPE_F32, 2, (int64_t[]){0, 3}, DSC_CPU),
    };
    const char *names[7] = {"w.f32", "w.bf16", "w.f16", "w.i32", "w.i64", "w.u8", "empty"};
    const char *meta[4] = {"format", "pt", "step", "12"};
    const char *path = path_of("rt.safetensors");
    assert_ok(dsc_safetensors_write(path, 7, names, t, 2, meta));
    assert_int_equal(access(path_of("rt.safetensors.tmp"), F_OK), -1);

    dsc_safetensors *st;
    assert_ok(dsc_safetensors_open(&st, path));
    assert_int_equal(dsc_safetensors_count(st), 7);
    assert_string_equal(dsc_safetensors_metadata(st, "step"), "12");
    assert_null(dsc_safetensors_metadata(st, "nope"));
    dsc_safetensors_tensor info;
    dsc_safetensors_at(st, 0, &info);
    assert_string_equal(info.name, "empty"); /* sorted by name */
    assert_true(dsc_safetensors_find(st, "w.f32", &info));
    assert_string_equal(info.dtype_name, "F32");
    assert_int_equal(info.ndim, 2);
    assert_int_equal(info.shape[1], 3);
    assert_int_equal(((uintptr_t)info.data - 8) % 8, 0); /* header padded to 8 bytes */
    assert_false(dsc_safetensors_find(st, "missing", &info));

    float out[6];
    assert_ok(dsc_safetensors_read_f32(st, "w.f32", out, 6));
    assert_memory_equal(out, f32, sizeof f32);
    assert_ok(dsc_safetensors_read_f32(st, "w.bf16", out, 4));
    for (int i = 0; i < 4; i++)
        assert_true(out[i] == halves[i]);
    assert_ok(dsc_safetensors_read_f32(st, "w.f16", out, 4));
    for (int i = 0; i < 4; i++)
        assert_true(out[i] == halves[i]);
    assert_ok(dsc_safetensors_read_f32(st, "w.i32", out, 3));
    assert_true(out[0] == -1.0f && out[2] == 1048576.0f);
    assert_ok(dsc_safetensors_read_f32(st, "w.i64", out, 2));
    assert_true(out[0] == -5.0f && out[1] == 1099511627776.0f);
    assert_ok(dsc_safetensors_read_f32(st, "w.u8", out, 5));
    assert_true(out[2] == 128.0f && out[4] == 255.0f);
    assert_ok(dsc_safetensors_read_f32(st, "empty", out, 0));
    assert_err(dsc_safetensors_read_f32(st, "w.f32", out, 5), DSC_ERR_INVALID,
               "w.f32 has 6 elements, destination 5");
    assert_err(dsc_safetensors_read_f32(st, "nope", out, 5), DSC_ERR_INVALID, "no tensor named nope");

    dsc_tensor v;
    assert_ok(dsc_safetensors_view(st, "w.i64", &v));
    assert_int_equal(v.dtype, DSC_DTYPE_I64);
    assert_false(v.owner);
    assert_memory_equal(v.data, i64, sizeof i64);
    dsc_safetensors_close(st);

    const char *dup[2] = {"a", "a"};
    assert_err(dsc_safetensors_write(path, 2, dup, t, 0, NULL), DSC_ERR_INVALID,
               "tensor a: needs a distinct name");
}

/* A file laid out by hand, as the format's documentation describes it. */
static void test_hand_made_file(void **state) {
    (void)state;
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"b\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[8,16]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"c\":{\"dtype\":\"I16\",\"shape\":[],\"data_offsets\":[16,18]}}";
    uint8_t data[18];
    float a[2] = {0.25f, -4.0f};
    double b = 3.5;
    int16_t c = -300;
    memcpy(data, a, 8);
    memcpy(data + 8, &b, 8);
    memcpy(data + 16, &c, 2);
    const char *path = path_of("hand.safetensors");
    write_raw(path, hdr, -1, data, sizeof data);
    dsc_safetensors *st;
    assert_ok(dsc_safetensors_open(&st, path));
    assert_string_equal(dsc_safetensors_metadata(st, "format"), "pt");
    float out[2];
    assert_ok(dsc_safetensors_read_f32(st, "a", out, 2));
    assert_true(out[0] == 0.25f && out[1] == -4.0f);
    assert_ok(dsc_safetensors_read_f32(st, "b", out, 1));
    assert_true(out[0] == 3.5f);
    assert_ok(dsc_safetensors_read_f32(st, "c", out, 1)); /* a scalar: shape [] has one element */
    assert_true(out[0] == -300.0f);
    dsc_tensor v;
    assert_err(dsc_safetensors_view(st, "b", &v), DSC_ERR_UNSUPPORTED, "tensor b has dtype F64, which dsc lacks");
    dsc_safetensors_close(st);
}

typedef struct corrupt_case {
    const char *header;
    long long header_len; /* < 0: the header's length */
    size_t data_bytes;
    int code;
    const char *needle;
} corrupt_case;

static void test_corruptions(void **state) {
    (void)state;
    const corrupt_case cases[] = {
        {"{}", 5000, 0, DSC_ERR_CORRUPT, "header length 5000 is beyond the file size 10"},
        {"{\"a\":", -1, 0, DSC_ERR_CORRUPT, "header is not valid JSON"},
        {"[1,2]", -1, 0, DSC_ERR_CORRUPT, "header is not a JSON object"},
        {"{\"t\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, DSC_ERR_CORRUPT,
         "tensor t: unknown dtype \"F12\""},
        {"{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, DSC_ERR_CORRUPT, "tensor t: missing dtype"},
        {"{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", -1, 4, DSC_ERR_CORRUPT, "tensor t: missing shape"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", -1, 4, DSC_ERR_CORRUPT,
         "tensor t: shape[0] is not a non-negative integer"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", -1, 4, DSC_ERR_CORRUPT,
         "tensor t: data_offsets must be two"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 4, DSC_ERR_CORRUPT,
         "tensor t: data_offsets [0, 8] out of range of the 4 data bytes"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", -1, 4, DSC_ERR_CORRUPT,
         "tensor t: data_offsets [4, 0] out of range"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", -1, 8, DSC_ERR_CORRUPT,
         "tensor t: data_offsets span 8 bytes but shape and dtype F32 need 12"},
        {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         -1, 12, DSC_ERR_CORRUPT, "tensors x [0, 8) and y [4, 12) overlap"},
        {"{\"__metadata__\":{\"k\":1}}", -1, 0, DSC_ERR_CORRUPT, "__metadata__ value of \"k\" is not a string"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", -1, 4,
         DSC_ERR_UNSUPPORTED, "tensor t: 7 dimensions"},
        /* Found by fuzz_safetensors: an object followed by more JSON was read as "{}". */
        {"{}\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}  ", -1, 4, DSC_ERR_CORRUPT,
         "bytes after the header's JSON"},
    };
    const uint8_t zeros[16] = {0};
    const char *path = path_of("bad.safetensors");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_raw(path, cases[i].header, cases[i].header_len, zeros, cases[i].data_bytes);
        dsc_safetensors *st = (dsc_safetensors *)1;
        assert_err(dsc_safetensors_open(&st, path), cases[i].code, cases[i].needle);
        assert_null(st);
    }
    /* Every message names the file. */
    write_raw(path, cases[3].header, -1, zeros, 4);
    dsc_safetensors *st;
    assert_err(dsc_safetensors_open(&st, path), DSC_ERR_CORRUPT, path);
    FILE *fp = fopen(path, "wb");
    fwrite("abc", 1, 3, fp);
    fclose(fp);
    assert_err(dsc_safetensors_open(&st, path), DSC_ERR_CORRUPT, "file of 3 bytes is too short");
    assert_err(dsc_safetensors_open(&st, path_of("none.safetensors")), DSC_ERR_IO, "cannot open");
    /* No tensors, space padding (found by fuzz_safetensors: qsort/bsearch of an empty table is UB). */
    write_raw(path, "{\"__metadata__\":{\"format\":\"pt\"}}    ", -1, zeros, 0);
    assert_ok(dsc_safetensors_open(&st, path));
    assert_int_equal(dsc_safetensors_count(st), 0);
    dsc_safetensors_tensor t;
    assert_false(dsc_safetensors_find(st, "x", &t));
    dsc_safetensors_close(st);
}

static void write_shard(const char *file, const char *n1, const char *n2, float base) {
    float a[3] = {base, base + 1, base + 2}, b[2] = {-base, -base - 1};
    dsc_tensor t[2] = {dsc_tensor_view(a, DSC_DTYPE_F32, 1, (int64_t[]){3}, DSC_CPU),
                       dsc_tensor_view(b, DSC_DTYPE_F32, 1, (int64_t[]){2}, DSC_CPU)};
    const char *names[2] = {n1, n2};
    assert_ok(dsc_safetensors_write(path_of(file), 2, names, t, 0, NULL));
}

static void write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "w");
    fputs(text, fp);
    fclose(fp);
}

static void test_sharded(void **state) {
    (void)state;
    write_shard("model-00001-of-00002.safetensors", "layers.0.w", "embed", 1.0f);
    write_shard("model-00002-of-00002.safetensors", "layers.1.w", "lm_head", 10.0f);
    const char *index = path_of("model.safetensors.index.json");
    write_text(index, "{\"metadata\":{\"total_size\":40},\"weight_map\":{"
                      "\"embed\":\"model-00001-of-00002.safetensors\","
                      "\"layers.0.w\":\"model-00001-of-00002.safetensors\","
                      "\"layers.1.w\":\"model-00002-of-00002.safetensors\","
                      "\"lm_head\":\"model-00002-of-00002.safetensors\"}}");
    const char *opens[2] = {index, dir};
    for (int k = 0; k < 2; k++) {
        dsc_safetensors *st;
        assert_ok(dsc_safetensors_open(&st, opens[k]));
        assert_int_equal(dsc_safetensors_count(st), 4);
        float out[3];
        assert_ok(dsc_safetensors_read_f32(st, "layers.1.w", out, 3));
        assert_true(out[0] == 10.0f && out[2] == 12.0f);
        assert_ok(dsc_safetensors_read_f32(st, "embed", out, 2));
        assert_true(out[1] == -2.0f);
        dsc_safetensors_tensor info;
        assert_true(dsc_safetensors_find(st, "lm_head", &info));
        assert_non_null(strstr(info.file, "model-00002-of-00002.safetensors"));
        dsc_safetensors_close(st);
    }
    dsc_safetensors *st;
    write_text(index, "{\"weight_map\":{\"embed\":\"model-00002-of-00002.safetensors\"}}");
    assert_err(dsc_safetensors_open(&st, index), DSC_ERR_CORRUPT, "weight_map puts tensor embed in");
    write_text(index, "{\"weight_map\":{\"embed\":\"model-00003-of-00002.safetensors\"}}");
    assert_err(dsc_safetensors_open(&st, index), DSC_ERR_IO, "model-00003-of-00002.safetensors: cannot open");
    /* A shard outside the index's directory is refused, not opened. */
    write_text(index, "{\"weight_map\":{\"embed\":\"../model-00001-of-00002.safetensors\"}}");
    assert_err(dsc_safetensors_open(&st, index), DSC_ERR_CORRUPT,
               "shard \"../model-00001-of-00002.safetensors\" of embed is not a file beside the index");
    write_text(index, "{\"weights\":{}}");
    assert_err(dsc_safetensors_open(&st, index), DSC_ERR_CORRUPT, "missing weight_map");
    write_shard("dup.safetensors", "embed", "other", 0.0f);
    write_text(index, "{\"weight_map\":{\"embed\":\"model-00001-of-00002.safetensors\","
                      "\"other\":\"dup.safetensors\"}}");
    assert_err(dsc_safetensors_open(&st, index), DSC_ERR_CORRUPT, "tensor embed appears in both");
    remove(index);
    assert_err(dsc_safetensors_open(&st, dir), DSC_ERR_IO, "has neither model.safetensors.index.json nor");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_hand_made_file),
        cmocka_unit_test(test_corruptions),
        cmocka_unit_test(test_sharded),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
