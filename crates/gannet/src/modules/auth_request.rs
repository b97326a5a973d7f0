//! `auth_request URI | off` and `auth_request_set $variable value` (nginx's
//! ngx_http_auth_request_module): in the access phase a subrequest, a GET without a body
//! carrying the client's headers, goes to URI's location (typically `internal` with a
//! `proxy_pass` to an authentication service), and its status decides: 2xx lets the request
//! go on, 401 (with the subrequest's WWW-Authenticate headers) and 403 are the answer, any
//! other status is a 500. The subrequest's body is dropped.
//!
//! `auth_request_set` values are evaluated once the subrequest is done, against the
//! subrequest (so `$upstream_http_NAME` is the authentication service's answer header, the
//! way Authelia, oauth2-proxy and Authentik pass the user on), and stored in the main
//! request's variable; they are set whatever the verdict, as nginx does.
//!
//! The subrequest itself runs in `conn::subrequest` (it awaits an upstream); this file
//! holds the settings and what the answer means. Where it sits among `allow` / `deny` /
//! `auth_basic` and `satisfy` is in `modules::access`.

use super::{LoadCtx, LocConf};
use crate::errlog::{self, Level};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::user_vars::{self, UserVar};
use crate::http::variables::Template;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use gannet_proto::cgi::HeaderValue;
use std::borrow::Cow;
use std::sync::Arc;

use super::gateway::spec;

pub const DIRECTIVES: &[Spec] = &[
    spec("auth_request", Ctx::HSL, Args::Exactly(1)),
    spec("auth_request_set", Ctx::HSL, Args::Exactly(2)),
];

#[derive(Debug, Clone, Default)]
pub struct AuthRequestConf {
    /// The subrequest's URI; `Some(None)` is `auth_request off`.
    uri: Option<Option<Arc<str>>>,
    /// `auth_request_set` lines, in order. A level with lines of its own replaces the outer
    /// level's, as nginx's merge of the array does.
    sets: Option<Arc<Vec<(Target, Template)>>>,
}

/// What an `auth_request_set` line assigns: a variable of the config (or a built-in one of
/// a prefix), or one of the built-in variables nginx lets be changed, which change the
/// request itself.
#[derive(Debug, Clone)]
enum Target {
    Var(UserVar),
    Args,
    LimitRate,
}

impl AuthRequestConf {
    pub fn merge(&mut self, parent: &AuthRequestConf) {
        super::inherit!(self, parent, uri, sets);
    }

    /// The URI to ask, when `auth_request` is on here.
    pub fn uri(&self) -> Option<&Arc<str>> {
        self.uri.as_ref()?.as_ref()
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.auth_request;
    let a0 = d.args[0].as_str();
    match d.name.as_str() {
        "auth_request" => {
            if c.uri.is_some() {
                return Err(d.error("\"auth_request\" directive is duplicate"));
            }
            c.uri = Some(match a0 {
                "off" => None,
                // nginx takes any string and fails each request at run time; a URI that
                // cannot name a location is refused here instead.
                uri if uri.starts_with('/') && !uri.contains(char::is_whitespace) => {
                    Some(Arc::from(uri))
                }
                other => return Err(super::invalid(d, other)),
            });
        }
        "auth_request_set" => {
            let name = a0
                .strip_prefix('$')
                .ok_or_else(|| d.error(format!("invalid variable name \"{a0}\"")))?;
            let var = match name {
                "args" => Target::Args,
                "limit_rate" => Target::LimitRate,
                _ => Target::Var(user_vars::define_assigned(name).map_err(|e| d.error(e))?),
            };
            let value = Template::compile(&d.args[1]).map_err(|e| d.error(e))?;
            let mut sets = c.sets.as_deref().cloned().unwrap_or_default();
            sets.push((var, value));
            c.sets = Some(Arc::new(sets));
        }
        _ => unreachable!("not an auth_request directive: {}", d.name),
    }
    Ok(())
}

/// One `auth_request` check under way: asked for by the access phase, run by the
/// connection (`conn::subrequest`), handed back to the phases with its answer.
#[derive(Debug)]
pub struct Subrequest {
    pub uri: Arc<str>,
    /// Under `satisfy any`, the refusal the rules or `auth_basic` already made (403, 401).
    pub denied: Option<u16>,
    pub answer: Answer,
}

impl Subrequest {
    pub fn new(uri: Arc<str>, denied: Option<u16>) -> Subrequest {
        Subrequest {
            uri,
            denied,
            answer: Answer::default(),
        }
    }
}

/// What the subrequest answered: its status and its headers (the upstream's, for
/// `$upstream_http_NAME` and WWW-Authenticate).
#[derive(Debug, Default)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(Cow<'static, str>, HeaderValue)>,
    /// `auth_request_set $args`: the main request's new query string (empty: none), set
    /// once the access phase has the request to change again ([`apply_args`]).
    pub args: Option<String>,
}

/// Set the `auth_request_set` variables of `main` from `sub`, the finished subrequest;
/// returns a new `$args` for [`apply_args`].
pub fn set_vars(main: &Request, sub: &Request) -> Option<String> {
    let sets = main.conf.auth_request.sets.as_ref()?;
    let mut args = None;
    for (target, value) in sets.iter() {
        let v = value.eval(sub, None);
        match target {
            Target::Var(var) => main.vars.set(var.idx, v),
            Target::Args => args = Some(v),
            Target::LimitRate => super::limit_rate::set_var(main, &v),
        }
    }
    args
}

/// Give the main request the `$args` an `auth_request_set` assigned.
pub fn apply_args(req: &mut Request, answer: &Answer) {
    if let Some(a) = &answer.args {
        req.args = (!a.is_empty()).then(|| a.clone());
        // nginx's `$args` setter: the raw URI no longer applies.
        req.uri_changed = true;
    }
}

/// The verdict on the subrequest's answer: `None` lets the request in, else its refusal
/// (401 carries the subrequest's WWW-Authenticate headers, through `req.auth_challenge`).
pub fn verdict(req: &mut Request, answer: &Answer) -> Option<Flow> {
    match answer.status {
        200..=299 => None,
        403 => Some(Flow::Status(403)),
        401 => {
            req.auth_challenge.extend(
                answer
                    .headers
                    .iter()
                    .filter(|(n, _)| n.eq_ignore_ascii_case("www-authenticate"))
                    .map(|(_, v)| v.to_string()),
            );
            Some(Flow::Status(401))
        }
        other => {
            errlog::request(
                Level::Error,
                req,
                format_args!("auth request unexpected status: {other}"),
            );
            Some(Flow::Status(500))
        }
    }
}
