//! What the request phases decide ([`Flow`], one phase handler's answer, as nginx's
//! NGX_DECLINED / NGX_OK / status codes) and where they got to ([`Handled`], what the
//! connection acts on: `conn::exchange`). Modules return a `Flow` without depending on the
//! phases themselves (`http::handler`).

use crate::http::response::Response;
use crate::modules::auth_request::Subrequest;
use crate::modules::{limit_conn, limit_req};
use gannet_proto::cgi::HeaderValue;
use std::borrow::Cow;
use std::time::Duration;

/// What a phase handler decided.
pub enum Flow {
    /// Not mine: let the next handler try (NGX_DECLINED).
    Next,
    /// The answer.
    Done(Response),
    /// Answer with this status (through `error_page` if one is set for it).
    Status(u16),
    /// An application's 401 taken over by `error_page` (`*_intercept_errors`): its
    /// WWW-Authenticate values go out with the page, as nginx copies them. (Boxed: rare,
    /// and every `Flow` would carry its size.)
    Intercepted(Box<(u16, Vec<String>)>),
    /// A redirect nginx makes itself (`rewrite`, `return`, a directory's slash, a location's
    /// auto_redirect): through `error_page` if one is set for its status, as any of nginx's
    /// own answers, else its page with this Location.
    Moved(u16, String),
    /// Internal redirect to this URI (`/path?args` or `@name`).
    Redirect(String),
    /// An application's `X-Accel-Redirect`: an internal redirect to this URI (`/path?args`
    /// or `@name`) as a GET (HEAD stays HEAD), whose answer carries these headers.
    Accel(String, Vec<(Cow<'static, str>, HeaderValue)>),
    /// Close the connection without answering (`return 444`).
    Close,
    /// Pass the request to the location's application (FastCGI, SCGI or uwsgi).
    Gateway,
    /// A DAV `PUT`: read the body into a named temporary file, then finish with
    /// `dav::put`.
    Put,
    /// Wait this long (`limit_req`), then go on with [`Flow::Delayed`].
    Delay(Duration),
    /// A delay is over: go on from the pre-access phase in the same location.
    Delayed,
    /// Ask Redis about the location's shared `limit_req` zones, then go on with what
    /// [`limit_req::shared::answered`] makes of the answer.
    LimitReqShared(Box<limit_req::shared::Pending>),
    /// Count the request in the location's shared `limit_conn` zones, then go on with what
    /// [`limit_conn::shared::ask`] makes of the answer.
    LimitConnShared(Box<limit_conn::shared::Pending>),
    /// The shared `limit_conn` zones counted the request: on to the access phase.
    LimitConnPassed,
    /// Run `auth_request`'s subrequest, then go on with [`Flow::AuthAnswered`].
    AuthRequest(Box<Subrequest>),
    /// The subrequest answered: finish the access phase with it, then the content phase.
    AuthAnswered(Box<Subrequest>),
}

/// Where the phases got to.
pub enum Handled {
    Respond(Response),
    /// The connection must run the exchange with the application, then call
    /// `handler::resume` with its outcome.
    Gateway,
    /// The connection must read the body into a named file (`request_body::read`), then
    /// call `handler::put_body_read`.
    Put,
    /// Close without an answer.
    Close,
    /// The connection must wait this long, then call `handler::resume` with
    /// [`Flow::Delayed`].
    Delay(Duration),
    /// `handler::settle` must run this `auth_request` subrequest, then call
    /// `handler::resume` with [`Flow::AuthAnswered`].
    AuthRequest(Box<Subrequest>),
    /// `handler::settle` must ask Redis, then call `handler::resume` with the outcome.
    LimitReqShared(Box<limit_req::shared::Pending>),
    /// `handler::settle` must count the request in Redis, then call `handler::resume` with
    /// the outcome.
    LimitConnShared(Box<limit_conn::shared::Pending>),
}
