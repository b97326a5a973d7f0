//! Client connections: the HTTP/1.x connection loop and the ways a body leaves the process.

pub mod body;
pub mod h1;
pub mod send;
