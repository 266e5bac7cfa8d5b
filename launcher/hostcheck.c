/* Asking every host before the start: mpirun reaches a host through its
 * remote agent (ssh, or --remote-agent), and when that fails Open MPI prints
 * a long, generic report ("ORTE was unable to reliably start one or more
 * daemons") or, for a host that drops packets, waits for minutes. So the
 * launcher first runs `AGENT HOST true` for every selected remote host, all
 * at once and bounded, and names each host that does not answer with the
 * agent's own words.
 * Not here: building or running the job (command.c, supervise.c). */
#define _POSIX_C_SOURCE 200809L /* kill, clock_gettime, strndup */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launcher/launcher.h"

enum { OUTPUT_MAX = 1024, AGENT_WORDS = 16 };

typedef struct probe {
    const char *host;
    pid_t pid;
    int fd;     /* the agent's stdout and stderr; -1 at EOF */
    int status; /* waitpid status once it ended */
    bool ended;
    char output[OUTPUT_MAX];
    size_t used;
} probe;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

bool dsc_launch_host_is_local(const char *name) {
    char self[256] = "";
    gethostname(self, sizeof self - 1);
    size_t short_len = strcspn(self, ".");
    return strcmp(name, "localhost") == 0 || strncmp(name, "127.", 4) == 0 || strcmp(name, self) == 0 ||
           (strlen(name) == short_len && strncmp(name, self, short_len) == 0);
}

/* Starts `agent... host true` with its output on a pipe, in a process group
 * of its own so that a hung agent can be killed with everything it started. */
static dsc_status start_probe(char *const *agent, int n_agent, probe *p) {
    int out[2];
    DSC_CHECK(pipe(out) == 0, DSC_ERR_IO, "asking host %s: pipe: %s", p->host, strerror(errno));
    p->pid = fork();
    if (p->pid == 0) {
        setpgid(0, 0);
        dup2(out[1], 1);
        dup2(out[1], 2);
        close(out[0]);
        close(out[1]);
        char *argv[AGENT_WORDS + 3];
        for (int i = 0; i < n_agent; i++)
            argv[i] = agent[i];
        argv[n_agent] = (char *)p->host;
        argv[n_agent + 1] = "true";
        argv[n_agent + 2] = NULL;
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(out[1]);
    if (p->pid < 0) {
        close(out[0]);
        return dsc_error(DSC_ERR_IO, "asking host %s: fork: %s", p->host, strerror(errno));
    }
    p->fd = out[0];
    fcntl(p->fd, F_SETFL, fcntl(p->fd, F_GETFL) | O_NONBLOCK);
    return NULL;
}

static void read_output(probe *p) {
    char buf[512];
    ssize_t got;
    while ((got = read(p->fd, buf, sizeof buf)) > 0) {
        size_t keep = (size_t)got < OUTPUT_MAX - 1 - p->used ? (size_t)got : OUTPUT_MAX - 1 - p->used;
        memcpy(p->output + p->used, buf, keep);
        p->used += keep;
        p->output[p->used] = '\0';
    }
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
        close(p->fd);
        p->fd = -1;
    }
}

/* The agent's last non-empty line, the most specific one for ssh and friends. */
static void last_line(const char *text, char *out, size_t len) {
    const char *end = text + strlen(text);
    while (end > text && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' '))
        end--;
    const char *start = end;
    while (start > text && start[-1] != '\n')
        start--;
    snprintf(out, len, "%.*s", (int)(end - start), start);
}

/* Waits for every probe until the deadline; kills the stragglers. */
static void wait_probes(probe *probes, int n, double deadline) {
    for (int running = n; running > 0;) {
        struct pollfd fds[n];
        int nfds = 0;
        for (int i = 0; i < n; i++)
            if (probes[i].fd >= 0) fds[nfds++] = (struct pollfd){probes[i].fd, POLLIN, 0};
        double left = deadline - now_s();
        if (left <= 0) break;
        if (nfds > 0)
            poll(fds, (nfds_t)nfds, left < 0.05 ? (int)(left * 1000) + 1 : 50);
        else
            nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
        running = 0;
        for (int i = 0; i < n; i++) {
            probe *p = &probes[i];
            if (p->fd >= 0) read_output(p);
            if (!p->ended && waitpid(p->pid, &p->status, WNOHANG) == p->pid) p->ended = true;
            running += !p->ended || p->fd >= 0;
        }
    }
    for (int i = 0; i < n; i++) {
        probe *p = &probes[i];
        if (!p->ended) {
            kill(-p->pid, SIGKILL);
            waitpid(p->pid, &p->status, 0);
        }
        if (p->fd >= 0) close(p->fd);
    }
}

/* "host a: why; host b: why" for every failed probe, or NULL. */
static dsc_status verdict(const probe *probes, int n, const char *agent_text, double timeout_s) {
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    DSC_CHECK(out, DSC_ERR_NOMEM, "asking the hosts");
    int failed = 0;
    for (int i = 0; i < n; i++) {
        const probe *p = &probes[i];
        if (p->ended && WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0) continue;
        char line[256];
        last_line(p->output, line, sizeof line);
        fprintf(out, "%shost %s is unreachable: `%s %s true` ", failed++ ? "; " : "", p->host, agent_text,
                p->host);
        if (!p->ended)
            fprintf(out, "did not answer within %g s", timeout_s);
        else if (WIFEXITED(p->status))
            fprintf(out, "exited with status %d", WEXITSTATUS(p->status));
        else
            fprintf(out, "was killed by signal %d", WTERMSIG(p->status));
        if (line[0]) fprintf(out, ": %s", line);
    }
    fclose(out);
    dsc_status st = failed ? dsc_error(DSC_ERR_IO, "%s", text) : NULL;
    free(text);
    return st;
}

dsc_status dsc_launch_check_hosts(const dsc_launch_options *opt, const dsc_launch_hosts *hosts, double timeout_s) {
    const char *agent_text = opt->remote_agent ? opt->remote_agent : "ssh";
    char *words = strdup(agent_text);
    DSC_CHECK(words, DSC_ERR_NOMEM, "asking the hosts");
    char *agent[AGENT_WORDS];
    int n_agent = 0;
    for (char *save = NULL, *w = strtok_r(words, " \t", &save); w; w = strtok_r(NULL, " \t", &save))
        if (n_agent < AGENT_WORDS) agent[n_agent++] = w;
    probe *probes = calloc((size_t)hosts->count, sizeof *probes);
    dsc_status st = NULL;
    if (!probes)
        st = dsc_error(DSC_ERR_NOMEM, "asking the hosts");
    else if (n_agent == 0)
        st = dsc_error(DSC_ERR_INVALID, "--remote-agent is empty");
    int n = 0;
    for (int i = 0; i < hosts->count && !st; i++) {
        if (dsc_launch_host_slots(hosts, i) == 0 || dsc_launch_host_is_local(hosts->host[i].name)) continue;
        probes[n] = (probe){.host = hosts->host[i].name, .fd = -1};
        st = start_probe(agent, n_agent, &probes[n]);
        if (!st) n++;
    }
    wait_probes(probes, n, now_s() + timeout_s);
    if (!st) st = verdict(probes, n, agent_text, timeout_s);
    free(probes);
    free(words);
    return st;
}
