/* An external program built against an installed dsc (tests/install): a
 * 2x3 @ 3x2 GEMM on the CPU checked against the product worked by hand, and
 * a shape error whose message must name the operation. Exits 0 on success. */
#include <stdio.h>
#include <string.h>

#include "dsc/comm.h" /* includes <mpi.h>: the package must carry MPI's flags */
#include "dsc/kernels.h"

int main(void) {
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12}, out[4] = {0};
    const float want[4] = {58, 64, 139, 154};
    int64_t sa[2] = {2, 3}, sb[2] = {3, 2}, so[2] = {2, 2};
    dsc_tensor ta = dsc_tensor_view(a, DSC_DTYPE_F32, 2, sa, DSC_CPU);
    dsc_tensor tb = dsc_tensor_view(b, DSC_DTYPE_F32, 2, sb, DSC_CPU);
    dsc_tensor to = dsc_tensor_view(out, DSC_DTYPE_F32, 2, so, DSC_CPU);
    dsc_status s = dsc_kernel_gemm(&to, &ta, &tb, NULL, false, false, 1.0f, 0.0f);
    if (s) {
        fprintf(stderr, "gemm failed: %s\n", dsc_status_message(s));
        return 1;
    }
    for (int i = 0; i < 4; i++) {
        if (out[i] != want[i]) {
            fprintf(stderr, "out[%d] = %g, expected %g\n", i, out[i], want[i]);
            return 1;
        }
    }
    s = dsc_kernel_gemm(&to, &ta, &ta, NULL, false, false, 1.0f, 0.0f); /* (2,3) @ (2,3): inner sizes differ */
    if (!s || !strstr(dsc_status_message(s), "dsc_kernel_gemm")) {
        fprintf(stderr, "bad shapes: expected an error naming dsc_kernel_gemm, got \"%s\"\n",
                dsc_status_message(s));
        return 1;
    }
    printf("external program: gemm ok, error \"%s\"\n", dsc_status_message(s));
    dsc_status_free(s);
    return 0;
}
