/*
 * Kept connections only: CONC connections are opened, and once a line comes on stdin each
 * has one request in flight, closed loop (the next one goes when its answer is whole, as
 * wrk does), for as long as the run lasts. "ready" on stdout once every connection has had
 * WARM answers (3 by default: the accepts, tasks and buffers are behind), "done" after REQUESTS
 * more; the load goes on until a second line on stdin, and then every connection closes.
 * measure.sh (KEPT=1) counts between "ready" and "done" with the load running on both
 * sides of the window, so a request costs what it does on a kept connection with CONC of
 * them open, without the accepts and closes that h2load's or wrk's fixed-count runs fold in
 * (1,000 of them in a 100,000-request run at c=1,000); it divides by the server's own count
 * of answers in the window (its `sendto` calls, or callgrind's calls of the answering
 * function), not by REQUESTS. wrk's request ("GET PATH HTTP/1.1", Host only).
 * PATH "@FILE": the paths in FILE (one a line), requested in order, cycling, whichever
 * connection sends the next request (as the arena's wrk_paths.lua).
 * For counting, not for timing.
 *
 * usage: keeper HOST PORT PATH|@FILE CONC REQUESTS [WARM]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

struct c { int fd; size_t got, left; long answers; char in[8192]; };

static char **reqs;
static size_t *req_lens, nreqs, next_req;
static long ok, failed;

/* 1 once the answer is whole, 0 while more is due, -1 when the connection broke. The head is
 * gathered in `in`; a body longer than what came with it is read and dropped in 8 KiB reads
 * (wrk's size), as many as there are, so large files (the 394 KB image) work too. */
static int answered(struct c *c) {
    if (c->left) {
        static char sink[8192];
        ssize_t n;
        do {
            n = recv(c->fd, sink, c->left < sizeof sink ? c->left : sizeof sink, 0);
            if (n < 0 && errno == EAGAIN) return 0;
            if (n <= 0) return -1;
            c->left -= (size_t)n;
        } while (c->left && n == (ssize_t)sizeof sink);
        if (c->left) return 0;
    } else {
        ssize_t n = recv(c->fd, c->in + c->got, sizeof c->in - 1 - c->got, 0);
        if (n < 0 && errno == EAGAIN) return 0;
        if (n <= 0) return -1;
        c->got += (size_t)n;
        c->in[c->got] = 0;
        char *end = strstr(c->in, "\r\n\r\n");
        if (!end) return 0;
        char *cl = strcasestr(c->in, "\r\ncontent-length:");
        size_t want = (size_t)(end + 4 - c->in) + (cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0);
        if (c->got < want) { c->left = want - c->got; return 0; }
    }
    if (strncmp(c->in + 9, "200", 3) == 0) ok++; else failed++;
    c->got = 0;
    return 1;
}

static int put(struct c *c) {
    size_t i = next_req++ % nreqs;
    return send(c->fd, reqs[i], req_lens[i], MSG_NOSIGNAL) == (ssize_t)req_lens[i] ? 0 : -1;
}

static void add_request(const char *path, const char *host, const char *port) {
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "GET %s HTTP/1.1\r\nHost: %s:%s\r\n\r\n", path, host, port);
    if (n < 0 || (size_t)n >= sizeof buf) { fprintf(stderr, "keeper: path too long\n"); exit(2); }
    reqs = realloc(reqs, (nreqs + 1) * sizeof *reqs);
    req_lens = realloc(req_lens, (nreqs + 1) * sizeof *req_lens);
    reqs[nreqs] = strdup(buf);
    req_lens[nreqs++] = (size_t)n;
}

/* The closed loop: every connection has one request in flight; "ready" once each connection
 * has had `warm` answers, "done" after `total` more, and on until a line comes on stdin. */
static void run(int ep, struct c *cs, int conc, long warm, long total) {
    long done = 0, warmed = 0, start = -1;
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL }, evs[1024];
    epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev);
    for (;;) {
        int n = epoll_wait(ep, evs, 1024, 10000);
        if (n <= 0) { fprintf(stderr, "keeper: stalled after %ld answers\n", done); exit(1); }
        for (int i = 0; i < n; i++) {
            struct c *c = evs[i].data.ptr;
            if (!c) return;
            int r = answered(c);
            if (r < 0) { fprintf(stderr, "keeper: a connection broke\n"); exit(1); }
            if (r == 0) continue;
            done++;
            if (++c->answers == warm && ++warmed == conc) { printf("ready\n"); fflush(stdout); ok = failed = 0; start = done; }
            if (start >= 0 && done == start + total) { printf("done %ld ok %ld failed\n", ok, failed); fflush(stdout); }
            if (put(c)) { fprintf(stderr, "keeper: send failed\n"); exit(1); }
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: keeper HOST PORT PATH CONC REQUESTS [WARM]\n"); return 2; }
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[2])) };
    inet_pton(AF_INET, argv[1], &addr.sin_addr);
    int conc = atoi(argv[4]), one = 1;
    long total = atol(argv[5]), warm = argc > 6 ? atol(argv[6]) : 3;
    if (argv[3][0] == '@') {
        FILE *f = fopen(argv[3] + 1, "r");
        if (!f) { perror(argv[3] + 1); return 1; }
        char line[2048];
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\r\n")] = 0;
            if (line[0]) add_request(line, argv[1], argv[2]);
        }
        fclose(f);
        if (!nreqs) { fprintf(stderr, "keeper: no paths in %s\n", argv[3] + 1); return 2; }
    } else {
        add_request(argv[3], argv[1], argv[2]);
    }
    struct c *cs = calloc((size_t)conc, sizeof *cs);
    int ep = epoll_create1(0);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 1;  /* the counters are attached */
    /* Each connection's first request right after its connect: a server listening with
     * `deferred` (TCP_DEFER_ACCEPT) holds a connection with no data in its SYN queue, and
     * a thousand of them overflowed it (the last ones' requests then waited seconds for
     * retransmits). */
    for (int i = 0; i < conc; i++) {
        cs[i].fd = socket(AF_INET, SOCK_STREAM, 0);
        if (cs[i].fd < 0 || connect(cs[i].fd, (struct sockaddr *)&addr, sizeof addr) != 0) { perror("connect"); return 1; }
        setsockopt(cs[i].fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &cs[i] };
        epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev);
        if (put(&cs[i])) { fprintf(stderr, "keeper: send failed\n"); return 1; }
    }
    run(ep, cs, conc, warm, total);
    for (int i = 0; i < conc; i++) close(cs[i].fd);
    return 0;
}
