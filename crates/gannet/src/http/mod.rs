//! The request path: one `Request` type, virtual host and location selection, the phases,
//! and the response with its filters.

pub mod browser;
pub mod cidr;
pub mod compress;
pub mod conditional;
pub mod encoder;
pub mod flow;
pub mod handler;
pub mod regex;
pub mod request;
pub mod response;
pub mod router;
pub mod user_vars;
pub mod variables;
