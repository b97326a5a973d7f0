//! Bandwidth policing, nginx's: `limit_rate` (bytes per second for each answer) and
//! `limit_rate_after` (bytes sent before the limit starts), both sizes or variables; the
//! `$limit_rate` variable, which `set $limit_rate` changes for one request; and an
//! application's `X-Accel-Limit-Rate` header, which sets the rate of its own answer.
//!
//! This module decides the numbers; `conn::pace` spends them while the answer is written
//! (over HTTP/1.x and per HTTP/2 stream, as nginx limits each request and not the
//! connection).

use super::{inherit, LoadCtx, LocConf};
use crate::conn::pace::Pace;
use crate::errlog::{self, Level};
use crate::http::request::Request;
use crate::http::response::Response;
use crate::http::variables::Template;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "limit_rate",
        ctx: Ctx::HSL.or(Ctx::IF),
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "limit_rate_after",
        ctx: Ctx::HSL.or(Ctx::IF),
        args: Args::Exactly(1),
        block: false,
    },
];

/// A size known at load time, or one a variable gives per request.
#[derive(Debug, Clone)]
pub enum Size {
    Fixed(u64),
    Var(Template),
}

impl Size {
    /// The value for this request; a variable that is not a size is logged, as nginx
    /// does, and counts as 0 (no limit, nothing before it).
    fn eval(&self, req: &Request) -> u64 {
        match self {
            Size::Fixed(n) => *n,
            Size::Var(t) => {
                let v = t.eval(req, None);
                setters::size(&v).unwrap_or_else(|| {
                    errlog::request(
                        Level::Error,
                        req,
                        format_args!("invalid size \"{v}\" while sending response to client"),
                    );
                    0
                })
            }
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct LimitRateConf {
    pub rate: Option<Size>,
    pub after: Option<Size>,
}

impl LimitRateConf {
    pub fn merge(&mut self, p: &LimitRateConf) {
        inherit!(self, p, rate, after);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let t = Template::compile(&d.args[0]).map_err(|e| d.error(e))?;
    let size = if t.has_vars() {
        Size::Var(t)
    } else {
        Size::Fixed(
            setters::size(&d.args[0])
                .ok_or_else(|| d.error(format!("\"{}\" directive invalid value", d.name)))?,
        )
    };
    let c = &mut lc.limit_rate;
    if d.name == "limit_rate" {
        c.rate = Some(size);
    } else {
        c.after = Some(size);
    }
    Ok(())
}

/// `set $limit_rate VALUE`: a size, or (as nginx) an error logged and nothing changed.
pub fn set_var(req: &Request, value: &str) {
    match setters::size(value) {
        Some(n) => req.limit_rate.set(Some(n)),
        None => errlog::request(
            Level::Error,
            req,
            format_args!("invalid $limit_rate \"{value}\""),
        ),
    }
}

/// The pace of this answer, or `None` when no limit applies. The application's
/// `X-Accel-Limit-Rate` comes first, then `set $limit_rate`, then the `limit_rate`
/// directive; the rate found is what `$limit_rate` says from then on (the access log).
pub fn pace(req: &Request, resp: &Response) -> Option<Pace> {
    let c = &req.conf.limit_rate;
    let rate = match resp.limit_rate.map(u64::from).or(req.limit_rate.get()) {
        Some(r) => r,
        None => c.rate.as_ref()?.eval(req),
    };
    req.limit_rate.set(Some(rate));
    let after = c.after.as_ref().map_or(0, |a| a.eval(req));
    Pace::new(rate, after)
}
