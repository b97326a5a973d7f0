//! Client connections: the HTTP/1.x connection loop, the ways a body leaves the process
//! (whole, or streamed from a `source`), and the exchange with a FastCGI, SCGI or uwsgi
//! application a request may wait for.

pub mod body;
pub mod gateway;
pub mod h1;
pub mod send;
pub mod source;
pub mod tls_stream;
pub mod transport;
