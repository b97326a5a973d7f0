/*
 * The arena's floor (issue 30): the least an HTTP/1.1 server can do for a static file. One
 * thread, one epoll loop; every regular file of the document root read into memory at start
 * as a complete canned answer (head and body); per kept request one recv and one send (and
 * its share of an epoll_wait), nothing else: epoll's interest changes only for an answer that
 * has to wait for room in the socket. No parsing beyond the request line and "Connection:
 * close", no logging, no dates, no sendfile. What a real server costs above this row is its
 * own code; what this row costs is the kernel's.
 *
 * usage: floor HOST PORT DOCROOT
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FILES 64
#define IN_SIZE 8192

/* Per file two canned answers: for a kept connection and, saying so, for one about to close. */
struct answer { char path[300]; char *bytes[2]; size_t len[2]; };
/* `want_out`: EPOLLOUT is asked for (a send would have blocked); EPOLLIN always is. */
struct conn { int fd; int want_out; size_t in_len; const char *out; size_t out_left; int close_after; char in[IN_SIZE]; };

static struct answer answers[MAX_FILES];
static int n_answers;
static const char *not_found[2] = {
    "HTTP/1.1 404 Not Found\r\nServer: floor\r\nContent-Length: 0\r\n\r\n",
    "HTTP/1.1 404 Not Found\r\nServer: floor\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
};

static void load(const char *root) {
    DIR *dir = opendir(root);
    if (!dir) { perror(root); exit(1); }
    struct dirent *e;
    while ((e = readdir(dir)) && n_answers < MAX_FILES) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        struct answer *a = &answers[n_answers++];
        snprintf(a->path, sizeof a->path, "/%s", e->d_name);
        char *body = malloc((size_t)st.st_size + 1);
        if (fread(body, 1, (size_t)st.st_size, f) != (size_t)st.st_size) { perror(path); exit(1); }
        fclose(f);
        for (int close = 0; close < 2; close++) {
            char head[256];
            int h = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nServer: floor\r\nContent-Length: %lld\r\n%s\r\n",
                             (long long)st.st_size, close ? "Connection: close\r\n" : "");
            a->len[close] = (size_t)h + (size_t)st.st_size;
            a->bytes[close] = malloc(a->len[close]);
            memcpy(a->bytes[close], head, (size_t)h);
            memcpy(a->bytes[close] + h, body, (size_t)st.st_size);
        }
        free(body);
    }
    closedir(dir);
}

static void finish(int ep, struct conn *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c);
}

/* Send what is pending; 1 while the connection lives, 0 once it is closed. */
static int flush(int ep, struct conn *c) {
    while (c->out_left) {
        ssize_t n = send(c->fd, c->out, c->out_left, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN) {
                if (!c->want_out) {
                    struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT, .data.ptr = c };
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                    c->want_out = 1;
                }
                return 1;
            }
            finish(ep, c);
            return 0;
        }
        c->out += n;
        c->out_left -= (size_t)n;
    }
    if (c->close_after) { finish(ep, c); return 0; }
    /* Only an answer that had to wait for room changed what epoll reports: a kept request
     * answered at once costs no epoll_ctl (the floor's first version re-armed EPOLLIN after
     * every answer, a third system call a request: 7-11 % of its capacity). */
    if (c->want_out) {
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        c->want_out = 0;
    }
    return 1;
}

/* The answer to the first complete request in `in` (`*in_len` bytes), taken off the buffer:
 * 0 if none is complete yet. `*close`: the client asked to close after it. */
static const char *pick(char *in, size_t *in_len, size_t *len, int *close) {
    char *end = memmem(in, *in_len, "\r\n\r\n", 4);
    if (!end) return NULL;
    size_t used = (size_t)(end - in) + 4;
    *end = 0;
    *close = strcasestr(in, "\r\nconnection: close") != NULL;
    const char *out = not_found[*close];
    *len = strlen(out);
    char *sp = memchr(in, ' ', used);
    char *sp2 = sp ? memchr(sp + 1, ' ', used - (size_t)(sp + 1 - in)) : NULL;
    if (sp2) {
        size_t plen = (size_t)(sp2 - sp - 1);
        for (int i = 0; i < n_answers; i++)
            if (strlen(answers[i].path) == plen && memcmp(answers[i].path, sp + 1, plen) == 0) {
                out = answers[i].bytes[*close];
                *len = answers[i].len[*close];
            }
    }
    memmove(in, in + used, *in_len - used);
    *in_len -= used;
    return out;
}

/* Answer the complete requests in the buffer, one at a time (pipelined ones wait their turn). */
static void serve(int ep, struct conn *c) {
    while (!c->out_left) {
        const char *out = pick(c->in, &c->in_len, &c->out_left, &c->close_after);
        if (!out) return;
        c->out = out;
        if (!flush(ep, c)) return;
    }
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: floor HOST PORT DOCROOT\n"); return 2; }
    signal(SIGPIPE, SIG_IGN);
    load(argv[3]);
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[2])) };
    inet_pton(AF_INET, argv[1], &addr.sin_addr);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) || listen(ls, 4096)) { perror("listen"); return 1; }
    int ep = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL }, events[256];
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    for (;;) {
        int n = epoll_wait(ep, events, 256, -1);
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    c = calloc(1, sizeof *c);
                    c->fd = fd;
                    struct epoll_event cev = { .events = EPOLLIN, .data.ptr = c };
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                }
                continue;
            }
            if (c->out_left && (events[i].events & EPOLLOUT)) {
                if (!flush(ep, c)) continue;
                serve(ep, c);
                continue;
            }
            ssize_t got = recv(c->fd, c->in + c->in_len, IN_SIZE - c->in_len, 0);
            if (got <= 0) {
                if (got < 0 && errno == EAGAIN) continue;
                finish(ep, c);
                continue;
            }
            c->in_len += (size_t)got;
            if (c->in_len == IN_SIZE && !memmem(c->in, c->in_len, "\r\n\r\n", 4)) { finish(ep, c); continue; }
            serve(ep, c);
        }
    }
}
