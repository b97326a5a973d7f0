/*
 * The arena's floor (arena/arena/servers/floor.c) on io_uring instead of epoll, to measure
 * what a batched event loop could take off the kernel's part of a kept request (issue 30's
 * last candidate): the same canned answers, the same one receive and one send a request,
 * but submitted in batches - each send linked to the receive that follows it, one
 * io_uring_enter for every connection the last one made ready (SINGLE_ISSUER and
 * DEFER_TASKRUN: the completions are run in this thread when it enters, not by interrupts).
 * Kept connections only are what it is for; a new connection costs a setsockopt more.
 *
 * usage: floor-uring HOST PORT DOCROOT          (cc -O2 floor-uring.c -luring)
 */
/* The arena's floor, for its canned answers (`load`) and its request reading (`pick`); its
 * epoll loop is there too, unused, under another name. */
#define main floor_epoll_main
#include "../../../../arena/arena/servers/floor.c"
#undef main
#include <liburing.h>
#include <stdint.h>

enum { OP_ACCEPT = 0, OP_RECV = 1, OP_SEND = 2 };

struct ring_conn {
    int fd, inflight, dead, close_after, recv_pending;
    size_t in_len, out_left;
    const char *out;
    char in[IN_SIZE];
};

static struct io_uring ring;

static struct io_uring_sqe *sqe(void) {
    struct io_uring_sqe *s = io_uring_get_sqe(&ring);
    if (!s) {
        io_uring_submit(&ring);
        s = io_uring_get_sqe(&ring);
    }
    return s;
}

static void tag(struct io_uring_sqe *s, struct ring_conn *c, int op) {
    io_uring_sqe_set_data64(s, (uint64_t)(uintptr_t)c | (uint64_t)op);
    c->inflight++;
}

static void post_recv(struct ring_conn *c) {
    struct io_uring_sqe *s = sqe();
    io_uring_prep_recv(s, c->fd, c->in + c->in_len, IN_SIZE - c->in_len, 0);
    tag(s, c, OP_RECV);
    c->recv_pending = 1;
}

/* The send of what is pending; with `then_recv`, the receive of the next request linked
 * behind it (both go in with the same io_uring_enter). */
static void post_send(struct ring_conn *c, int then_recv) {
    struct io_uring_sqe *s = sqe();
    io_uring_prep_send(s, c->fd, c->out, c->out_left, MSG_NOSIGNAL);
    tag(s, c, OP_SEND);
    if (then_recv) {
        s->flags |= IOSQE_IO_LINK;
        post_recv(c);
    }
}

static void drop(struct ring_conn *c) {
    if (!c->dead) { c->dead = 1; close(c->fd); }
    if (c->inflight == 0) free(c);
}

/* Answer the next complete request in the buffer, else wait for more of it. */
static void answer_next(struct ring_conn *c) {
    const char *out = pick(c->in, &c->in_len, &c->out_left, &c->close_after);
    if (!out) {
        if (c->in_len == IN_SIZE) { drop(c); return; }
        if (!c->recv_pending) post_recv(c);
        return;
    }
    c->out = out;
    /* The next request's receive goes in with this send unless one is already in the
     * buffer (pipelined) or the connection closes after it. */
    int more = memmem(c->in, c->in_len, "\r\n\r\n", 4) != NULL;
    post_send(c, !more && !c->close_after && !c->recv_pending);
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: floor-uring HOST PORT DOCROOT\n"); return 2; }
    signal(SIGPIPE, SIG_IGN);
    load(argv[3]);
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[2])) };
    inet_pton(AF_INET, argv[1], &addr.sin_addr);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) || listen(ls, 4096)) { perror("listen"); return 1; }
    struct io_uring_params p = { .flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN };
    int r = io_uring_queue_init_params(4096, &ring, &p);
    if (r < 0) { fprintf(stderr, "io_uring: %s\n", strerror(-r)); return 1; }
    io_uring_prep_multishot_accept(io_uring_get_sqe(&ring), ls, NULL, NULL, 0);
    for (;;) {
        io_uring_submit_and_wait(&ring, 1);
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            seen++;
            uint64_t data = io_uring_cqe_get_data64(cqe);
            int op = (int)(data & 7), res = cqe->res;
            struct ring_conn *c = (struct ring_conn *)(uintptr_t)(data & ~(uint64_t)7);
            if (op == OP_ACCEPT) {
                if (res >= 0) {
                    setsockopt(res, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    c = calloc(1, sizeof *c);
                    c->fd = res;
                    post_recv(c);
                }
                if (!(cqe->flags & IORING_CQE_F_MORE))
                    io_uring_prep_multishot_accept(sqe(), ls, NULL, NULL, 0);
                continue;
            }
            c->inflight--;
            if (c->dead) { drop(c); continue; }
            if (op == OP_RECV) {
                c->recv_pending = 0;
                if (res == -ECANCELED) {   /* its send was short: the send goes on first */
                    continue;
                }
                if (res <= 0) { drop(c); continue; }
                c->in_len += (size_t)res;
                if (!c->out_left) answer_next(c);
                continue;
            }
            /* OP_SEND */
            if (res < 0) { drop(c); continue; }
            c->out += res;
            c->out_left -= (size_t)res;
            if (c->out_left) { post_send(c, 0); continue; }
            if (c->close_after) { drop(c); continue; }
            if (!c->recv_pending) answer_next(c);
        }
        io_uring_cq_advance(&ring, seen);
    }
}
