//! `sub_filter STRING REPLACEMENT`, `sub_filter_once on | off`, `sub_filter_types TYPE ...`
//! and `sub_filter_last_modified on | off` (nginx's ngx_http_sub_filter_module): replace
//! strings in response bodies - static files, proxied, FastCGI, SCGI and uwsgi answers,
//! streamed ones too - before compression.
//!
//! As in nginx: both strings may hold variables (evaluated once per response); the search
//! ignores ASCII case; at one place the first listed string that matches wins; with
//! `sub_filter_once on` (the default) each string is replaced at most once. An answer whose
//! type is listed (`text/html` always; `*` any) and whose known length is not 0 loses its
//! Content-Length (the length changes) and, unless `sub_filter_last_modified on`, its
//! Last-Modified and ETag (else the ETag turns weak). The check for If-Modified-Since /
//! If-None-Match happens before, as nginx's not_modified filter runs first; ranges are not
//! offered on such an answer.
//!
//! The body is rewritten piece by piece as it is sent ([`Stream`], used by
//! `conn::source`): only the bytes that could begin a match - fewer than the longest
//! string - are held back between pieces, so a match split across pieces is still found and
//! an answer is never held whole.
//!
//! Unlike nginx, an answer with a Content-Encoding of its own (a compressed upstream answer)
//! is left alone: nginx would search its compressed bytes and could corrupt them.

use super::compress::Types;
use super::{LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::response::Response;
use crate::http::variables::Template;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::rc::Rc;
use std::sync::Arc;

use super::gateway::spec;

pub const DIRECTIVES: &[Spec] = &[
    spec("sub_filter", Ctx::HSL, Args::Exactly(2)),
    spec("sub_filter_once", Ctx::HSL, Args::Exactly(1)),
    spec("sub_filter_types", Ctx::HSL, Args::AtLeast(1)),
    spec("sub_filter_last_modified", Ctx::HSL, Args::Exactly(1)),
];

/// nginx's limit on strings per level.
const MAX_PAIRS: usize = 255;

#[derive(Debug, Clone)]
struct Pair {
    /// Lower-cased at load when it has no variables, else after evaluation.
    search: Template,
    replace: Template,
}

#[derive(Debug, Clone, Default)]
pub struct SubFilterConf {
    /// A level with strings of its own replaces the outer level's list.
    pairs: Option<Arc<Vec<Pair>>>,
    once: Option<bool>,
    types: Option<Arc<Types>>,
    last_modified: Option<bool>,
}

impl SubFilterConf {
    pub fn merge(&mut self, parent: &SubFilterConf) {
        super::inherit!(self, parent, pairs, once, types, last_modified);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.sub_filter;
    match d.name.as_str() {
        "sub_filter" => {
            // nginx lower-cases the argument before compiling it (variable names too).
            let search = d.args[0].to_ascii_lowercase();
            if search.is_empty() {
                return Err(d.error("empty search pattern"));
            }
            let mut pairs = c.pairs.as_deref().cloned().unwrap_or_default();
            if pairs.len() == MAX_PAIRS {
                return Err(d.error("number of search patterns exceeds 255"));
            }
            let t = |s: &str| Template::compile(s).map_err(|e| d.error(e));
            pairs.push(Pair {
                search: t(&search)?,
                replace: t(&d.args[1])?,
            });
            c.pairs = Some(Arc::new(pairs));
        }
        "sub_filter_once" => c.once = Some(setters::flag(d)?),
        "sub_filter_last_modified" => c.last_modified = Some(setters::flag(d)?),
        "sub_filter_types" => c.types = Some(Arc::new(super::compress::types(d))),
        _ => unreachable!("not a sub_filter directive: {}", d.name),
    }
    Ok(())
}

/// The strings of one response, evaluated.
#[derive(Debug)]
pub struct Patterns {
    /// (lower-case search string, replacement), in the config's order.
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    once: bool,
    /// Whether a byte (either case) may start a match: most bytes are passed on after
    /// one look-up.
    starts: [bool; 256],
}

/// Whether the filter applies to `resp` (decided before the conditional filter, which
/// must still see the validators, and before compression, which must not take its
/// length as known). `streamed`: the body is not in `resp` but comes from an application.
pub fn applies(req: &Request, resp: &Response, streamed: bool) -> bool {
    let c = &req.conf.sub_filter;
    if c.pairs.as_ref().is_none_or(|p| p.is_empty()) {
        return false;
    }
    let encoded = resp
        .headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("content-encoding") && !v.is_empty());
    text_body(c.types.as_deref(), resp, streamed) && !encoded
}

/// Whether a body filter with these `*_types` (none: text/html) has a body to work on in
/// `resp`: one of the types, and not known to be empty (shared with SSI).
pub fn text_body(types: Option<&Types>, resp: &Response, streamed: bool) -> bool {
    // `*` takes an answer without a Content-Type too (nginx's ngx_http_test_content_type).
    let types_match = match (types, resp.content_type.as_deref()) {
        (Some(Types::Any), _) => true,
        (_, None) => false,
        (Some(t), Some(ct)) => t.matches(ct),
        (None, Some(ct)) => Types::List(Vec::new()).matches(ct),
    };
    let known_empty = match resp.content_length {
        Some(n) => n == 0,
        None => !streamed && !resp.length_unknown && resp.body.len() == 0,
    };
    types_match && !known_empty
}

/// Set `resp` up to be rewritten (its headers as nginx's header filter leaves them; the
/// strings it is sent through in `resp.sub_filter`), if the filter applies to it.
pub fn start(req: &Request, resp: &mut Response, streamed: bool) {
    if !applies(req, resp, streamed) {
        return;
    }
    let c = &req.conf.sub_filter;
    let mut pairs = Vec::new();
    for p in c.pairs.iter().flat_map(|p| p.iter()) {
        let search = p.search.eval(req, None).to_ascii_lowercase();
        // A string whose variables came out empty would match everywhere: skipped.
        if !search.is_empty() {
            pairs.push((search.into_bytes(), p.replace.eval(req, None).into_bytes()));
        }
    }
    if pairs.is_empty() {
        return;
    }
    let mut starts = [false; 256];
    for (s, _) in &pairs {
        starts[usize::from(s[0])] = true;
        starts[usize::from(s[0].to_ascii_uppercase())] = true;
    }
    resp.body_rewritten(c.last_modified == Some(true));
    // A HEAD answer has no body to rewrite; its headers say what a GET's would.
    if !req.is_head() {
        resp.rewrites().sub_filter = Some(Rc::new(Patterns {
            pairs,
            once: c.once != Some(false),
            starts,
        }));
    }
}

/// One body being rewritten.
#[derive(Debug)]
pub struct Stream {
    patterns: Rc<Patterns>,
    /// The end of the last piece that may begin a match the next piece completes.
    held: Vec<u8>,
    /// Under `sub_filter_once`, the strings already replaced.
    used: Vec<bool>,
    left: usize,
    /// The last piece was fed.
    ended: bool,
}

/// How a string compares at one place of what is at hand.
enum Fit {
    Whole,
    /// What is at hand ends while it still matches.
    Partial,
    No,
}

fn fit(at: &[u8], search: &[u8]) -> Fit {
    let n = at.len().min(search.len());
    if !at[..n].eq_ignore_ascii_case(&search[..n]) {
        Fit::No
    } else if n == search.len() {
        Fit::Whole
    } else {
        Fit::Partial
    }
}

impl Stream {
    pub fn new(patterns: Rc<Patterns>) -> Stream {
        let n = patterns.pairs.len();
        Stream {
            patterns,
            held: Vec::new(),
            used: vec![false; n],
            left: n,
            ended: false,
        }
    }

    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Rewrite the next piece (`last`: the body ends after it); what can go out now.
    pub fn feed(&mut self, piece: &[u8], last: bool) -> Vec<u8> {
        self.ended |= last;
        let p = self.patterns.clone();
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(piece);
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        let mut copied = 0;
        while i < buf.len() {
            if p.once && self.left == 0 {
                break;
            }
            if !p.starts[usize::from(buf[i])] {
                i += 1;
                continue;
            }
            let mut found = None;
            let mut wait = false;
            for (k, (search, _)) in p.pairs.iter().enumerate() {
                if p.once && self.used[k] {
                    continue;
                }
                match fit(&buf[i..], search) {
                    Fit::Whole => {
                        found = Some(k);
                        break;
                    }
                    // An earlier string may still match once more comes: wait for it, as
                    // nginx does, rather than take a later one.
                    Fit::Partial if !last => {
                        wait = true;
                        break;
                    }
                    Fit::Partial | Fit::No => {}
                }
            }
            if wait {
                out.extend_from_slice(&buf[copied..i]);
                self.held = buf[i..].to_vec();
                return out;
            }
            match found {
                Some(k) => {
                    out.extend_from_slice(&buf[copied..i]);
                    out.extend_from_slice(&p.pairs[k].1);
                    i += p.pairs[k].0.len();
                    copied = i;
                    if p.once {
                        self.used[k] = true;
                        self.left -= 1;
                    }
                }
                None => i += 1,
            }
        }
        out.extend_from_slice(&buf[copied..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns(pairs: &[(&str, &str)], once: bool) -> Rc<Patterns> {
        let pairs: Vec<_> = pairs
            .iter()
            .map(|(s, r)| (s.as_bytes().to_vec(), r.as_bytes().to_vec()))
            .collect();
        let mut starts = [false; 256];
        for (s, _) in &pairs {
            starts[usize::from(s[0])] = true;
            starts[usize::from(s[0].to_ascii_uppercase())] = true;
        }
        Rc::new(Patterns {
            pairs,
            once,
            starts,
        })
    }

    /// Feed `pieces` in turn; the whole output.
    fn run(p: &Rc<Patterns>, pieces: &[&str]) -> String {
        let mut s = Stream::new(p.clone());
        let mut out = Vec::new();
        for piece in pieces {
            out.extend(s.feed(piece.as_bytes(), false));
        }
        out.extend(s.feed(b"", true));
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn replaces_ignoring_case_once_or_every_time() {
        let all = patterns(&[("foo", "bar")], false);
        assert_eq!(run(&all, &["a Foo b FOO c foo"]), "a bar b bar c bar");
        let once = patterns(&[("foo", "bar")], true);
        assert_eq!(run(&once, &["a Foo b FOO c foo"]), "a bar b FOO c foo");
        // Each string once, each on its own.
        let two = patterns(&[("a", "1"), ("b", "2")], true);
        assert_eq!(run(&two, &["xbxaxbxa"]), "x2x1xbxa");
    }

    #[test]
    fn a_match_split_across_pieces_is_found() {
        let p = patterns(&[("hello world", "HI")], false);
        let text = "say hello world, hello world!";
        // Every way of cutting the text in two, and byte by byte.
        for cut in 0..=text.len() {
            assert_eq!(
                run(&p, &[&text[..cut], &text[cut..]]),
                "say HI, HI!",
                "cut {cut}"
            );
        }
        let bytes: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert_eq!(run(&p, &refs), "say HI, HI!");
        // A partial match at the very end is given back as it was.
        assert_eq!(run(&p, &["ends with hello wor"]), "ends with hello wor");
    }

    #[test]
    fn holds_back_less_than_the_longest_string() {
        let p = patterns(&[("abcdef", "X"), ("zz", "Y")], false);
        let mut s = Stream::new(p);
        assert_eq!(s.feed(b"0123abcde", false), b"0123");
        assert_eq!(s.held.len(), 5);
        assert_eq!(s.feed(b"f..abc", false), b"X..");
        assert_eq!(s.feed(b"x", false), b"abcx");
        assert!(s.held.is_empty());
    }

    #[test]
    fn the_first_listed_string_wins_at_one_place() {
        let p = patterns(&[("ab", "1"), ("abc", "2")], false);
        assert_eq!(run(&p, &["abc"]), "1c");
        let p = patterns(&[("abc", "2"), ("ab", "1")], false);
        assert_eq!(run(&p, &["abc ab"]), "2 1");
        // The earlier string is waited for even when a later one already matches.
        assert_eq!(run(&p, &["a", "b", "c"]), "2");
    }

    #[test]
    fn replacements_are_not_searched_again() {
        let p = patterns(&[("a", "aa")], false);
        assert_eq!(run(&p, &["aba"]), "aabaa");
    }
}
