//! `add_before_body URI`, `add_after_body URI`, `addition_types TYPE ...`: the bodies of
//! subrequests to these URIs are sent before and after the body of a 200 answer of those
//! types (`text/html` always is one), as nginx's ngx_http_addition_filter_module. Only
//! the main request's answer gets them (not a subrequest's), and not a HEAD answer.
//! Each subrequest is run when its turn comes in the body (`conn::source`), its body
//! streamed as it comes; nothing is held whole.

use super::compress::{types, Types};
use super::{inherit, LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::response::Response;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "add_before_body",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "add_after_body",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "addition_types",
        ctx: Ctx::HSL,
        args: Args::AtLeast(1),
        block: false,
    },
];

#[derive(Debug, Clone, Default)]
pub struct AdditionConf {
    /// The URIs (literal, as nginx's); an empty one (`add_before_body ""`) turns the
    /// inherited one off.
    pub before: Option<Arc<str>>,
    pub after: Option<Arc<str>>,
    pub types: Option<Arc<Types>>,
}

impl AdditionConf {
    pub fn merge(&mut self, p: &AdditionConf) {
        inherit!(self, p, before, after, types);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.addition;
    match d.name.as_str() {
        "add_before_body" | "add_after_body" => {
            let slot = if d.name == "add_before_body" {
                &mut c.before
            } else {
                &mut c.after
            };
            if slot.is_some() {
                return Err(d.error(format!("\"{}\" directive is duplicate", d.name)));
            }
            *slot = Some(Arc::from(d.args[0].as_str()));
        }
        _ => {
            if c.types.is_some() {
                return Err(d.error(format!("\"{}\" directive is duplicate", d.name)));
            }
            c.types = Some(Arc::new(types(d)));
        }
    }
    Ok(())
}

/// The subrequests' URIs, for [`start`] to hand to the body.
#[derive(Debug, Clone)]
pub struct Around {
    pub before: Option<Arc<str>>,
    pub after: Option<Arc<str>>,
}

/// Set `resp` up to have the subrequests' bodies around its own, if the filter applies
/// (nginx's header filter: the length is no longer known, no ranges, a weak ETag).
pub fn start(req: &Request, resp: &mut Response) {
    let c = &req.conf.addition;
    let given = |u: &Option<Arc<str>>| u.clone().filter(|u| !u.is_empty());
    let (before, after) = (given(&c.before), given(&c.after));
    if (before.is_none() && after.is_none()) || resp.status != 200 || req.subrequest {
        return;
    }
    let Some(ct) = resp.content_type.as_deref() else {
        return;
    };
    let matches = match &c.types {
        Some(t) => t.matches(ct),
        None => Types::List(Vec::new()).matches(ct),
    };
    if !matches {
        return;
    }
    resp.headers
        .retain(|(n, _)| !n.eq_ignore_ascii_case("accept-ranges"));
    resp.content_length = None;
    resp.length_unknown = true;
    resp.accept_ranges = false;
    resp.weak_etag();
    if !req.is_head() {
        resp.rewrites().addition = Some(Around { before, after });
    }
}
