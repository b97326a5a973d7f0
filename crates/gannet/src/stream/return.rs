//! `return VALUE` (nginx's ngx_stream_return_module): the session's answer is the text
//! (with variables), then the connection closes; `$status` 200. For a UDP session the
//! text is one datagram. As in nginx, `return` and `proxy_pass` are both a server's
//! content handler: the last one written in the server is the one used.

use super::variables::Session;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Send the text to a TCP client.
pub async fn tcp<C: AsyncWrite + Unpin>(client: &mut C, text: &str, s: &mut Session) {
    if client.write_all(text.as_bytes()).await.is_ok() {
        s.bytes_sent += text.len() as u64;
        let _ = client.shutdown().await;
    }
}
