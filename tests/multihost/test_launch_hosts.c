/* dsc-launch's multi-host parts without a job: the exact mpirun command for
 * --remote-agent and --net, their option errors, the verdict naming the host
 * (from Open MPI 4.1's reports, captured in test_multihost.sh's runs), and
 * the check that asks every remote host through the agent (with stand-in
 * agents: `true`, `false` and a script that never answers). */
#define _POSIX_C_SOURCE 200809L /* strdup, mkstemp, fdopen */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launcher/launcher.h"
#include "test_mpi.h"

static char hostfile[] = "/tmp/dsc_test_launch_hosts_XXXXXX";

/* Parses argv (NULL-terminated) into options; the caller frees them. */
static dsc_status parse(const char *const *argv, dsc_launch_options *opt) {
    int argc = 0;
    while (argv[argc])
        argc++;
    return dsc_launch_parse_args(argc, (char **)argv, opt);
}

static void test_command(void **state) {
    (void)state;
    const char *argv[] = {"--hostfile", hostfile, "--remote-agent", "agent.sh -q", "--net", "10.77.0.0/24",
                          "-n",         "3",      "prog",           NULL};
    dsc_launch_options opt;
    assert_ok(parse(argv, &opt));
    char *env_vars[] = {"DSC_X=1", NULL};
    dsc_launch_env env = {2, false, env_vars};
    dsc_launch_hosts hosts;
    dsc_launch_command cmd;
    assert_ok(dsc_launch_select_hosts(&opt, &env, &hosts));
    assert_ok(dsc_launch_build_command(&opt, &hosts, &env, &cmd));
    char *line = dsc_launch_command_string(&cmd);
    printf("%s\n", line);
    assert_string_equal(
        line, "mpirun -np 3 --host localhost:1,node-a:1,node-b:2 -x DSC_NUM_THREADS -x DSC_X -x OMP_NUM_THREADS "
              "--mca plm_rsh_agent 'agent.sh -q' --mca btl self,vader,tcp --mca btl_tcp_if_include "
              "10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 prog");
    free(line);
    dsc_launch_command_free(&cmd);
    dsc_launch_hosts_free(&hosts);
    dsc_launch_options_free(&opt);

    const char *no_hosts[] = {"--net", "10.0.0.0/8", "prog", NULL};
    assert_err(parse(no_hosts, &opt), DSC_ERR_INVALID, "--net needs --hostfile");
    const char *no_hosts2[] = {"--remote-agent", "rsh", "prog", NULL};
    assert_err(parse(no_hosts2, &opt), DSC_ERR_INVALID, "--remote-agent needs --hostfile");
}

static void expect_verdict(const char *const *lines, bool name_hosts, const char *want) {
    dsc_launch_failure f;
    dsc_launch_failure_init(&f);
    f.name_hosts = name_hosts;
    for (size_t i = 0; lines[i]; i++)
        dsc_launch_failure_scan(&f, lines[i]);
    char out[1024];
    dsc_launch_failure_describe(&f, out, sizeof out);
    assert_string_equal(out, want);
}

static void test_verdicts(void **state) {
    (void)state;
    const char *killed[] = {
        "mpirun noticed that process rank 2 with PID 16796 on node dscmh1-h1 exited on signal 9 (Killed).", NULL};
    expect_verdict(killed, true, "rank 2 on host dscmh1-h1 killed by signal 9 (Killed)");
    expect_verdict(killed, false, "rank 2 killed by signal 9 (Killed)");
    const char *lost[] = {"ORTE has lost communication with a remote daemon.",
                          "",
                          "  HNP daemon   : [[52512,0],0] on node dscmh1-h0",
                          "  Remote daemon: [[52512,0],1] on node dscmh1-h1",
                          "dsc-train: rank 0: all-reduce on communicator \"world\" (4 ranks) timed out after 5 s",
                          NULL};
    expect_verdict(lost, true,
                   "mpirun lost contact with host dscmh1-h1 (its daemon died or the network to it failed); rank 0 "
                   "reported: all-reduce on communicator \"world\" (4 ranks) timed out after 5 s");
}

static dsc_status check_with(const char *agent, double timeout_s) {
    const char *argv[] = {"--hostfile", hostfile, "--remote-agent", agent, "prog", NULL};
    dsc_launch_options opt;
    dsc_status st = parse(argv, &opt);
    dsc_launch_hosts hosts;
    dsc_launch_env env = {2, false, NULL};
    if (!st) st = dsc_launch_select_hosts(&opt, &env, &hosts);
    if (!st) {
        st = dsc_launch_check_hosts(&opt, &hosts, timeout_s);
        dsc_launch_hosts_free(&hosts);
    }
    dsc_launch_options_free(&opt);
    return st;
}

static void test_host_check(void **state) {
    (void)state;
    assert_true(dsc_launch_host_is_local("localhost"));
    assert_true(dsc_launch_host_is_local("127.0.0.1"));
    char self[256] = "";
    gethostname(self, sizeof self - 1);
    assert_true(dsc_launch_host_is_local(self));
    assert_false(dsc_launch_host_is_local("node-a"));

    assert_ok(check_with("true", 5));
    assert_err(check_with("false", 5), DSC_ERR_IO,
               "host node-a is unreachable: `false node-a true` exited with status 1; host node-b is unreachable: "
               "`false node-b true` exited with status 1");
    char agent[] = "/tmp/dsc_test_agent_XXXXXX";
    int fd = mkstemp(agent);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("#!/bin/sh\necho \"connecting to $1\"\nexec sleep 30\n", f);
    fclose(f);
    assert_int_equal(chmod(agent, 0700), 0);
    char want[256];
    snprintf(want, sizeof want,
             "host node-a is unreachable: `%s node-a true` did not answer within 0.3 s: connecting "
             "to node-a",
             agent);
    assert_err(check_with(agent, 0.3), DSC_ERR_IO, want);
    unlink(agent);
}

int main(void) {
    int fd = mkstemp(hostfile);
    if (fd < 0) return 1;
    FILE *f = fdopen(fd, "w");
    fputs("localhost slots=1\nnode-a slots=1\nnode-b slots=2\n", f);
    fclose(f);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_command),
        cmocka_unit_test(test_verdicts),
        cmocka_unit_test(test_host_check),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(hostfile);
    return rc;
}
