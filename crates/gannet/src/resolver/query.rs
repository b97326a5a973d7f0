//! One name asked of the name servers the way nginx's resolver asks it (ngx_resolver.c:
//! `ngx_resolve_name_locked`, `ngx_resolver_resend`, `ngx_resolver_process_a`): the DNS
//! messages are hickory-proto's, the exchange and the reading of the answers are nginx's.
//!
//! - A and AAAA are sent together (A first) to one server over UDP; a truncated answer is
//!   asked again over TCP of the same server, and stays on TCP.
//! - What is still unanswered when the resend time (5 s) comes is sent to the next server.
//! - An answer is used only if it is one to this question with this id; a format error, an
//!   unknown response code, a record of another class or an invalid address record are
//!   ignored (the query waits on), as nginx.
//! - The first answer to come decides with the other: an error (SERVFAIL, NXDOMAIN...) for
//!   either fails the name; two empty answers are "Host not found"; addresses of either are
//!   the name's. A CNAME is followed only when the answer that completes the pair has one and
//!   no address was found: nginx keeps no CNAME from the first answer.

use super::Failure;
use hickory_resolver::proto::op::{Message, MessageType, OpCode, Query};
use hickory_resolver::proto::rr::{DNSClass, Name, RData, RecordType};
use hickory_resolver::proto::serialize::binary::BinDecodable;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// nginx's resend time: a server that has not answered by then is left for the next.
const RESEND: Duration = Duration::from_secs(5);

/// nginx's NGX_RESOLVER_UDP_SIZE.
const UDP_SIZE: usize = 4096;

/// What a name resolved to: its addresses, or the name it is an alias of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Addrs(Vec<IpAddr>),
    Cname(String),
}

/// One question (A or AAAA) of the name.
struct Asked {
    kind: RecordType,
    id: u16,
    bytes: Vec<u8>,
    /// Asked over TCP since its UDP answer came truncated.
    tcp: bool,
    /// Its addresses once answered (nginx's `naddrs` other than -1).
    answer: Option<Vec<IpAddr>>,
}

/// What came while waiting for answers.
enum Event {
    Udp(std::io::Result<usize>),
    /// A TCP answer (`None`: the connection failed).
    Tcp(Option<Vec<u8>>),
}

/// What an answer leads to.
#[derive(Debug, PartialEq)]
enum Step {
    Wait,
    /// Ask this question again over TCP.
    Tcp(usize),
    Done(Result<(Found, u32), Failure>),
}

struct Lookup {
    key: String,
    asked: Vec<Asked>,
    /// An error for the first answer, kept until the other comes (nginx's `rn->code`).
    code: Option<Failure>,
    /// The least TTL of the records read.
    ttl: u32,
}

/// One recursive question for `name`'s `kind` records under a random id: the id, and the
/// message as sent (`None` when it cannot be encoded).
pub fn question(name: Name, kind: RecordType) -> (u16, Option<Vec<u8>>) {
    let id = fastrand::u16(..);
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name, kind));
    (id, m.to_vec().ok())
}

/// Resolve `key` (lower case, no final dot) asking `servers` in turn from `first`; the
/// answer and its TTL in seconds. Runs until it has an answer: the caller bounds it.
pub async fn resolve(
    servers: &[SocketAddr],
    first: usize,
    (v4, v6): (bool, bool),
    key: &str,
) -> Result<(Found, u32), Failure> {
    let Ok(name) = Name::from_ascii(format!("{key}.")) else {
        // Not a name that can be asked (nginx: "invalid name", Host not found).
        return Err(Failure::NotFound);
    };
    let mut n = Lookup {
        key: key.to_string(),
        asked: Vec::with_capacity(2),
        code: None,
        ttl: u32::MAX,
    };
    for (on, kind) in [(v4, RecordType::A), (v6, RecordType::AAAA)] {
        if !on {
            continue;
        }
        let (id, Some(bytes)) = question(name.clone(), kind) else {
            return Err(Failure::NotFound);
        };
        n.asked.push(Asked {
            kind,
            id,
            bytes,
            tcp: false,
            answer: None,
        });
    }
    let mut turn = first;
    loop {
        let server = servers[turn % servers.len()];
        turn = turn.wrapping_add(1);
        if let Some(done) = n.ask(server).await {
            return done;
        }
    }
}

impl Lookup {
    /// Send what is unanswered to `server` and read its answers until the resend time:
    /// the name's answer, or `None` to go on with the next server.
    async fn ask(&mut self, server: SocketAddr) -> Option<Result<(Found, u32), Failure>> {
        let resend = tokio::time::Instant::now() + RESEND;
        let udp = match self.asked.iter().any(|a| a.answer.is_none() && !a.tcp) {
            true => udp_socket(server).await,
            false => None,
        };
        let mut tcp = tokio::task::JoinSet::new();
        for a in self.asked.iter().filter(|a| a.answer.is_none()) {
            match (a.tcp, &udp) {
                (true, _) => {
                    tcp.spawn(tcp_ask(server, a.bytes.clone()));
                }
                (false, Some(s)) => {
                    let _ = s.send(&a.bytes).await;
                }
                (false, None) => {}
            }
        }
        let mut udp_live = udp.is_some();
        let mut buf = vec![0u8; UDP_SIZE];
        loop {
            let event = tokio::select! {
                _ = tokio::time::sleep_until(resend) => return None,
                r = recv(udp.as_ref().filter(|_| udp_live), &mut buf) => Event::Udp(r),
                Some(r) = tcp.join_next(), if !tcp.is_empty() => Event::Tcp(r.ok().flatten()),
            };
            let step = match event {
                Event::Udp(Ok(len)) => self.process(&buf[..len], false),
                // ICMP unreachable and the like: nothing more comes on it (nginx waits
                // for the resend time too).
                Event::Udp(Err(_)) => {
                    udp_live = false;
                    continue;
                }
                Event::Tcp(Some(answer)) => self.process(&answer, true),
                Event::Tcp(None) => continue,
            };
            match step {
                Step::Wait => {}
                Step::Tcp(i) => {
                    self.asked[i].tcp = true;
                    tcp.spawn(tcp_ask(server, self.asked[i].bytes.clone()));
                }
                Step::Done(done) => return Some(done),
            }
        }
    }

    fn pending(&self) -> bool {
        self.asked.iter().any(|a| a.answer.is_none())
    }

    /// Every address found, A before AAAA.
    fn addrs(&self) -> Vec<IpAddr> {
        self.asked
            .iter()
            .filter_map(|a| a.answer.as_ref())
            .flatten()
            .copied()
            .collect()
    }

    /// One answer read, as `ngx_resolver_process_response` and `ngx_resolver_process_a`.
    fn process(&mut self, buf: &[u8], tcp: bool) -> Step {
        let Ok(m) = Message::from_bytes(buf) else {
            return Step::Wait;
        };
        if m.message_type() != MessageType::Response
            || m.op_code() != OpCode::Query
            || (m.truncated() && tcp)
        {
            return Step::Wait;
        }
        let code = match u16::from(m.response_code()) {
            0 => None,
            2 => Some(Failure::ServFail),
            3 => Some(Failure::NotFound),
            4 => Some(Failure::NotImplemented),
            5 => Some(Failure::Refused),
            // A format error or an unknown code: logged and ignored by nginx.
            _ => return Step::Wait,
        };
        let [q] = m.queries() else {
            return Step::Wait;
        };
        let asked_name = q.name().to_ascii();
        if q.query_class() != DNSClass::IN
            || !asked_name
                .trim_end_matches('.')
                .eq_ignore_ascii_case(&self.key)
        {
            return Step::Wait;
        }
        let Some(i) = self
            .asked
            .iter()
            .position(|a| a.kind == q.query_type() && a.answer.is_none())
        else {
            return Step::Wait;
        };
        if self.asked[i].id != m.id() || (m.truncated() && self.asked[i].tcp) {
            return Step::Wait;
        }
        if m.truncated() {
            return Step::Tcp(i);
        }
        let mut code = code.or(self.code);
        if code.is_none() && m.answers().is_empty() {
            self.asked[i].answer = Some(Vec::new());
            if self.pending() {
                return Step::Wait;
            }
            let addrs = self.addrs();
            if !addrs.is_empty() {
                return Step::Done(Ok((Found::Addrs(addrs), self.ttl)));
            }
            code = Some(Failure::NotFound);
        }
        if let Some(code) = code {
            self.asked[i].answer = Some(Vec::new());
            if self.pending() {
                self.code = Some(code);
                return Step::Wait;
            }
            return Step::Done(Err(code));
        }
        let kind = self.asked[i].kind;
        let (mut addrs, mut cname) = (Vec::new(), None);
        for r in m.answers() {
            if r.dns_class() != DNSClass::IN {
                return Step::Wait;
            }
            self.ttl = self.ttl.min(r.ttl());
            match (r.record_type(), r.data()) {
                (RecordType::A, RData::A(a)) if kind == RecordType::A => {
                    addrs.push(IpAddr::V4(a.0));
                }
                (RecordType::AAAA, RData::AAAA(a)) if kind == RecordType::AAAA => {
                    addrs.push(IpAddr::V6(a.0));
                }
                // An address of the other family, or of the wrong length: an invalid
                // answer, ignored.
                (RecordType::A | RecordType::AAAA, _) => return Step::Wait,
                (RecordType::CNAME, RData::CNAME(c)) => cname = Some(c.0.to_ascii()),
                _ => {}
            }
        }
        self.asked[i].answer = Some(addrs);
        if !self.pending() {
            let addrs = self.addrs();
            if !addrs.is_empty() {
                return Step::Done(Ok((Found::Addrs(addrs), self.ttl)));
            }
        }
        match cname {
            Some(c) if !self.pending() => {
                let c = c.trim_end_matches('.').to_ascii_lowercase();
                Step::Done(Ok((Found::Cname(c), self.ttl)))
            }
            // Addresses waiting for the other answer; or neither an address nor a CNAME
            // (nginx logs it and waits on).
            _ => Step::Wait,
        }
    }
}

/// A UDP socket connected to `server` (so that only its datagrams are read).
pub(super) async fn udp_socket(server: SocketAddr) -> Option<tokio::net::UdpSocket> {
    let bind: SocketAddr = match server {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = tokio::net::UdpSocket::bind(bind).await.ok()?;
    sock.connect(server).await.ok()?;
    Some(sock)
}

async fn recv(sock: Option<&tokio::net::UdpSocket>, buf: &mut [u8]) -> std::io::Result<usize> {
    match sock {
        Some(s) => s.recv(buf).await,
        None => std::future::pending().await,
    }
}

/// One question over TCP (two-byte length before each message): its answer, or `None`.
async fn tcp_ask(server: SocketAddr, query: Vec<u8>) -> Option<Vec<u8>> {
    let mut s = tokio::net::TcpStream::connect(server).await.ok()?;
    let len = u16::try_from(query.len()).ok()?;
    let mut out = Vec::with_capacity(query.len() + 2);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&query);
    s.write_all(&out).await.ok()?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.ok()?;
    let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut answer).await.ok()?;
    Some(answer)
}
