//! Client connections: the HTTP/1.x connection loop, the ways a body leaves the process
//! (whole, or streamed from a `source`), and the FastCGI exchange a request may wait for.

pub mod body;
pub mod fastcgi;
pub mod h1;
pub mod send;
pub mod source;
