//! After an upstream switched protocols (`101`, a WebSocket most often), the client and the
//! upstream server talk directly: bytes are copied both ways until both sides are done or
//! neither has sent anything for `proxy_read_timeout` (nginx's rule for upgraded
//! connections), so an abandoned tunnel never holds its two sockets forever.
//!
//! One side's end of stream is passed on as a half close (`shutdown(SHUT_WR)`; TLS clients
//! get close_notify) and the other direction goes on, as a TCP relay must for protocols
//! that close one way first.

use super::transport::Transport;
use bytes::BytesMut;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes copied each way.
#[derive(Debug, Default, Clone, Copy)]
pub struct Copied {
    pub to_upstream: u64,
    pub to_client: u64,
}

/// Relay between `client` and `upstream` after sending each the bytes already read from
/// the other (`to_upstream`, `to_client`).
pub async fn relay<C, U>(
    client: &mut C,
    upstream: &mut U,
    to_upstream: &[u8],
    to_client: &[u8],
    idle: Duration,
) -> Copied
where
    C: Transport,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let mut n = Copied::default();
    if !within(idle, send_up(upstream, to_upstream)).await
        || client.write_all(to_client, idle).await.is_err()
    {
        return n;
    }
    n.to_upstream += to_upstream.len() as u64;
    n.to_client += to_client.len() as u64;
    let (mut a, mut b) = (
        BytesMut::with_capacity(16 * 1024),
        BytesMut::with_capacity(16 * 1024),
    );
    let (mut client_open, mut upstream_open) = (true, true);
    while client_open || upstream_open {
        a.clear();
        b.clear();
        let step = tokio::time::timeout(idle, async {
            tokio::select! {
                r = client.read_wait(&mut a), if client_open => (true, r),
                r = upstream.read_buf(&mut b), if upstream_open => (false, r),
            }
        })
        .await;
        let Ok((from_client, r)) = step else {
            break;
        };
        let len = match r {
            Ok(len) => len,
            Err(_) => break,
        };
        // A side that stops reading is as idle as one that stops sending.
        let wrote = match (from_client, len) {
            (true, 0) => {
                client_open = false;
                upstream.shutdown().await.is_ok()
            }
            (false, 0) => {
                upstream_open = false;
                client.shutdown_write();
                true
            }
            (true, _) => {
                n.to_upstream += len as u64;
                within(idle, send_up(upstream, &a)).await
            }
            (false, _) => {
                n.to_client += len as u64;
                client.write_all(&b, idle).await.is_ok()
            }
        };
        if !wrote {
            break;
        }
    }
    n
}

/// Write to the upstream and flush: over TLS, records the socket did not take wait in
/// rustls until a flush.
async fn send_up<U: AsyncWrite + Unpin>(upstream: &mut U, data: &[u8]) -> std::io::Result<()> {
    upstream.write_all(data).await?;
    upstream.flush().await
}

/// Whether a write finished, and in time.
async fn within(idle: Duration, w: impl std::future::Future<Output = std::io::Result<()>>) -> bool {
    matches!(tokio::time::timeout(idle, w).await, Ok(Ok(())))
}
