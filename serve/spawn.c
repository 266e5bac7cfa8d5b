/* serve_proc: a dsc-serve child process with bounded start, wait and stop. */
#include "serve/spawn.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The "listening on http://HOST:PORT (... pids 1,2)" line: the port and the ranks' pids. */
static bool parse_listening(serve_proc *p, const char *text) {
    const char *at = strstr(text, "listening on http://");
    const char *nl = at ? strchr(at, '\n') : NULL;
    const char *colon = nl ? strchr(at + 20, ':') : NULL;
    if (!colon || colon > nl) return false;
    p->port = atoi(colon + 1);
    const char *pids = strstr(at, "pids ");
    for (const char *q = pids && pids < nl ? pids + 5 : NULL; q && p->n_ranks < SERVE_PROC_MAX_RANKS;) {
        char *end;
        long pid = strtol(q, &end, 10);
        if (end == q) break;
        p->ranks[p->n_ranks++] = (pid_t)pid;
        q = *end == ',' ? end + 1 : NULL;
    }
    return true;
}

dsc_status serve_proc_start(serve_proc *p, const char *app, const char *const *argv, double timeout_s,
                            bool merge_stderr) {
    int fds[2];
    DSC_CHECK(pipe(fds) == 0, DSC_ERR_IO, "pipe: %s", strerror(errno));
    pid_t parent = getpid();
    pid_t pid = fork();
    DSC_CHECK(pid >= 0, DSC_ERR_IO, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        dup2(fds[1], STDOUT_FILENO);
        if (merge_stderr) dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        execv(app, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", app, strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    *p = (serve_proc){.pid = pid, .port = -1, .out_fd = fds[0]};
    char line[4096];
    size_t n = 0;
    double end = now_s() + timeout_s;
    while (!parse_listening(p, line)) {
        double left = end - now_s();
        struct pollfd pfd = {.fd = p->out_fd, .events = POLLIN};
        int r = left > 0 ? poll(&pfd, 1, (int)(left * 1000) + 1) : 0;
        ssize_t got = r > 0 ? read(p->out_fd, line + n, sizeof line - 1 - n) : -1;
        if (got <= 0) {
            int code;
            dsc_status_free(serve_proc_stop(p, 1.0, &code));
            return dsc_error(DSC_ERR_TIMEOUT, "%s did not start listening within %.0f s (exit %d)", app, timeout_s,
                             code);
        }
        n += (size_t)got;
        line[n] = '\0';
        if (n == sizeof line - 1) { /* keep the last line's start */
            char *last = strrchr(line, '\n');
            size_t keep = last ? n - (size_t)(last + 1 - line) : 0;
            memmove(line, line + n - keep, keep);
            n = keep;
            line[n] = '\0';
        }
    }
    return NULL;
}

static int exit_code_of(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -1;
}

dsc_status serve_proc_wait(serve_proc *p, double timeout_s, int *exit_code, char *out, size_t cap) {
    *exit_code = -1;
    size_t n = 0;
    if (cap) out[0] = '\0';
    if (p->pid <= 0) return NULL;
    int status = 0;
    bool exited = false;
    double end = now_s() + timeout_s, eof_by = 0;
    while (p->out_fd >= 0 || !exited) {
        double t = now_s();
        if (t > end || (eof_by > 0 && t > eof_by)) break; /* eof_by: a grandchild that keeps the pipe open */
        if (!exited && waitpid(p->pid, &status, WNOHANG) == p->pid) {
            exited = true;
            eof_by = t + 2.0;
        }
        struct pollfd pfd = {.fd = p->out_fd, .events = POLLIN};
        if (p->out_fd < 0 || poll(&pfd, 1, 20) <= 0) {
            if (p->out_fd < 0) usleep(10000);
            continue;
        }
        char buf[4096];
        ssize_t got = read(p->out_fd, buf, sizeof buf);
        if (got <= 0) {
            close(p->out_fd);
            p->out_fd = -1;
            continue;
        }
        size_t take = cap > n + 1 ? cap - n - 1 : 0;
        if (take > (size_t)got) take = (size_t)got;
        memcpy(out + n, buf, take);
        n += take;
        if (cap) out[n] = '\0';
    }
    if (!exited) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &status, 0);
    }
    if (p->out_fd >= 0) close(p->out_fd);
    p->pid = 0;
    p->out_fd = -1;
    *exit_code = exit_code_of(status);
    DSC_CHECK(exited, DSC_ERR_TIMEOUT, "the server did not exit within %.0f s (killed)", timeout_s);
    return NULL;
}

dsc_status serve_proc_stop(serve_proc *p, double timeout_s, int *exit_code) {
    *exit_code = -1;
    if (p->pid <= 0) return NULL;
    kill(p->pid, SIGTERM);
    int status = 0;
    double end = now_s() + timeout_s;
    pid_t r = 0;
    while ((r = waitpid(p->pid, &status, WNOHANG)) == 0 && now_s() < end)
        usleep(10000);
    bool killed = r == 0;
    if (killed) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &status, 0);
    }
    if (p->out_fd >= 0) close(p->out_fd);
    p->pid = 0;
    p->out_fd = -1;
    *exit_code = exit_code_of(status);
    DSC_CHECK(!killed, DSC_ERR_TIMEOUT, "the server did not exit within %.0f s of SIGTERM (killed)", timeout_s);
    return NULL;
}

long serve_proc_rss_kib(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) kib = strtol(line + 6, NULL, 10);
    fclose(f);
    return kib;
}
