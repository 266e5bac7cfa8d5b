/* dsc-launch without running a job: hostfile parsing and its errors, the
 * --include / --exclude filters, the exact mpirun command built for given
 * options, the command line, and reading Open MPI's and dsc's failure
 * reports (the texts are what Open MPI 4.1 prints, captured from real runs). */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/launcher.h"
#include "test_mpi.h"

static const char *cluster = "# two workers\n"
                             "worker-1 slots=4\n"
                             "\n"
                             "worker-2\tslots=2   # the small one\n";

static void test_hostfile(void **state) {
    (void)state;
    dsc_launch_hosts h;
    assert_ok(dsc_launch_hostfile_parse(cluster, "hosts", &h));
    assert_int_equal(h.count, 2);
    assert_string_equal(h.host[0].name, "worker-1");
    assert_int_equal(h.host[0].slots, 4);
    assert_string_equal(h.host[1].name, "worker-2");
    assert_int_equal(h.host[1].slots, 2);
    assert_int_equal(dsc_launch_hosts_total(&h), 6);
    dsc_launch_hosts_free(&h);
}

static void test_hostfile_errors(void **state) {
    (void)state;
    static const struct {
        const char *text, *message;
    } cases[] = {
        {"worker-1 slots=4\nworker-2 slot=4\n", "hosts:2: expected \"HOSTNAME slots=N\", got \"worker-2 slot=4\""},
        {"worker-1\n", "hosts:1: expected \"HOSTNAME slots=N\", got \"worker-1\""},
        {"worker-1 slots=4 gpus=2\n", "hosts:1: expected \"HOSTNAME slots=N\", got \"worker-1 slots=4 gpus=2\""},
        {"# a\nworker-1 slots=x\n", "hosts:2: slots must be an integer from 1 to 65536, got \"x\""},
        {"worker-1 slots=0\n", "hosts:1: slots must be an integer from 1 to 65536, got \"0\""},
        {"a slots=1\n# again:\na slots=2\n", "hosts:3: host \"a\" is already listed on line 1"},
        {"# nobody\n\n", "hosts: no hosts listed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsc_launch_hosts h;
        assert_err(dsc_launch_hostfile_parse(cases[i].text, "hosts", &h), DSC_ERR_INVALID, cases[i].message);
        assert_int_equal(h.count, 0);
    }
    dsc_launch_hosts h;
    assert_err(dsc_launch_hostfile_load("/nonexistent/hosts", &h), DSC_ERR_IO,
               "hostfile /nonexistent/hosts: No such file or directory");
}

static int slots_after(const char *spec, bool include, int host) {
    dsc_launch_hosts h;
    assert_ok(dsc_launch_hostfile_parse(cluster, "hosts", &h));
    assert_ok(dsc_launch_hosts_filter(&h, spec, include));
    int n = host < 0 ? dsc_launch_hosts_total(&h) : dsc_launch_host_slots(&h, host);
    dsc_launch_hosts_free(&h);
    return n;
}

static void test_include_exclude(void **state) {
    (void)state;
    assert_int_equal(slots_after("worker-1:0,1@worker-2", true, 0), 2);
    assert_int_equal(slots_after("worker-1:0,1@worker-2", true, 1), 2);
    assert_int_equal(slots_after("worker-2", true, 0), 0);
    assert_int_equal(slots_after("worker-1:3", false, 0), 3);
    assert_int_equal(slots_after("worker-1:3", false, 1), 2);
    assert_int_equal(slots_after("worker-1", false, -1), 2);
    static const struct {
        const char *spec;
        bool include;
        const char *message;
    } bad[] = {
        {"worker-9", true, "--include: unknown host \"worker-9\" (hosts: worker-1, worker-2)"},
        {"worker-2:5", false, "--exclude: host worker-2 has 2 slots (0-1), so slot 5 does not exist"},
        {"worker-1:a", true, "--include: bad slot \"a\" for host worker-1"},
        {"worker-1:0,", true, "--include: bad slot \"\" for host worker-1"},
        {"worker-1@", true, "--include: bad entry \"\""},
        {"worker-1:", false, "--exclude: bad entry \"worker-1:\""},
        {"", true, "--include: empty host list"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dsc_launch_hosts h;
        assert_ok(dsc_launch_hostfile_parse(cluster, "hosts", &h));
        assert_err(dsc_launch_hosts_filter(&h, bad[i].spec, bad[i].include), DSC_ERR_INVALID, bad[i].message);
        dsc_launch_hosts_free(&h);
    }
}

/* Parses `args` (blank-separated) and returns the dry-run line, or the error. */
static char *command_for(const char *args, bool root, int cores, char **env_vars, dsc_status *error) {
    char *copy = strdup(args), *argv[32];
    int argc = 0;
    for (char *t = strtok(copy, " "); t && argc < 32; t = strtok(NULL, " "))
        argv[argc++] = t;
    dsc_launch_options opt;
    assert_ok(dsc_launch_parse_args(argc, argv, &opt));
    dsc_launch_env env = {cores, root, env_vars};
    dsc_launch_hosts hosts = {NULL, 0};
    dsc_launch_command cmd = {NULL, 0};
    char *line = NULL;
    *error = dsc_launch_select_hosts(&opt, &env, &hosts);
    if (!*error) *error = dsc_launch_build_command(&opt, &hosts, &env, &cmd);
    if (!*error) line = dsc_launch_command_string(&cmd);
    dsc_launch_command_free(&cmd);
    dsc_launch_hosts_free(&hosts);
    dsc_launch_options_free(&opt);
    free(copy);
    return line;
}

static void expect_command(const char *args, bool root, int cores, const char *want) {
    char *env[] = {"HOME=/root", "DSC_LOG_LEVEL=debug", "DSC_NUM_THREADS=1", "PATH=/bin", "DSC_A=1", NULL};
    dsc_status st;
    char *line = command_for(args, root, cores, env, &st);
    assert_ok(st);
    assert_string_equal(line, want);
    free(line);
}

static void test_mpirun_command(void **state) {
    (void)state;
    FILE *f = fopen("/tmp/dsc_test_launcher_hosts", "w");
    fputs(cluster, f);
    fclose(f);
    const char *env_x = "-x DSC_A -x DSC_LOG_LEVEL -x DSC_NUM_THREADS -x OMP_NUM_THREADS";
    char want[512];
    /* This machine only: oversubscribe only past the core count. */
    snprintf(want, sizeof want, "mpirun -np 4 --allow-run-as-root --oversubscribe %s ./train cfg.json", env_x);
    expect_command("-n 4 ./train cfg.json", true, 2, want);
    snprintf(want, sizeof want, "mpirun -np 2 %s ./train", env_x);
    expect_command("-n 2 ./train", false, 8, want);
    /* A hostfile: slots per host after the filter; -n defaults to all slots. */
    char args[256];
    snprintf(args, sizeof args,
             "-H /tmp/dsc_test_launcher_hosts --include worker-1:0,1@worker-2 --mpi-args "
             "--mca --mpi-args btl --mpi-args self,vader ./train --set a=b");
    {
        /* An argument with a blank and a quote needs shell quoting when printed. */
        dsc_launch_command cmd = {NULL, 0};
        char *argv[] = {"mpirun", "-x", "it's", NULL};
        cmd.argv = argv;
        cmd.argc = 3;
        char *line = dsc_launch_command_string(&cmd);
        assert_string_equal(line, "mpirun -x 'it'\\''s'");
        free(line);
    }
    snprintf(want, sizeof want,
             "mpirun -np 4 --host worker-1:2,worker-2:2 %s --mca btl self,vader ./train --set a=b", env_x);
    expect_command(args, false, 2, want);
    snprintf(want, sizeof want, "mpirun -np 5 --host worker-1:3,worker-2:2 %s ./train", env_x);
    expect_command("--hostfile /tmp/dsc_test_launcher_hosts --exclude worker-1:0 ./train", false, 2, want);
    snprintf(want, sizeof want, "mpirun -np 8 --oversubscribe --host worker-1:4,worker-2:2 %s ./train", env_x);
    expect_command("-n 8 --oversubscribe --hostfile /tmp/dsc_test_launcher_hosts ./train", false, 2, want);

    char *env[] = {NULL};
    dsc_status st;
    assert_null(command_for("-n 8 --hostfile /tmp/dsc_test_launcher_hosts ./train", false, 2, env, &st));
    assert_err(
        st, DSC_ERR_INVALID,
        "-n 8 exceeds the 6 slots of hostfile /tmp/dsc_test_launcher_hosts; pass --oversubscribe to run more "
        "ranks than slots");
    assert_null(
        command_for("-n 3 --hostfile /tmp/dsc_test_launcher_hosts -i worker-2 ./train", false, 2, env, &st));
    assert_err(st, DSC_ERR_INVALID,
               "-n 3 exceeds the 2 slots of hostfile /tmp/dsc_test_launcher_hosts (after --include/--exclude)");
    assert_null(
        command_for("--hostfile /tmp/dsc_test_launcher_hosts -e worker-1@worker-2 ./train", false, 2, env, &st));
    assert_err(st, DSC_ERR_INVALID, "--exclude leaves no slots to run on");
    remove("/tmp/dsc_test_launcher_hosts");
}

static void test_command_line(void **state) {
    (void)state;
    char *ok[] = {"-n", "4", "--hostfile=h", "--mpi-args", " --mca  btl self ", "--", "./prog", "-n", "2"};
    dsc_launch_options opt;
    assert_ok(dsc_launch_parse_args(9, ok, &opt));
    assert_int_equal(opt.np, 4);
    assert_string_equal(opt.hostfile, "h");
    assert_int_equal(opt.n_mpi_args, 3);
    assert_string_equal(opt.mpi_args[2], "self");
    assert_int_equal(opt.n_program, 3); /* the program's own options stay its own */
    assert_string_equal(opt.program[1], "-n");
    dsc_launch_options_free(&opt);

    static const struct {
        int argc;
        char *argv[4];
        const char *message;
    } bad[] = {
        {2, {"--frobnicate", "./p"}, "unknown option \"--frobnicate\" (see dsc-launch --help)"},
        {1, {"-n"}, "option -n needs a value"},
        {3, {"-n", "0", "./p"}, "-n needs a positive number of ranks, got \"0\""},
        {3, {"-n", "4x", "./p"}, "-n needs a positive number of ranks, got \"4x\""},
        {2, {"-n", "4"}, "missing PROGRAM to run (see dsc-launch --help)"},
        {3, {"--include=a", "--exclude=b", "./p"}, "--include and --exclude cannot be combined"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_err(dsc_launch_parse_args(bad[i].argc, (char **)bad[i].argv, &opt), DSC_ERR_INVALID,
                   bad[i].message);
}

static void expect_verdict(const char *const *lines, const char *want) {
    dsc_launch_failure f;
    dsc_launch_failure_init(&f);
    bool failed = false;
    for (size_t i = 0; lines[i]; i++)
        failed |= dsc_launch_failure_scan(&f, lines[i]);
    char out[1024];
    dsc_launch_failure_describe(&f, out, sizeof out);
    assert_string_equal(out, want);
    assert_int_equal(failed, want[0] != '\0');
}

static void test_failure_reports(void **state) {
    (void)state;
    const char *exit_status[] = {
        "rank 0 of 4",
        "dsc: rank 2 failed: simulated error in allreduce 50",
        "--------------------------------------------------------------------------",
        "Primary job  terminated normally, but 1 process returned",
        "a non-zero exit code. Per user-direction, the job has been aborted.",
        "mpirun detected that one or more processes exited with non-zero status, thus causing",
        "the job to be terminated. The first process to do so was:",
        "",
        "  Process name: [[27645,1],2]",
        "  Exit code:    3",
        NULL};
    expect_verdict(exit_status, "rank 2 exited with status 3: simulated error in allreduce 50");
    const char *killed[] = {
        "Primary job  terminated normally, but 1 process returned",
        "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).",
        "[1,2]<stderr>:dsc: rank 2 failed: peer 1 did not answer within 300 s",
        "mpirun noticed that process rank 3 with PID 0 on node vm exited on signal 15 (Terminated).", NULL};
    expect_verdict(killed,
                   "rank 1 killed by signal 9 (Killed); rank 2 reported: peer 1 did not answer within 300 s");
    const char *aborted[] = {"MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD", "with errorcode 7.",
                             NULL};
    expect_verdict(aborted, "rank 1 called MPI_Abort with error code 7");
    const char *improper[] = {"mpirun has exited due to process rank 1 with PID 0 on",
                              "node vm exiting improperly. There are three reasons this could occur:", NULL};
    expect_verdict(improper, "rank 1 exited without calling MPI_Finalize");
    const char *note_only[] = {"step 10 loss 3.2",
                               "dsc: rank 3 failed: config.json: \"moe.k\" must be >= 1, got 0", NULL};
    expect_verdict(note_only, "rank 3 failed: config.json: \"moe.k\" must be >= 1, got 0");
    const char *app_error[] = {"dsc-train: rank 2: comm: all-reduce on world: peer 0 did not answer within 30 s",
                               "MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD",
                               "with errorcode 1.", NULL};
    expect_verdict(app_error,
                   "rank 2 called MPI_Abort with error code 1: comm: all-reduce on world: peer 0 did not answer "
                   "within 30 s");
    const char *tagged[] = {"[1,3]<stderr>:dsc-train: rank 3: data.bin: No such file or directory", NULL};
    expect_verdict(tagged, "rank 3 failed: data.bin: No such file or directory");
    const char *clean[] = {"rank 0 of 4",
                           "Exit code: 3 is what the program printed",
                           "dsc: rank 2 is fine",
                           "dsc-train: sample: rank 0: the prompt is empty",
                           "libdsc-x: rank 1: not a dsc program's line",
                           NULL};
    expect_verdict(clean, "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostfile),        cmocka_unit_test(test_hostfile_errors),
        cmocka_unit_test(test_include_exclude), cmocka_unit_test(test_mpirun_command),
        cmocka_unit_test(test_command_line),    cmocka_unit_test(test_failure_reports),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
