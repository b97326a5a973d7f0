/*
 * A new connection per request, a fixed number of them (wrk's "Connection: close" runs are
 * timed, not counted): CONC connections at a time, each connect, one HTTP/1.1 request with
 * "Connection: close", read the answer to the end of its Content-Length, close - the order
 * wrk keeps (it closes as soon as the answer is whole, whether the server's FIN came yet or
 * not). For counting a server's system calls and instructions per connection
 * (measure.sh ... close), not for timing.
 *
 * usage: closer HOST PORT PATH REQUESTS [CONC]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* The head is kept in `in`; a body past it is read into a scratch buffer and only counted
   (`want` is the answer's whole length once the head is in), so large files work too. */
struct c { int fd; size_t got, want; char in[4096]; };
static char scratch[1 << 16];

static struct sockaddr_in addr;
static char req[512];
static size_t req_len;
static long ok, failed;

static int start(int ep, struct c *c) {
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    c->got = 0;
    c->want = 0;
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&addr, sizeof addr) != 0) return -1;
    if (send(c->fd, req, req_len, MSG_NOSIGNAL) != (ssize_t)req_len) return -1;
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
    return epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
}

/* 1 once the answer is whole (or broke), 0 while more is due. */
static int done(struct c *c) {
    if (c->want) {
        ssize_t n = recv(c->fd, scratch, sizeof scratch, 0);
        if (n <= 0) { failed++; return 1; }
        c->got += (size_t)n;
        return c->got >= c->want;
    }
    ssize_t n = recv(c->fd, c->in + c->got, sizeof c->in - 1 - c->got, 0);
    if (n <= 0) { failed++; return 1; }
    c->got += (size_t)n;
    c->in[c->got] = 0;
    char *end = strstr(c->in, "\r\n\r\n");
    if (!end) return 0;
    char *cl = strcasestr(c->in, "\r\ncontent-length:");
    size_t want = (size_t)(end + 4 - c->in) + (cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0);
    if (strncmp(c->in + 9, "200", 3) == 0) ok++; else failed++;
    if (c->got >= want) return 1;
    c->want = want;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: closer HOST PORT PATH REQUESTS [CONC]\n"); return 2; }
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)atoi(argv[2]));
    inet_pton(AF_INET, argv[1], &addr.sin_addr);
    long total = atol(argv[4]), started = 0;
    int conc = argc > 5 ? atoi(argv[5]) : 10;
    req_len = (size_t)snprintf(req, sizeof req,
        "GET %s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n\r\n", argv[3], argv[1], argv[2]);
    int ep = epoll_create1(0);
    struct c *cs = calloc((size_t)conc, sizeof *cs);
    int live = 0;
    for (int i = 0; i < conc && started < total; i++, started++, live++)
        if (start(ep, &cs[i]) != 0) { perror("connect"); return 1; }
    struct epoll_event evs[64];
    while (live > 0) {
        int n = epoll_wait(ep, evs, 64, 5000);
        if (n <= 0) { fprintf(stderr, "stalled\n"); break; }
        for (int i = 0; i < n; i++) {
            struct c *c = evs[i].data.ptr;
            if (!done(c)) continue;
            close(c->fd);
            live--;
            if (started < total) {
                started++;
                if (start(ep, c) != 0) { perror("connect"); return 1; }
                live++;
            }
        }
    }
    printf("requests: %ld ok, %ld failed\n", ok, failed);
    return failed != 0;
}
