/* Reads a fixture's JSON array of numbers into floats, asserting its length;
 * shared by the optimizer tests. */
#ifndef DSC_TEST_JSON_FLOATS_H
#define DSC_TEST_JSON_FLOATS_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "test_mpi.h" /* cmocka */

static inline void json_floats(const cJSON *array, float *out, int64_t n) {
    assert_int_equal(cJSON_GetArraySize(array), n);
    int64_t i = 0;
    for (const cJSON *x = array->child; x; x = x->next)
        out[i++] = (float)x->valuedouble;
}

#endif
