/* Checkpoint save and restore throughput, beside the raw sequential write and
 * read speed of the same disk measured in the same run.
 *
 *   mpirun -np R build/bench/bench_checkpoint [--mb 512] [--dir DIR]
 *
 * The state is 64 f32 tensors totalling --mb megabytes, each sharded evenly
 * over the R ranks (as ZeRO shards optimizer state), saved through the same
 * path as training checkpoints (partial directory, collective parallel HDF5
 * write with checksums, fsync, rename, latest) and restored with checksum
 * verification. Reads may be served from the page cache; the raw read
 * figure is measured the same way, so the ratio stays fair. Prints, never
 * asserts. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsc/tensor_file.h"
#include "runtime/checkpoint/ckpt_dir.h"

#define TENSORS 64

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_checkpoint: %s\n", dsc_status_message(s));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Rank 0 writes `bytes` with write() + fsync, then reads them back. */
static void raw_disk(const char *dir, size_t bytes, double *write_gbs, double *read_gbs) {
    char path[1024];
    snprintf(path, sizeof path, "%s/raw.bin", dir);
    size_t chunk = 8u << 20;
    char *buf = malloc(chunk);
    memset(buf, 0x5a, chunk);
    double t0 = now();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t done = 0; done < bytes; done += chunk)
        if (write(fd, buf, chunk) != (ssize_t)chunk) die(dsc_error(DSC_ERR_IO, "raw write failed"));
    fsync(fd);
    close(fd);
    *write_gbs = (double)bytes / (now() - t0) / 1e9;
    t0 = now();
    fd = open(path, O_RDONLY);
    for (size_t done = 0; done < bytes; done += chunk)
        if (read(fd, buf, chunk) != (ssize_t)chunk) die(dsc_error(DSC_ERR_IO, "raw read failed"));
    close(fd);
    *read_gbs = (double)bytes / (now() - t0) / 1e9;
    unlink(path);
    free(buf);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long mb = 512;
    const char *dir = "bench-checkpoint";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--mb") == 0) mb = atol(argv[i + 1]);
        if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
    }
    int64_t per_tensor = (int64_t)mb * (1 << 20) / 4 / TENSORS;
    int64_t begin = per_tensor * rank / size, count = per_tensor * (rank + 1) / size - begin;
    float *data = malloc((size_t)count * TENSORS * sizeof *data);
    for (int64_t i = 0; i < count * TENSORS; i++)
        data[i] = (float)(i % 1000) * 1e-3f;
    dsc_tfile_piece pieces[TENSORS];
    for (int t = 0; t < TENSORS; t++) {
        pieces[t] = (dsc_tfile_piece){.begin = begin, .count = count, .data = data + (size_t)t * (size_t)count};
        snprintf(pieces[t].tensor.path, sizeof pieces[t].tensor.path, "optimizer/exp_avg/t%d", t);
        pieces[t].tensor.dtype = DSC_DTYPE_F32;
        pieces[t].tensor.ndim = 2;
        pieces[t].tensor.shape[0] = per_tensor / 1024;
        pieces[t].tensor.shape[1] = 1024;
    }
    per_tensor = per_tensor / 1024 * 1024;
    char tag[64], file[1200];
    snprintf(tag, sizeof tag, "bench_np%d_%d", size, (int)time(NULL));
    if (rank == 0) die(dsc_ckpt_dir_begin(dir, tag));
    MPI_Barrier(MPI_COMM_WORLD);
    char partial[1024];
    dsc_ckpt_partial_dir(dir, tag, partial, sizeof partial);
    snprintf(file, sizeof file, "%s/%s", partial, DSC_CKPT_FILE);

    double t0 = now();
    dsc_tfile *f;
    die(dsc_tfile_create(MPI_COMM_WORLD, file, &f));
    die(dsc_tfile_write_all(f, pieces, TENSORS));
    die(dsc_tfile_close(f));
    if (rank == 0) die(dsc_ckpt_dir_publish(dir, tag));
    MPI_Barrier(MPI_COMM_WORLD);
    double save_s = now() - t0;

    snprintf(file, sizeof file, "%s/%s/%s", dir, tag, DSC_CKPT_FILE);
    t0 = now();
    die(dsc_tfile_open(MPI_COMM_WORLD, file, &f));
    for (int t = 0; t < TENSORS; t++)
        die(dsc_tfile_read_range(f, pieces[t].tensor.path, begin, count, data + (size_t)t * (size_t)count));
    die(dsc_tfile_close(f));
    MPI_Barrier(MPI_COMM_WORLD);
    double load_s = now() - t0;

    if (rank == 0) {
        double bytes = (double)per_tensor * TENSORS * 4;
        double raw_w, raw_r;
        raw_disk(dir, (size_t)bytes, &raw_w, &raw_r);
        printf("checkpoint of %.0f MB on %d rank(s)\n", bytes / 1e6, size);
        printf("  save    %6.3f s  %6.2f GB/s   raw sequential write %6.2f GB/s   ratio %.2f\n", save_s,
               bytes / save_s / 1e9, raw_w, bytes / save_s / 1e9 / raw_w);
        printf("  restore %6.3f s  %6.2f GB/s   raw sequential read  %6.2f GB/s   ratio %.2f\n", load_s,
               bytes / load_s / 1e9, raw_r, bytes / load_s / 1e9 / raw_r);
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s/%s'", dir, tag);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s/%s\n", dir, tag);
    }
    free(data);
    MPI_Finalize();
    return 0;
}
