//! `geo [$address] $name { ... }` (http context; nginx's ngx_http_geo_module): `$name` takes
//! the value of the network the client address (or `$address`, when given) falls in.
//!
//! Inside the block: `net value;` (`address` or `address/bits`, IPv4 or IPv6; the longest
//! matching network wins), `default value;` (`0.0.0.0/0` and `::/0`), `delete net;`,
//! `proxy net;` and `proxy_recursive;` (a client among those trusted proxies is judged by the
//! address its X-Forwarded-For names), `volatile;`, `include file;`, and `ranges;` first in
//! the block for `start-end value;` IPv4 ranges instead of networks. Values are literal
//! text. An address that is not one - an `$address` that does not parse, or an IPv6 client
//! of a ranges table - is looked up as 255.255.255.255, as in nginx.
//!
//! Ranges are kept as nginx keeps them, per /16 block, so that what a config may write
//! (a range inside another splits it; a range that straddles another is an error) and
//! what it warns about are nginx's. The same warnings as nginx's (duplicate network, low
//! bits, nothing to delete) are load notices.

use super::{LoadCtx, LocConf};
use crate::http::cidr::{self, Cidr};
use crate::http::request::Request;
use crate::http::user_vars::{self, Computed};
use crate::http::variables::{Sent, Template};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "geo",
    ctx: Ctx::HTTP,
    args: Args::Between(1, 2),
    block: true,
}];

/// What an address that is not one is looked up as.
const NONE: u32 = u32::MAX;

#[derive(Debug)]
pub struct Geo {
    /// `$address`; the client's address when absent.
    source: Option<Template>,
    table: Table,
    proxies: Vec<Cidr>,
    proxy_recursive: bool,
    volatile: bool,
}

#[derive(Debug)]
enum Table {
    Nets { v4: Prefixes, v6: Prefixes },
    Ranges(Ranges),
}

/// Networks of one address family, by prefix length.
#[derive(Debug)]
struct Prefixes {
    /// 32 or 128.
    width: u8,
    by_len: BTreeMap<u8, HashMap<u128, Arc<str>>>,
}

impl Prefixes {
    fn new(width: u8) -> Prefixes {
        Prefixes {
            width,
            by_len: BTreeMap::new(),
        }
    }

    fn mask(&self, bits: u8) -> u128 {
        if self.width == 32 {
            u128::from(cidr::mask4(bits))
        } else {
            cidr::mask6(bits)
        }
    }

    /// Set the value of a network; the value it had, if any.
    fn insert(&mut self, net: u128, bits: u8, value: Arc<str>) -> Option<Arc<str>> {
        self.by_len.entry(bits).or_default().insert(net, value)
    }

    fn remove(&mut self, net: u128, bits: u8) -> bool {
        self.by_len
            .get_mut(&bits)
            .is_some_and(|m| m.remove(&net).is_some())
    }

    /// The value of the longest network holding `addr`.
    fn find(&self, addr: u128) -> Option<&Arc<str>> {
        self.by_len
            .iter()
            .rev()
            .find_map(|(&bits, nets)| nets.get(&(addr & self.mask(bits))))
    }
}

/// IPv4 ranges, split per /16 block as nginx keeps them: each block's spans are sorted
/// and do not overlap.
#[derive(Debug, Default)]
struct Ranges {
    default: Option<Arc<str>>,
    blocks: HashMap<u16, Vec<Span>>,
}

#[derive(Debug, Clone)]
struct Span {
    start: u16,
    end: u16,
    value: Arc<str>,
}

/// The /16 blocks `start..=end` covers, each with the part of it inside the range.
fn blocks(start: u32, end: u32) -> impl Iterator<Item = (u16, u16, u16)> {
    ((start >> 16)..=(end >> 16)).map(move |h| {
        let s = if h == start >> 16 { start as u16 } else { 0 };
        let e = if h == end >> 16 { end as u16 } else { u16::MAX };
        (h as u16, s, e)
    })
}

impl Ranges {
    /// Add `start-end`; `Err` names the span it straddles, as nginx's error does.
    fn add(
        &mut self,
        start: u32,
        end: u32,
        value: &Arc<str>,
        warn: &mut Vec<String>,
    ) -> Result<(), String> {
        for (h, s, e) in blocks(start, end) {
            let spans = self.blocks.entry(h).or_default();
            let new = Span {
                start: s,
                end: e,
                value: value.clone(),
            };
            // The spans from the last one down, as nginx (adding ascending ranges is cheap).
            let Some(i) = spans.iter().rposition(|r| e >= r.start) else {
                spans.insert(0, new);
                continue;
            };
            let r = spans[i].clone();
            if s > r.end {
                spans.insert(i + 1, new);
            } else if s == r.start && e == r.end {
                warn.push(format!("value: \"{value}\", old value: \"{}\"", r.value));
                spans[i].value = value.clone();
            } else if s >= r.start && e <= r.end {
                // Inside: the old span keeps what is left on either side.
                let mut parts = Vec::with_capacity(3);
                if s > r.start {
                    parts.push(Span {
                        end: s - 1,
                        ..r.clone()
                    });
                }
                parts.push(new);
                if e < r.end {
                    parts.push(Span { start: e + 1, ..r });
                }
                spans.splice(i..=i, parts);
            } else {
                let (a, b) = (h >> 8, h & 0xff);
                return Err(format!(
                    "{a}.{b}.{}.{}-{a}.{b}.{}.{}",
                    r.start >> 8,
                    r.start & 0xff,
                    r.end >> 8,
                    r.end & 0xff
                ));
            }
        }
        Ok(())
    }

    /// Delete exactly `start-end`; false if some block of it had no such span.
    fn delete(&mut self, start: u32, end: u32) -> bool {
        let mut all = true;
        for (h, s, e) in blocks(start, end) {
            let spans = self.blocks.entry(h).or_default();
            match spans.iter().position(|r| r.start == s && r.end == e) {
                Some(i) => {
                    spans.remove(i);
                }
                None => all = false,
            }
        }
        all
    }

    fn find(&self, addr: u32) -> Option<&Arc<str>> {
        let low = addr as u16;
        self.blocks
            .get(&((addr >> 16) as u16))
            .and_then(|spans| spans.iter().find(|r| r.start <= low && low <= r.end))
            .map(|r| &r.value)
            .or(self.default.as_ref())
    }
}

pub fn set(d: &Directive, _lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let var_name = |a: &str| {
        a.strip_prefix('$')
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .ok_or_else(|| d.error(format!("invalid variable name \"{a}\"")))
    };
    let (source, name) = match d.args.as_slice() {
        [src, name] => {
            var_name(src)?;
            (Some(Template::compile(src).map_err(|e| d.error(e))?), name)
        }
        _ => (None, &d.args[0]),
    };
    let name = var_name(name)?;
    let geo = parse(d, source, &mut ctx.notices)?;
    user_vars::define_computed(&name, Arc::new(geo)).map_err(|e| d.error(e))?;
    Ok(())
}

/// The block of a `geo` (its `$address`, if any, is the caller's); also the stream
/// context's `geo` (`stream::map`), which looks the table up with [`Geo::lookup`].
pub fn parse(
    d: &Directive,
    source: Option<Template>,
    notices: &mut Vec<String>,
) -> Result<Geo, ConfError> {
    let mut geo = Geo {
        source,
        table: Table::Nets {
            v4: Prefixes::new(32),
            v6: Prefixes::new(128),
        },
        proxies: Vec::new(),
        proxy_recursive: false,
        volatile: false,
    };
    // Whether a network line came already (`ranges` must come before any).
    let mut nets_seen = false;
    for e in d.block.as_deref().unwrap_or_default() {
        if e.block.is_some() {
            return Err(e.error("unexpected \"{\""));
        }
        let mut notice = |msg: String| notices.push(format!("{}: {msg}", e.loc));
        match (e.name.as_str(), e.args.as_slice()) {
            ("ranges", []) => {
                if nets_seen {
                    return Err(e.error(
                        "the \"ranges\" directive must be the first directive inside \"geo\" block",
                    ));
                }
                if !matches!(geo.table, Table::Ranges(_)) {
                    geo.table = Table::Ranges(Ranges::default());
                }
            }
            ("proxy_recursive", []) => geo.proxy_recursive = true,
            ("volatile", []) => geo.volatile = true,
            ("proxy", [net]) => geo.proxies.push(network(e, net, &mut notice)?),
            (key, [value]) => {
                let value: Arc<str> = Arc::from(value.as_str());
                match &mut geo.table {
                    Table::Ranges(r) => range(e, r, key, &value, &mut notice)?,
                    Table::Nets { v4, v6 } => {
                        nets_seen = true;
                        net_line(e, v4, v6, key, &value, &mut notice)?
                    }
                }
            }
            _ => return Err(e.error("invalid number of the geo parameters")),
        }
    }
    Ok(geo)
}

/// `address[/bits]`, with nginx's warning when bits past the prefix are set.
fn network(e: &Directive, net: &str, notice: &mut impl FnMut(String)) -> Result<Cidr, ConfError> {
    let (c, meaningful) =
        Cidr::parse(net).ok_or_else(|| e.error(format!("invalid network \"{net}\"")))?;
    if !meaningful {
        notice(format!("low address bits of {net} are meaningless"));
    }
    Ok(c)
}

/// A line of a networks table: `default value`, `delete net` or `net value`.
fn net_line(
    e: &Directive,
    v4: &mut Prefixes,
    v6: &mut Prefixes,
    key: &str,
    value: &Arc<str>,
    notice: &mut impl FnMut(String),
) -> Result<(), ConfError> {
    // A network set twice keeps the later value, with nginx's warning.
    let add = |p: &mut Prefixes, net: u128, bits: u8, notice: &mut dyn FnMut(String)| {
        if let Some(old) = p.insert(net, bits, value.clone()) {
            notice(format!(
                "duplicate network \"{key}\", value: \"{value}\", old value: \"{old}\""
            ));
        }
    };
    if key == "default" {
        add(v4, 0, 0, notice);
        add(v6, 0, 0, notice);
        return Ok(());
    }
    if key == "delete" {
        let found = match network(e, value, notice)? {
            Cidr::V4 { net, bits } => v4.remove(u128::from(net), bits),
            Cidr::V6 { net, bits } => v6.remove(net, bits),
        };
        if !found {
            notice(format!("no network \"{value}\" to delete"));
        }
        return Ok(());
    }
    match network(e, key, notice)? {
        Cidr::V4 { net, bits } => add(v4, u128::from(net), bits, notice),
        Cidr::V6 { net, bits } => add(v6, net, bits, notice),
    }
    Ok(())
}

/// A line of a ranges table: `default value`, `delete start-end` or `start-end value`.
fn range(
    e: &Directive,
    r: &mut Ranges,
    key: &str,
    value: &Arc<str>,
    notice: &mut impl FnMut(String),
) -> Result<(), ConfError> {
    if key == "default" {
        if let Some(old) = r.default.replace(value.clone()) {
            notice(format!(
                "duplicate default geo range value: \"{value}\", old value: \"{old}\""
            ));
        }
        return Ok(());
    }
    let (text, delete) = if key == "delete" {
        (value.as_ref(), true)
    } else {
        (key, false)
    };
    // 255.255.255.255 is refused as nginx's ngx_inet_addr does (its error value).
    let bound = |t: &str| {
        t.parse::<Ipv4Addr>()
            .ok()
            .map(u32::from)
            .filter(|&a| a != NONE)
    };
    let bounds = text
        .split_once('-')
        .and_then(|(a, b)| Some((bound(a)?, bound(b)?)))
        .filter(|(a, b)| a <= b);
    let (start, end) = bounds.ok_or_else(|| e.error(format!("invalid range \"{text}\"")))?;
    if delete {
        if !r.delete(start, end) {
            notice(format!("no address range \"{text}\" to delete"));
        }
        return Ok(());
    }
    let mut warnings = Vec::new();
    let added = r.add(start, end, value, &mut warnings);
    for w in warnings {
        notice(format!("duplicate range \"{text}\", {w}"));
    }
    added.map_err(|other| e.error(format!("range \"{text}\" overlaps \"{other}\"")))
}

impl Geo {
    /// The address to look up; `None` when `$address` is not an address.
    fn address(&self, req: &Request, sent: Option<&Sent>) -> Option<IpAddr> {
        let addr = match &self.source {
            // A `listen unix:` client has no address: nginx looks up 255.255.255.255
            // (its AF_UNIX case), as for a `$address` that is not one.
            None if req.unix_client() => return None,
            None => req.client().ip(),
            Some(t) => t.eval(req, sent).parse().ok()?,
        };
        if self.proxies.is_empty() {
            return Some(addr);
        }
        let list = req.x_forwarded_for().unwrap_or_default();
        let peer = SocketAddr::new(addr, 0);
        let trusted = |a: IpAddr| self.proxies.iter().any(|p| p.contains(cidr::unmapped(a)));
        let real = cidr::forwarded(peer, &list, trusted, self.proxy_recursive);
        Some(real.map_or(addr, |a| a.ip()))
    }
}

impl Computed for Geo {
    fn volatile(&self) -> bool {
        self.volatile
    }

    fn value(&self, req: &Request, sent: Option<&Sent>) -> String {
        self.lookup(self.address(req, sent))
    }
}

impl Geo {
    /// The value for `addr` (`None`: not an address, looked up as 255.255.255.255).
    pub fn lookup(&self, addr: Option<IpAddr>) -> String {
        let addr = addr.map(cidr::unmapped);
        let found = match (&self.table, addr) {
            (Table::Nets { v6, .. }, Some(IpAddr::V6(a))) => v6.find(u128::from(a)),
            (Table::Nets { v4, .. }, a) => {
                let a = match a {
                    Some(IpAddr::V4(a)) => u32::from(a),
                    _ => NONE,
                };
                v4.find(u128::from(a))
            }
            (Table::Ranges(r), Some(IpAddr::V4(a))) => r.find(u32::from(a)),
            (Table::Ranges(r), _) => r.find(NONE),
        };
        found.map_or_else(String::new, |v| v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The block's table and its load notices.
    fn geo(body: &str) -> Result<(Geo, Vec<String>), String> {
        let _scope = user_vars::LoadScope::begin();
        let src = format!("geo $out {{\n{body}\n}}");
        let tree =
            gannet_conf::parse_str(&src, "t.conf", Path::new("/")).map_err(|e| e.to_string())?;
        let mut notices = Vec::new();
        let g = parse(&tree[0], None, &mut notices).map_err(|e| e.to_string())?;
        Ok((g, notices))
    }

    fn pick(g: &Geo, addr: &str) -> String {
        let found = match (&g.table, addr.parse::<IpAddr>().ok()) {
            (Table::Nets { v6, .. }, Some(IpAddr::V6(a))) => v6.find(u128::from(a)),
            (Table::Nets { v4, .. }, Some(IpAddr::V4(a))) => v4.find(u128::from(u32::from(a))),
            (Table::Ranges(r), Some(IpAddr::V4(a))) => r.find(u32::from(a)),
            _ => None,
        };
        found.map_or("", |v| v).to_string()
    }

    #[test]
    fn longest_network_wins() {
        let (g, notices) = geo(
            "default d;\n10.0.0.0/8 ten;\n10.1.0.0/16 ten-one;\n10.1.2.3 host;\n2001:db8::/32 doc;\n::1 lo6;",
        )
        .unwrap();
        assert!(notices.is_empty());
        assert_eq!(pick(&g, "10.9.9.9"), "ten");
        assert_eq!(pick(&g, "10.1.9.9"), "ten-one");
        assert_eq!(pick(&g, "10.1.2.3"), "host");
        assert_eq!(pick(&g, "11.0.0.1"), "d");
        assert_eq!(pick(&g, "2001:db8::7"), "doc");
        assert_eq!(pick(&g, "::1"), "lo6");
        assert_eq!(pick(&g, "2001:db9::7"), "d");
        let (g, _) = geo("10.0.0.0/8 ten;").unwrap();
        assert_eq!(pick(&g, "11.0.0.1"), "");
    }

    #[test]
    fn duplicates_deletes_and_low_bits_are_notices() {
        let (g, notices) =
            geo("default a;\ndefault b;\n10.1.2.3/8 x;\n10.0.0.0/8 y;\ndelete 10.0.0.0/8;\ndelete 1.0.0.0/8;")
                .unwrap();
        assert_eq!(
            notices,
            [
                "t.conf:3: duplicate network \"default\", value: \"b\", old value: \"a\"",
                "t.conf:3: duplicate network \"default\", value: \"b\", old value: \"a\"",
                "t.conf:4: low address bits of 10.1.2.3/8 are meaningless",
                "t.conf:5: duplicate network \"10.0.0.0/8\", value: \"y\", old value: \"x\"",
                "t.conf:7: no network \"1.0.0.0/8\" to delete",
            ]
        );
        assert_eq!(pick(&g, "10.0.0.1"), "b");
    }

    #[test]
    fn ranges_split_and_refuse_straddling() {
        let (g, notices) = geo(
            "ranges;\ndefault d;\n10.0.0.0-10.0.255.255 one;\n10.0.1.0-10.0.1.255 inner;\n10.0.0.0-10.0.0.127 low;\n10.1.0.0-10.2.0.255 wide;",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(notices.is_empty(), "{notices:?}");
        for (addr, value) in [
            ("10.0.0.7", "low"),
            ("10.0.0.200", "one"),
            ("10.0.1.7", "inner"),
            ("10.0.2.7", "one"),
            ("10.1.200.7", "wide"),
            ("10.2.0.7", "wide"),
            ("10.2.1.7", "d"),
            ("9.0.0.1", "d"),
        ] {
            assert_eq!(pick(&g, addr), value, "{addr}");
        }
        let err = geo("ranges;\n10.0.0.0-10.0.255.255 one;\n10.0.1.0-10.0.1.255 inner;\n10.0.0.0-10.1.255.255 big;")
            .err()
            .unwrap_or_default();
        assert!(
            err.contains(
                "t.conf:5: range \"10.0.0.0-10.1.255.255\" overlaps \"10.0.2.0-10.0.255.255\""
            ),
            "{err}"
        );
    }

    #[test]
    fn range_duplicates_and_deletes() {
        let (g, notices) = geo(
            "ranges;\n1.0.0.0-1.0.0.9 a;\n1.0.0.0-1.0.0.9 b;\ndelete 1.0.0.0-1.0.0.9;\ndelete 2.0.0.0-2.0.0.1;\ndefault x;\ndefault y;",
        )
        .unwrap();
        assert_eq!(
            notices,
            [
                "t.conf:4: duplicate range \"1.0.0.0-1.0.0.9\", value: \"b\", old value: \"a\"",
                "t.conf:6: no address range \"2.0.0.0-2.0.0.1\" to delete",
                "t.conf:8: duplicate default geo range value: \"y\", old value: \"x\"",
            ]
        );
        assert_eq!(pick(&g, "1.0.0.5"), "y");
    }

    #[test]
    fn errors() {
        for (body, msg) in [
            (
                "10.0.0.0/33 x;",
                "t.conf:2: invalid network \"10.0.0.0/33\"",
            ),
            ("proxy nope;", "invalid network \"nope\""),
            (
                "10.0.0.0/8 x;\nranges;",
                "t.conf:3: the \"ranges\" directive must be the first",
            ),
            (
                "ranges;\n10.0.0.9-10.0.0.1 x;",
                "invalid range \"10.0.0.9-10.0.0.1\"",
            ),
            ("ranges;\n10.0.0.0/8 x;", "invalid range \"10.0.0.0/8\""),
            ("a b c;", "invalid number of the geo parameters"),
            ("a { }", "unexpected \"{\""),
        ] {
            let err = geo(body).err().unwrap_or_default();
            assert!(err.contains(msg), "{body}: {err}");
        }
    }
}
