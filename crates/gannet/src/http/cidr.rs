//! Address blocks as nginx's configs write them, `address` or `address/bits`, IPv4 or IPv6
//! (nginx's `ngx_ptocidr`): the rules of `allow` / `deny`, the networks and trusted
//! proxies of `geo`, `set_real_ip_from`; and the walk through an X-Forwarded-For list
//! from trusted proxy to client that `geo` and `real_ip_header` share.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cidr {
    V4 { net: u32, bits: u8 },
    V6 { net: u128, bits: u8 },
}

impl Cidr {
    /// `address` or `address/bits`, with whether the bits past the prefix were all zero
    /// (when not, they are cleared and nginx warns "low address bits ... are meaningless").
    pub fn parse(text: &str) -> Option<(Cidr, bool)> {
        let (addr, bits) = match text.split_once('/') {
            Some((a, b)) if !b.is_empty() && b.bytes().all(|c| c.is_ascii_digit()) => {
                (a, Some(b.parse::<u8>().ok()?))
            }
            Some(_) => return None,
            None => (text, None),
        };
        if let Ok(v4) = addr.parse::<Ipv4Addr>() {
            let bits = bits.unwrap_or(32);
            if bits > 32 {
                return None;
            }
            let a = u32::from(v4);
            let net = a & mask4(bits);
            Some((Cidr::V4 { net, bits }, net == a))
        } else if let Ok(v6) = addr.parse::<Ipv6Addr>() {
            let bits = bits.unwrap_or(128);
            if bits > 128 {
                return None;
            }
            let a = u128::from(v6);
            let net = a & mask6(bits);
            Some((Cidr::V6 { net, bits }, net == a))
        } else {
            None
        }
    }

    /// Whether `ip` (already [`unmapped`]) is in the block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (*self, ip) {
            (Cidr::V4 { net, bits }, IpAddr::V4(a)) => u32::from(a) & mask4(bits) == net,
            (Cidr::V6 { net, bits }, IpAddr::V6(a)) => u128::from(a) & mask6(bits) == net,
            _ => false,
        }
    }
}

pub fn mask4(bits: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0)
}

pub fn mask6(bits: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0)
}

/// An IPv4-mapped IPv6 address as the IPv4 address it carries, as nginx judges clients.
pub fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// An element of an X-Forwarded-For list as nginx's `ngx_parse_addr_port` reads it:
/// `addr`, `addr:port`, `[v6]` or `[v6]:port` (port 0 when none is given).
fn parse_forwarded(s: &str) -> Option<SocketAddr> {
    s.parse::<SocketAddr>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 0)))
        .or_else(|| {
            let ip = s.strip_prefix('[')?.strip_suffix(']')?.parse().ok()?;
            Some(SocketAddr::new(ip, 0))
        })
}

/// The address `peer` speaks for, as nginx's `ngx_http_get_forwarded_addr`: when `peer` is
/// trusted, the last element of `list` (separated by commas or spaces); with `recursive`,
/// on from the right as long as the address in hand is trusted too. `None` when `peer` is
/// not trusted or the last element is not an address; an element further left that is not
/// one ends the walk at what was found.
pub fn forwarded(
    peer: SocketAddr,
    list: &str,
    trusted: impl Fn(IpAddr) -> bool,
    recursive: bool,
) -> Option<SocketAddr> {
    let mut elements = list.split([',', ' ']).filter(|s| !s.is_empty()).rev();
    let mut found = None;
    let mut addr = peer;
    while trusted(addr.ip()) {
        let Some(next) = elements.next().and_then(parse_forwarded) else {
            break;
        };
        addr = next;
        found = Some(next);
        if !recursive {
            break;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }

    #[test]
    fn parses_as_nginx() {
        assert_eq!(
            Cidr::parse("10.0.0.0/8"),
            Some((
                Cidr::V4 {
                    net: 0x0a00_0000,
                    bits: 8
                },
                true
            ))
        );
        assert_eq!(
            Cidr::parse("10.1.2.3/8"),
            Some((
                Cidr::V4 {
                    net: 0x0a00_0000,
                    bits: 8
                },
                false
            ))
        );
        assert_eq!(
            Cidr::parse("1.2.3.4"),
            Some((
                Cidr::V4 {
                    net: 0x0102_0304,
                    bits: 32
                },
                true
            ))
        );
        assert!(matches!(
            Cidr::parse("2001:db8::/32"),
            Some((Cidr::V6 { bits: 32, .. }, true))
        ));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0/8",
            "x",
            "1.2.3.4/a",
        ] {
            assert_eq!(Cidr::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn forwarded_walks_from_the_right() {
        let peer: SocketAddr = "127.0.0.2:5000"
            .parse()
            .unwrap_or(SocketAddr::from(([0; 4], 0)));
        let trusted = |a: IpAddr| a == ip("127.0.0.2") || a == ip("10.0.0.1");
        let walk =
            |list: &str, rec: bool| forwarded(peer, list, trusted, rec).map(|a| a.to_string());
        assert_eq!(walk("1.2.3.4", false).as_deref(), Some("1.2.3.4:0"));
        assert_eq!(
            walk("1.2.3.4, 10.0.0.1", false).as_deref(),
            Some("10.0.0.1:0")
        );
        assert_eq!(
            walk("1.2.3.4, 10.0.0.1", true).as_deref(),
            Some("1.2.3.4:0")
        );
        assert_eq!(walk("junk, 10.0.0.1", true).as_deref(), Some("10.0.0.1:0"));
        assert_eq!(walk("1.2.3.4:80", false).as_deref(), Some("1.2.3.4:80"));
        assert_eq!(walk("[::1]:81", false).as_deref(), Some("[::1]:81"));
        assert_eq!(walk("[::1]", false).as_deref(), Some("[::1]:0"));
        assert_eq!(walk("junk", false), None);
        assert_eq!(walk("", false), None);
        let stranger: SocketAddr = "127.0.0.9:5000".parse().unwrap_or(peer);
        assert_eq!(forwarded(stranger, "1.2.3.4", trusted, false), None);
    }

    #[test]
    fn contains_by_family() {
        let (ten, _) = Cidr::parse("10.0.0.0/8").unwrap_or((Cidr::V4 { net: 0, bits: 32 }, true));
        assert!(ten.contains(ip("10.9.9.9")));
        assert!(!ten.contains(ip("11.0.0.1")));
        assert!(!ten.contains(ip("::ffff:10.0.0.1")));
        assert!(ten.contains(unmapped(ip("::ffff:10.0.0.1"))));
        let (all6, _) = Cidr::parse("::/0").unwrap_or((Cidr::V4 { net: 0, bits: 32 }, true));
        assert!(all6.contains(ip("2001:db8::1")));
        assert!(!all6.contains(ip("127.0.0.1")));
    }
}
