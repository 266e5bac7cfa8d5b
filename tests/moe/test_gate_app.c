/* dsc-moe-gate end to end: runs the binary on every gate fixture and checks
 * that its JSON (k, num_tokens, num_experts, capacity, tokens, dropped,
 * exp_counts, kept_counts, l_aux) matches the fixture's expected routing;
 * also checks that bad input gives a non-zero exit and a message. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "test_gate_fixture.h"
#include "test_mpi.h"

#define GATE_APP DSC_BINARY_DIR "/bin/dsc-moe-gate"

/* Runs `cmd` (stderr merged into stdout) and returns its output; *rc is the exit status. */
static char *run_command(const char *cmd, int *rc) {
    char full[2048];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t len = 0, cap = 1 << 16;
    char *out = malloc(cap);
    size_t got;
    while ((got = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (len + 1 == cap) out = realloc(out, cap *= 2);
    }
    out[len] = '\0';
    int status = pclose(p);
    *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
}

static const cJSON *key(const cJSON *obj, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!v) fail_msg("dsc-moe-gate output has no key \"%s\"", name);
    return v;
}

static void expect_counts(const cJSON *a, const int64_t *want, int64_t n) {
    assert_int_equal(cJSON_GetArraySize(a), n);
    for (int64_t i = 0; i < n; i++)
        assert_int_equal((int64_t)cJSON_GetArrayItem(a, (int)i)->valuedouble, want[i]);
}

static void check_app_on(const char *path) {
    gate_fixture fx;
    assert_ok(gate_fixture_load(path, &fx));
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             GATE_APP " --k %d --capacity-factor %.17g --eval-capacity-factor %.17g --min-capacity %lld%s%s "
                      "--drop-policy %s %s",
             fx.k, fx.cfg.capacity_factor, fx.cfg.eval_capacity_factor, (long long)fx.cfg.min_capacity,
             fx.training ? "" : " --eval", fx.cfg.drop_tokens ? "" : " --no-drop-tokens",
             fx.cfg.drop_policy == DSC_MOE_DROP_POLICY_PROBS ? "probs" : "position", path);
    int rc;
    char *out = run_command(cmd, &rc);
    if (rc != 0) fail_msg("%s exited with %d: %s", cmd, rc, out);
    cJSON *root = cJSON_Parse(out);
    if (!root) fail_msg("%s printed no JSON: %s", cmd, out);
    assert_int_equal(cJSON_GetArraySize(root), 9); /* exactly the documented keys */
    assert_int_equal(key(root, "k")->valueint, fx.k);
    assert_int_equal(key(root, "num_tokens")->valueint, fx.S);
    assert_int_equal(key(root, "num_experts")->valueint, fx.E);
    assert_int_equal(key(root, "capacity")->valueint, fx.capacity);
    const cJSON *tokens = key(root, "tokens"), *dropped = key(root, "dropped");
    assert_int_equal(cJSON_GetArraySize(tokens), fx.S);
    assert_int_equal(cJSON_GetArraySize(dropped), fx.S);
    for (int64_t s = 0; s < fx.S; s++) {
        const cJSON *kept = cJSON_GetArrayItem(tokens, (int)s), *lost = cJSON_GetArrayItem(dropped, (int)s);
        int nk = 0, nl = 0;
        for (int r = 0; r < fx.k; r++) {
            const int64_t i = s * fx.k + r;
            if (fx.slot[i] < 0) {
                assert_int_equal(cJSON_GetArrayItem(lost, nl++)->valueint, fx.expert[i]);
                continue;
            }
            const cJSON *route = cJSON_GetArrayItem(kept, nk++);
            assert_int_equal(cJSON_GetArrayItem(route, 0)->valueint, fx.expert[i]);
            assert_int_equal(cJSON_GetArrayItem(route, 1)->valueint, fx.slot[i]);
            assert_true(fabs(cJSON_GetArrayItem(route, 2)->valuedouble - fx.weight[i]) < 1e-6);
        }
        assert_int_equal(cJSON_GetArraySize(kept), nk);
        assert_int_equal(cJSON_GetArraySize(lost), nl);
    }
    expect_counts(key(root, "exp_counts"), fx.exp_counts, fx.E);
    expect_counts(key(root, "kept_counts"), fx.kept_counts, fx.E);
    assert_true(fabs(key(root, "l_aux")->valuedouble - fx.l_aux) < 1e-6);
    printf("  %-28s dsc-moe-gate output matches\n", fx.name);
    cJSON_Delete(root);
    free(out);
    gate_fixture_free(&fx);
}

static void test_app_matches_fixtures(void **state) {
    (void)state;
    int n;
    char **paths = gate_fixture_paths(&n);
    assert_true(n > 0);
    for (int i = 0; i < n; i++)
        check_app_on(paths[i]);
    gate_fixture_free_paths(paths, n);
}

static void test_app_reports_bad_input(void **state) {
    (void)state;
    int rc;
    char *out = run_command(GATE_APP " --k 2 --capacity-factor 1 --min-capacity 0 /nonexistent/logits.json", &rc);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "/nonexistent/logits.json: cannot open"));
    free(out);
    out = run_command(
        GATE_APP " --k 5 --capacity-factor 1 --min-capacity 0 " GATE_FIXTURE_DIR "/top2_s32_e4_cf1.json", &rc);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "k=5 exceeds the number of experts E=4"));
    free(out);
    out = run_command(GATE_APP " --k 1 --drop-policy sometimes x.json", &rc);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "usage: dsc-moe-gate"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_app_matches_fixtures),
        cmocka_unit_test(test_app_reports_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
