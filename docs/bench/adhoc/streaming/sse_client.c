/* An SSE client for bench.py's `events` mode: N connections at once to 127.0.0.1:PORT
 * asking for PATH; each event the upstream sends carries its CLOCK_MONOTONIC send time in
 * nanoseconds (`data: SEQ NS`), and the client prints the delay to its arrival, one value
 * in microseconds per line, once every stream has ended. One epoll loop, so the client's
 * own scheduling adds as little as it can to the tail (Python's asyncio added its own).
 *   cc -O2 -o sse_client sse_client.c && ./sse_client PORT PATH N */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define BUF 65536

struct stream {
    int fd;
    size_t len;
    char buf[BUF];
};

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s PORT PATH N\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]), n = atoi(argv[3]);
    const char *path = argv[2];
    struct stream *s = calloc((size_t)n, sizeof *s);
    size_t cap = 1 << 20, count = 0;
    long long *delays = malloc(cap * sizeof *delays);
    int ep = epoll_create1(0);
    if (!s || !delays || ep < 0)
        return 1;
    char req[512];
    int rl = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", path);
    for (int i = 0; i < n; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        s[i].fd = socket(AF_INET, SOCK_STREAM, 0);
        if (s[i].fd < 0 || connect(s[i].fd, (struct sockaddr *)&a, sizeof a) < 0 ||
            write(s[i].fd, req, (size_t)rl) != rl) {
            perror("connect");
            return 1;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (unsigned)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, s[i].fd, &ev);
    }
    int open = n;
    struct epoll_event evs[256];
    while (open > 0) {
        int k = epoll_wait(ep, evs, 256, 30000);
        if (k <= 0) {
            fprintf(stderr, "no progress for 30 s (%d streams open)\n", open);
            return 1;
        }
        for (int j = 0; j < k; j++) {
            struct stream *st = &s[evs[j].data.u32];
            ssize_t got = read(st->fd, st->buf + st->len, BUF - 1 - st->len);
            long long at = now_ns();
            if (got <= 0) {
                if (got < 0 && errno == EINTR)
                    continue;
                close(st->fd);
                open--;
                continue;
            }
            st->len += (size_t)got;
            st->buf[st->len] = 0;
            char *p = st->buf, *end;
            /* Whole events only; the rest waits for the next read. Chunk-size lines and
             * the head are skipped by looking for "data: " only. */
            while ((p = strstr(p, "data: ")) && (end = strstr(p, "\n\n"))) {
                long long seq, sent;
                if (sscanf(p + 6, "%lld %lld", &seq, &sent) == 2) {
                    if (count == cap) {
                        cap *= 2;
                        delays = realloc(delays, cap * sizeof *delays);
                        if (!delays)
                            return 1;
                    }
                    delays[count++] = at - sent;
                }
                p = end + 2;
            }
            size_t keep = p ? st->len - (size_t)(p - st->buf) : 0;
            if (!p) {
                /* No "data: " left: keep a tail that may hold the start of one. */
                keep = st->len < 8 ? st->len : 8;
            }
            memmove(st->buf, st->buf + st->len - keep, keep);
            st->len = keep;
        }
    }
    for (size_t i = 0; i < count; i++)
        printf("%lld\n", delays[i] / 1000);
    return 0;
}
