/* dsc-launch: starts a dsc job through mpirun and reports which rank failed.
 * Parses the command line, picks hosts, sets the per-rank thread defaults,
 * asks every remote host whether it answers, then prints (--dry-run) or runs
 * the command. Everything with logic lives in
 * the dsc_launcher library beside this file so that tests can reach it. */
#define _POSIX_C_SOURCE 200809L /* setenv, environ */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/cli.h"
#include "launcher/launcher.h"

extern char **environ;

/* How long every remote host has to answer `AGENT HOST true` before the start. */
static const double HOST_CHECK_S = 10.0;

/* The program must exist here; with a hostfile it only has to exist on the
 * hosts (DeepSpeed assumes a shared file system), so it is not checked. */
static dsc_status check_program(const char *program) {
    if (strchr(program, '/')) {
        DSC_CHECK(access(program, X_OK) == 0, DSC_ERR_INVALID, "program %s is not an executable file", program);
        return NULL;
    }
    const char *path = getenv("PATH");
    for (const char *dir = path ? path : ""; *dir;) {
        size_t n = strcspn(dir, ":");
        char full[4096];
        snprintf(full, sizeof full, "%.*s/%s", (int)n, dir, program);
        if (n > 0 && access(full, X_OK) == 0) return NULL;
        dir += n + (dir[n] == ':');
    }
    return dsc_error(DSC_ERR_INVALID, "program %s not found on PATH", program);
}

static int fail(dsc_status st) {
    fprintf(stderr, "dsc-launch: %s\n", dsc_status_message(st));
    dsc_status_free(st);
    return 2;
}

int main(int argc, char **argv) {
    dsc_launch_options opt;
    dsc_status st = dsc_launch_parse_args(argc - 1, argv + 1, &opt);
    if (st) return fail(st);
    if (opt.help || opt.version) {
        if (opt.help)
            fputs(dsc_launch_usage, stdout);
        else
            printf("dsc-launch (dsc %s)\n", dsc_version());
        dsc_launch_options_free(&opt);
        return 0;
    }
    setenv("OMP_NUM_THREADS", "1", 0);
    setenv("DSC_NUM_THREADS", "1", 0);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    dsc_launch_env env = {cores > 0 ? (int)cores : 1, geteuid() == 0, environ};
    dsc_launch_hosts hosts;
    dsc_launch_command cmd = {NULL, 0};
    st = dsc_launch_select_hosts(&opt, &env, &hosts);
    if (!st && !opt.hostfile) st = check_program(opt.program[0]);
    if (!st) st = dsc_launch_build_command(&opt, &hosts, &env, &cmd);
    if (!st && opt.hostfile && !opt.dry_run && !opt.no_host_check)
        st = dsc_launch_check_hosts(&opt, &hosts, HOST_CHECK_S);
    if (st) {
        dsc_launch_hosts_free(&hosts);
        dsc_launch_options_free(&opt);
        return fail(st);
    }
    char *line = dsc_launch_command_string(&cmd);
    int rc = 0;
    if (opt.dry_run) {
        printf("%s\n", line ? line : "");
    } else {
        fprintf(stderr, "dsc-launch: %s\n", line ? line : cmd.argv[0]);
        rc = dsc_launch_run(&cmd, (dsc_launch_timing){.grace_s = 3.0, .kill_s = 2.0, .stop_s = opt.stop_timeout_s},
                            opt.hostfile != NULL);
    }
    free(line);
    dsc_launch_command_free(&cmd);
    dsc_launch_hosts_free(&hosts);
    dsc_launch_options_free(&opt);
    return rc;
}
