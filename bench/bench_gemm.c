/* bench_gemm — GEMM throughput of dsc_kernel_gemm on transformer shapes
 * (GPT-2 small: rows N = B*T = 2048, C = 768, vocab 50257), forward and the
 * two backward products, against the same backend's throughput on a large
 * square problem (2048^3), which stands in for the machine's attainable peak.
 * CPU: measured per thread count (1, 2 by default; --threads a,b,c).
 *
 * Run: build/bench/bench_gemm [cpu|cuda] [--threads 1,2]
 * GFLOP/s = 2*M*N*K / time per call, best of 3 timed batches (the machine is
 * shared). Ratio = shape GFLOP/s / square GFLOP/s. Prints, never asserts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsc/kernels.h"

typedef struct gemm_shape {
    const char *name;
    int64_t m, n, k;
    bool trans_a, trans_b;
} gemm_shape;

/* Linear layers y = x w^T (NT), dx = dy w (NN), dw = dy^T x (TN) at N=2048, C=768. */
static const gemm_shape shapes[] = {
    {"qkv      fwd  2048x2304x768 ", 2048, 2304, 768, false, true},
    {"attnproj fwd  2048x768x768  ", 2048, 768, 768, false, true},
    {"fc       fwd  2048x3072x768 ", 2048, 3072, 768, false, true},
    {"fcproj   fwd  2048x768x3072 ", 2048, 768, 3072, false, true},
    {"fc       dx   2048x768x3072 ", 2048, 768, 3072, false, false},
    {"fc       dw   3072x768x2048 ", 3072, 768, 2048, true, false},
    {"lm head  fwd  2048x50257x768", 2048, 50257, 768, false, true},
};

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_gemm: %s\n", dsc_status_message(s));
    exit(1);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static dsc_tensor matrix(int64_t rows, int64_t cols, dsc_device dev) {
    dsc_tensor t;
    int64_t shape[2] = {rows, cols};
    die(dsc_tensor_alloc(&t, DSC_DTYPE_F32, 2, shape, dev, DSC_MEM_OTHER));
    return t;
}

/* Best GFLOP/s of 3 batches; each batch repeats the call for at least ~0.2 s. */
static double measure(const gemm_shape *s, dsc_device dev) {
    dsc_tensor a = s->trans_a ? matrix(s->k, s->m, dev) : matrix(s->m, s->k, dev);
    dsc_tensor b = s->trans_b ? matrix(s->n, s->k, dev) : matrix(s->k, s->n, dev);
    dsc_tensor out = matrix(s->m, s->n, dev);
    double flops = 2.0 * (double)s->m * (double)s->n * (double)s->k, best = 0;
    die(dsc_kernel_gemm(&out, &a, &b, NULL, s->trans_a, s->trans_b, 1.0f, 0.0f)); /* warm-up */
    die(dsc_device_synchronize(dev));
    for (int trial = 0; trial < 3; trial++) {
        int reps = 0;
        double t0 = now(), t;
        do {
            die(dsc_kernel_gemm(&out, &a, &b, NULL, s->trans_a, s->trans_b, 1.0f, 0.0f));
            reps++;
            die(dsc_device_synchronize(dev));
            t = now() - t0;
        } while (t < 0.2);
        double gflops = flops * reps / t / 1e9;
        if (gflops > best) best = gflops;
    }
    dsc_tensor_free(&a), dsc_tensor_free(&b), dsc_tensor_free(&out);
    return best;
}

static void run(dsc_device dev) {
    const gemm_shape square = {"square       2048x2048x2048", 2048, 2048, 2048, false, false};
    double peak = measure(&square, dev);
    printf("  %-28s %10.1f GFLOP/s  (reference)\n", square.name, peak);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double g = measure(&shapes[i], dev);
        printf("  %-28s %10.1f GFLOP/s  vs %8.1f  ratio %.2f\n", shapes[i].name, g, peak, g / peak);
    }
}

int main(int argc, char **argv) {
    dsc_device dev = DSC_CPU;
    const char *threads = "1,2";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "cuda") == 0)
            dev = (dsc_device){DSC_DEVICE_CUDA, 0};
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = argv[++i];
        else if (strcmp(argv[i], "cpu") != 0) {
            fprintf(stderr, "usage: bench_gemm [cpu|cuda] [--threads 1,2]\n");
            return 2;
        }
    }
    char name[32];
    die(dsc_device_synchronize(dev)); /* fails when the device is not built in or not present */
    printf("bench_gemm on %s: dsc_kernel_gemm vs the same backend's 2048^3 square GEMM\n",
           dsc_device_name(dev, name, sizeof name));
    if (dev.type == DSC_DEVICE_CUDA) {
        run(dev);
        return 0;
    }
    for (const char *p = threads; *p;) {
        int nt = atoi(p);
        dsc_kernels_set_num_threads(nt);
        printf(" threads %d\n", dsc_kernels_get_num_threads());
        run(dev);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    return 0;
}
