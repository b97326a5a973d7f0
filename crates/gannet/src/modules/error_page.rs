//! `error_page code ... [=[response]] uri`: on one of the codes, an internal redirect to
//! `uri` (or `@named`), answered with the original code, or `=response`, or the page's own
//! status with a bare `=`. A full URL makes a 302 redirect (or the `=30x` given).

use super::{inherit, LoadCtx, LocConf};
use crate::http::variables::Template;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "error_page",
        ctx: Ctx::HSL.or(Ctx::IF),
        args: Args::AtLeast(2),
        block: false,
    },
    Spec {
        name: "recursive_error_pages",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Override {
    /// Keep the original status.
    Keep,
    /// `=`: use the status of the page's own response.
    Page,
    /// `=code`
    Code(u16),
}

#[derive(Debug, Clone)]
pub struct ErrorPage {
    pub codes: Vec<u16>,
    pub status: Override,
    pub uri: Template,
}

#[derive(Debug, Clone, Default)]
pub struct ErrorPageConf {
    pub pages: Option<Arc<Vec<ErrorPage>>>,
    pub recursive: Option<bool>,
}

impl ErrorPageConf {
    pub fn merge(&mut self, p: &ErrorPageConf) {
        inherit!(self, p, pages, recursive);
    }

    pub fn find(&self, status: u16) -> Option<&ErrorPage> {
        self.pages
            .as_ref()?
            .iter()
            .find(|p| p.codes.contains(&status))
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    if d.name == "recursive_error_pages" {
        lc.error_page.recursive = Some(gannet_conf::setters::flag(d)?);
        return Ok(());
    }
    let (uri, rest) = d
        .args
        .split_last()
        .ok_or_else(|| d.error("invalid number of arguments in \"error_page\" directive"))?;
    let mut codes = Vec::new();
    let mut status = Override::Keep;
    for (i, a) in rest.iter().enumerate() {
        if let Some(s) = a.strip_prefix('=') {
            if i + 1 != rest.len() {
                return Err(d.error(format!("invalid value \"{a}\"")));
            }
            status = if s.is_empty() {
                Override::Page
            } else {
                Override::Code(
                    s.parse()
                        .ok()
                        .filter(|c| (100..=599).contains(c))
                        .ok_or_else(|| d.error(format!("invalid value \"{a}\"")))?,
                )
            };
            continue;
        }
        let code: u16 = a
            .parse()
            .map_err(|_| d.error(format!("invalid value \"{a}\"")))?;
        if !(300..=599).contains(&code) || code == 499 {
            return Err(d.error(format!("value \"{a}\" must be between 300 and 599")));
        }
        codes.push(code);
    }
    if codes.is_empty() {
        return Err(d.error("invalid number of arguments in \"error_page\" directive"));
    }
    let uri = Template::compile(uri).map_err(|e| d.error(e))?;
    let mut pages = lc.error_page.pages.as_deref().cloned().unwrap_or_default();
    pages.push(ErrorPage { codes, status, uri });
    lc.error_page.pages = Some(Arc::new(pages));
    Ok(())
}
