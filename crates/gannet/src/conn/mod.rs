//! Client connections: the HTTP/1.x connection loop, the ways a body leaves the process,
//! and the exchange with a FastCGI, SCGI or uwsgi application a request may wait for.

pub mod body;
pub mod gateway;
pub mod h1;
pub mod send;
