//! nginx directives that mean nothing for gannet (its design makes them unnecessary, or
//! rustls decides what they tune) or that belong to features not built yet. They are
//! accepted so that existing nginx.conf files load, and `gannet -t` prints a notice for
//! each, naming its file:line.

/// (directive, why it has no effect)
pub const IGNORED: &[(&str, &str)] = &[
    ("types_hash_max_size", "gannet's type table needs no sizing"),
    (
        "types_hash_bucket_size",
        "gannet's type table needs no sizing",
    ),
    (
        "server_names_hash_max_size",
        "gannet's name table needs no sizing",
    ),
    (
        "server_names_hash_bucket_size",
        "gannet's name table needs no sizing",
    ),
    (
        "variables_hash_max_size",
        "gannet's variable table needs no sizing",
    ),
    (
        "variables_hash_bucket_size",
        "gannet's variable table needs no sizing",
    ),
    (
        "accept_mutex",
        "each worker has its own SO_REUSEPORT listener",
    ),
    (
        "accept_mutex_delay",
        "each worker has its own SO_REUSEPORT listener",
    ),
    (
        "multi_accept",
        "workers always accept every pending connection",
    ),
    ("use", "gannet picks epoll itself"),
    ("pcre_jit", "gannet JIT-compiles every regex when PCRE2 can"),
    ("load_module", "gannet has no dynamic modules"),
    (
        "lingering_close",
        "gannet closes after the response is flushed",
    ),
    (
        "lingering_time",
        "gannet closes after the response is flushed",
    ),
    (
        "lingering_timeout",
        "gannet closes after the response is flushed",
    ),
    (
        "reset_timedout_connection",
        "timed-out connections are always closed",
    ),
    ("output_buffers", "gannet sizes its output buffers itself"),
    ("postpone_output", "gannet batches output itself"),
    ("sendfile_max_chunk", "gannet sizes sendfile chunks itself"),
    ("read_ahead", "not used"),
    ("aio", "not supported"),
    ("directio", "not supported"),
    ("msie_padding", "not needed by any current browser"),
    (
        "proxy_headers_hash_max_size",
        "gannet's header tables need no sizing",
    ),
    (
        "proxy_headers_hash_bucket_size",
        "gannet's header tables need no sizing",
    ),
    (
        "ssl_dhparam",
        "rustls offers no finite-field DHE suites (ECDHE is always used)",
    ),
    ("ssl_buffer_size", "rustls sizes its TLS records itself"),
    (
        "ssl_session_ticket_key",
        "ticket keys are random and rotated by gannet itself",
    ),
    (
        "ssl_early_data",
        "0-RTT early data is taken over HTTP/3 only (`listen ... quic`)",
    ),
    (
        "http2_push",
        "HTTP/2 server push is obsolete (nginx ignores it too)",
    ),
    (
        "http2_push_preload",
        "HTTP/2 server push is obsolete (nginx ignores it too)",
    ),
    (
        "http2_recv_buffer_size",
        "the h2 codec sizes its buffers itself",
    ),
    ("http2_idle_timeout", "keepalive_timeout applies to HTTP/2"),
    ("http2_max_requests", "keepalive_requests applies to HTTP/2"),
    (
        "http2_recv_timeout",
        "client_header_timeout applies to HTTP/2",
    ),
];

pub fn lookup(name: &str) -> Option<&'static str> {
    IGNORED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, why)| *why)
}
