/* The parallel tensor file: ranks own arbitrary flat ranges of N-d tensors
 * (ZeRO-style slices that cut rows in the middle), write them, and the result
 * read back whole — by dsc and by the HDF5 C API alone — equals the tensor.
 * Also: create never overwrites, describe/expect/list, attributes, errors. */
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/tensor_file.h"
#include "test_mpi.h"

static int rank, size;
static char path[512];

static float value_at(int64_t i) {
    return (float)i * 0.5f - 3.0f;
}

/* Rank r owns [r*n/size, (r+1)*n/size): boundaries fall mid-row for most sizes. */
static void my_range(int64_t n, int64_t *begin, int64_t *count) {
    *begin = n * rank / size;
    *count = n * (rank + 1) / size - *begin;
}

static void write_file(void) {
    if (rank == 0) unlink(path);
    MPI_Barrier(MPI_COMM_WORLD);
    dsc_tfile *f;
    assert_ok(dsc_tfile_create(MPI_COMM_WORLD, path, &f));
    /* Each rank holds a slice of w and a full replica of b; only rank 0 has ids. */
    int64_t n = 3 * 5 * 7, begin, count;
    my_range(n, &begin, &count);
    float *mine = malloc((size_t)(count ? count : 1) * sizeof *mine);
    for (int64_t i = 0; i < count; i++)
        mine[i] = value_at(begin + i);
    int32_t ids[4] = {1, 2, 3, 4};
    float replica[6] = {1, 2, 3, 4, 5, 6};
    dsc_tfile_piece pieces[3] = {
        {{.path = "model/layers.0.w", .dtype = DSC_DTYPE_F32, .ndim = 3, .shape = {3, 5, 7}}, begin, count, mine},
        {{.path = "model/b", .dtype = DSC_DTYPE_F32, .ndim = 2, .shape = {2, 3}}, 0, 6, replica},
        {{.path = "model/only_rank0", .dtype = DSC_DTYPE_I32, .ndim = 1, .shape = {4}}, 0, 4, ids},
    };
    assert_ok(dsc_tfile_write_all(f, pieces, rank == 0 ? 3 : 2));
    free(mine);
    assert_ok(dsc_tfile_set_attr_int(f, "global_step", 42));
    assert_ok(dsc_tfile_set_attr_string(f, "config", "{\"seed\": 1}"));
    assert_ok(dsc_tfile_close(f));
}

static void test_write_read_ranges(void **state) {
    (void)state;
    write_file();
    dsc_tfile *f;
    assert_ok(dsc_tfile_open(MPI_COMM_WORLD, path, &f));
    int64_t shape[] = {3, 5, 7};
    assert_ok(dsc_tfile_expect(f, "model/layers.0.w", DSC_DTYPE_F32, 3, shape));
    int64_t wrong[] = {3, 5, 8};
    assert_err(dsc_tfile_expect(f, "model/layers.0.w", DSC_DTYPE_F32, 3, wrong), DSC_ERR_CORRUPT,
               "tensor model/layers.0.w has shape (3, 5, 7) f32, expected (3, 5, 8) f32");
    assert_err(dsc_tfile_expect(f, "model/nope", DSC_DTYPE_F32, 3, shape), DSC_ERR_CORRUPT,
               "tensor model/nope is missing");
    float all[105];
    assert_ok(dsc_tfile_read_range(f, "model/layers.0.w", 0, 105, all));
    for (int i = 0; i < 105; i++)
        assert_true(all[i] == value_at(i));
    /* An odd range crossing two row boundaries of both inner dimensions. */
    float part[40];
    assert_ok(dsc_tfile_read_range(f, "model/layers.0.w", 33, 40, part));
    for (int i = 0; i < 40; i++)
        assert_true(part[i] == value_at(33 + i));
    assert_err(dsc_tfile_read_range(f, "model/layers.0.w", 100, 6, part), DSC_ERR_INVALID,
               "range [100, 106) outside tensor");
    int64_t step;
    assert_ok(dsc_tfile_get_attr_int(f, "global_step", &step));
    assert_int_equal(step, 42);
    char *cfg;
    assert_ok(dsc_tfile_get_attr_string(f, "config", &cfg));
    assert_string_equal(cfg, "{\"seed\": 1}");
    free(cfg);
    assert_err(dsc_tfile_get_attr_int(f, "nope", &step), DSC_ERR_CORRUPT, "attribute nope is missing");
    assert_ok(dsc_tfile_close(f));
}

static dsc_status count_entry(const dsc_tfile_entry *e, void *user) {
    (void)e;
    (*(int *)user)++;
    return NULL;
}

static void test_list_and_plain_hdf5(void **state) {
    (void)state;
    write_file();
    dsc_tfile *f;
    assert_ok(dsc_tfile_open(MPI_COMM_WORLD, path, &f));
    int n = 0;
    assert_ok(dsc_tfile_list(f, "model", count_entry, &n));
    assert_int_equal(n, 3);
    assert_ok(dsc_tfile_close(f));
    if (rank == 0) {
        /* Serial HDF5 alone, no dsc: the dataset has the global shape and values. */
        hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
        assert_true(file >= 0);
        hid_t d = H5Dopen2(file, "model/layers.0.w", H5P_DEFAULT);
        hid_t space = H5Dget_space(d);
        hsize_t dims[3];
        assert_int_equal(H5Sget_simple_extent_dims(space, dims, NULL), 3);
        assert_int_equal(dims[0], 3);
        assert_int_equal(dims[2], 7);
        float all[105];
        assert_true(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all) >= 0);
        for (int i = 0; i < 105; i++)
            assert_true(all[i] == value_at(i));
        H5Sclose(space);
        H5Dclose(d);
        H5Fclose(file);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_never_overwrites_and_bad_files(void **state) {
    (void)state;
    write_file();
    dsc_tfile *f;
    assert_err(dsc_tfile_create(MPI_COMM_WORLD, path, &f), DSC_ERR_IO, "cannot create the file");
    assert_err(dsc_tfile_open(MPI_COMM_WORLD, "/nonexistent/x.h5", &f), DSC_ERR_IO, "no such file");
    char junk[600];
    snprintf(junk, sizeof junk, "%s.junk", path);
    if (rank == 0) {
        FILE *j = fopen(junk, "wb");
        fputs("this is not hdf5", j);
        fclose(j);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    assert_err(dsc_tfile_open(MPI_COMM_WORLD, junk, &f), DSC_ERR_CORRUPT, "not an HDF5 file");
    /* Conflicting descriptions of one tensor are refused on every rank. */
    if (rank == 0) unlink(junk);
    MPI_Barrier(MPI_COMM_WORLD);
    if (size > 1) {
        assert_ok(dsc_tfile_create(MPI_COMM_WORLD, junk, &f));
        float x[5] = {0};
        dsc_tfile_piece p = {
            {.path = "model/x", .dtype = DSC_DTYPE_F32, .ndim = 1, .shape = {rank == 0 ? 4 : 5}}, 0, 4, x};
        dsc_status s = dsc_tfile_write_all(f, &p, 1);
        assert_non_null(s);
        assert_non_null(strstr(dsc_status_message(s), "described differently by ranks 0 and 1"));
        dsc_status_free(s);
        assert_ok(dsc_tfile_close(f));
        if (rank == 0) unlink(junk);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Finds the byte offset of a float pattern in the file by scanning it. */
static long find_bytes(const char *file, const void *needle, size_t len) {
    FILE *in = fopen(file, "rb");
    fseek(in, 0, SEEK_END);
    long size = ftell(in);
    char *buf = malloc((size_t)size);
    fseek(in, 0, SEEK_SET);
    size_t got = fread(buf, 1, (size_t)size, in);
    fclose(in);
    long at = -1;
    for (long i = 0; at < 0 && i + (long)len <= (long)got; i++)
        if (memcmp(buf + i, needle, len) == 0) at = i;
    free(buf);
    return at;
}

static void test_flipped_bytes_are_detected(void **state) {
    (void)state;
    write_file();
    if (rank == 0) {
        float needle[3] = {value_at(40), value_at(41), value_at(42)};
        long at = find_bytes(path, needle, sizeof needle);
        assert_true(at > 0);
        FILE *io = fopen(path, "r+b");
        fseek(io, at + 5, SEEK_SET);
        int c = fgetc(io);
        fseek(io, at + 5, SEEK_SET);
        fputc(c ^ 0x10, io);
        fclose(io);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    dsc_tfile *f;
    assert_ok(dsc_tfile_open(MPI_COMM_WORLD, path, &f));
    float all[105];
    assert_err(dsc_tfile_read_range(f, "model/layers.0.w", 0, 105, all), DSC_ERR_CORRUPT,
               "tensor model/layers.0.w: checksum mismatch");
    /* A range away from the damaged segment still reads when segments are small. */
    float b[6];
    assert_ok(dsc_tfile_read_range(f, "model/b", 0, 6, b));
    assert_true(b[5] == 6.0f);
    assert_ok(dsc_tfile_close(f));
}

/* Stripping the checksums must not switch their check off: a dataset
 * without dsc_segments is refused on read (issue 12, item 5). */
static void test_missing_checksums_are_refused(void **state) {
    (void)state;
    write_file();
    if (rank == 0) {
        hid_t file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
        hid_t d = H5Dopen2(file, "model/layers.0.w", H5P_DEFAULT);
        assert_true(H5Adelete(d, "dsc_segments") >= 0);
        H5Dclose(d);
        H5Fclose(file);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    dsc_tfile *f;
    assert_ok(dsc_tfile_open(MPI_COMM_WORLD, path, &f));
    dsc_tfile_entry e;
    assert_ok(dsc_tfile_describe(f, "model/layers.0.w", &e));
    float all[105];
    assert_err(dsc_tfile_read_range(f, "model/layers.0.w", 0, 105, all), DSC_ERR_CORRUPT,
               "tensor model/layers.0.w has no dsc_segments checksums");
    float b[6];
    assert_ok(dsc_tfile_read_range(f, "model/b", 0, 6, b));
    assert_ok(dsc_tfile_close(f));
}

/* Every flat range of a 4-d tensor with unit and non-unit dimensions reads
 * back exactly (the hyperslab walk of select_range). */
static void test_every_range_of_a_4d_tensor(void **state) {
    (void)state;
    if (rank == 0) unlink(path);
    MPI_Barrier(MPI_COMM_WORLD);
    enum { N = 2 * 3 * 1 * 4 };
    float values[N];
    for (int i = 0; i < N; i++)
        values[i] = value_at(i);
    dsc_tfile *f;
    assert_ok(dsc_tfile_create(MPI_COMM_WORLD, path, &f));
    dsc_tfile_piece p = {
        {.path = "model/t", .dtype = DSC_DTYPE_F32, .ndim = 4, .shape = {2, 3, 1, 4}}, 0, N, values};
    assert_ok(dsc_tfile_write_all(f, &p, 1));
    assert_ok(dsc_tfile_close(f));
    assert_ok(dsc_tfile_open(MPI_COMM_WORLD, path, &f));
    for (int begin = 0; begin < N; begin++)
        for (int count = 1; begin + count <= N; count++) {
            float got[N];
            assert_ok(dsc_tfile_read_range(f, "model/t", begin, count, got));
            for (int i = 0; i < count; i++)
                assert_true(got[i] == value_at(begin + i));
        }
    assert_ok(dsc_tfile_close(f));
}

int main(void) {
    MPI_Init(NULL, NULL);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    /* One path per rank count, shared by the ranks of this job. */
    snprintf(path, sizeof path, "%s/test_tensor_file_np%d.h5", DSC_BINARY_DIR, size);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_read_ranges),
        cmocka_unit_test(test_list_and_plain_hdf5),
        cmocka_unit_test(test_never_overwrites_and_bad_files),
        cmocka_unit_test(test_flipped_bytes_are_detected),
        cmocka_unit_test(test_missing_checksums_are_refused),
        cmocka_unit_test(test_every_range_of_a_4d_tensor),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
