//! `quic_bpf on` (nginx's ngx_quic_bpf_module): the packets of a QUIC connection reach the
//! worker whose endpoint owns it, whatever address they come from.
//!
//! Each worker reads its own SO_REUSEPORT socket of a `listen ... quic` address, and the
//! kernel picks the socket of a datagram by its 4-tuple hash: a client that moves (a new
//! port after a NAT rebinding, a new network) would land on another worker's endpoint,
//! which does not know the connection. So the connection IDs an endpoint chooses carry the
//! place of its socket in the address's reuseport group ([`Cids`]), and a classic BPF
//! program on the group ([`attach`]) reads that place from a packet's destination
//! connection ID and returns it: for a reuseport program, the index of the socket to
//! deliver to. Packets whose destination ID the client chose (Initial and 0-RTT), and any
//! packet too short or not ours, get an index past the end of the group, which makes the
//! kernel fall back to its hash (`run_bpf_filter` returns no socket for an index at or
//! past the group's size, and `reuseport_select_sock` then hashes) - as nginx's eBPF
//! program leaves them to the default route. The index is the order the sockets joined
//! the group, i.e. the order they were bound (`runtime::listener::bind_for` binds one per
//! worker in worker order, and a reload keeps them and only appends): the test below
//! checks that on real sockets.
//!
//! nginx loads an eBPF program with a socket map keyed by a cookie in its 20-byte
//! connection IDs; a classic program needs no map, no BPF toolchain and no privileges,
//! so the IDs carry the socket's index instead, in quinn's 8-byte IDs.

use quinn::{ConnectionId, ConnectionIdGenerator};
use socket2::SockRef;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// The length of the connection IDs the server chooses (quinn's default length).
pub const CID_LEN: usize = 8;

/// How the packets of a QUIC socket's connections find it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steering {
    /// By the kernel's 4-tuple hash over the address's sockets: a client that changes
    /// address may reach another worker (which is why clients are told not to migrate).
    Hash,
    /// The socket is the address's only one: every packet comes to it.
    Alone,
    /// The group's program steers by connection ID: this socket's IDs carry its index.
    Cid(u16),
}

impl Steering {
    /// Whether a client that changes address still reaches this socket's endpoint.
    pub fn follows_migration(self) -> bool {
        self != Steering::Hash
    }
}

/// quinn's generator of this endpoint's connection IDs: the index of its socket (two
/// bytes, big-endian: the program's halfword load), then random bytes.
///
/// The index is the same in every ID of every connection of the endpoint, so an observer
/// can tell the worker (one of a few), as nginx's IDs show their socket's cookie; the rest
/// cannot be linked.
#[derive(Debug)]
pub struct Cids {
    index: u16,
}

impl Cids {
    pub fn new(index: u16) -> Cids {
        Cids { index }
    }
}

impl ConnectionIdGenerator for Cids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut id = [0u8; CID_LEN];
        id[..2].copy_from_slice(&self.index.to_be_bytes());
        if aws_lc_rs::rand::fill(&mut id[2..]).is_err() {
            // The system's generator failed: distinct IDs still, if guessable ones.
            fastrand::fill(&mut id[2..]);
        }
        ConnectionId::new(&id)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The returned index for "not ours": past any group's end, so the kernel hashes.
const FALLBACK: u32 = u32::MAX;

/// A long header's packet type bits, and QUIC v1's Handshake type: the client sends it to
/// the ID the server chose. (Initial and 0-RTT go to the ID the client made up; Retry and
/// version negotiation only come from servers.)
const LONG_TYPE: u32 = 0x30;
const HANDSHAKE: u32 = 0x20;

fn op(code: u32) -> u16 {
    // The classic BPF codes all fit in 16 bits (linux/bpf_common.h).
    code as u16
}

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: op(code),
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: op(code),
        jt,
        jf,
        k,
    }
}

/// The program. It sees the UDP payload (the kernel pulls the UDP header first), so
/// offset 0 is the QUIC packet's first byte. A short header (bit 0x80 clear) is followed
/// by the destination ID; a long one by a 4-byte version, the ID's length (byte 5) and
/// the ID (byte 6 on). Jumps count instructions after the next one.
fn program() -> Vec<libc::sock_filter> {
    use libc::{
        BPF_A, BPF_ABS, BPF_ALU, BPF_AND, BPF_B, BPF_H, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_JSET, BPF_K,
        BPF_LD, BPF_LEN, BPF_RET, BPF_W,
    };
    let cid = CID_LEN as u32;
    vec![
        stmt(BPF_LD | BPF_W | BPF_LEN, 0), // 0
        // Shorter than a short header with our ID: not ours.
        jump(BPF_JMP | BPF_JGE | BPF_K, 1 + cid, 0, 12), // 1
        stmt(BPF_LD | BPF_B | BPF_ABS, 0),               // 2
        jump(BPF_JMP | BPF_JSET | BPF_K, 0x80, 2, 0),    // 3
        // Short header: the ID's first two bytes are the index.
        stmt(BPF_LD | BPF_H | BPF_ABS, 1), // 4
        stmt(BPF_RET | BPF_A, 0),          // 5
        // Long header: a Handshake packet with an ID of our length, whole in the packet.
        stmt(BPF_ALU | BPF_AND | BPF_K, LONG_TYPE), // 6
        jump(BPF_JMP | BPF_JEQ | BPF_K, HANDSHAKE, 0, 6), // 7
        stmt(BPF_LD | BPF_B | BPF_ABS, 5),          // 8
        jump(BPF_JMP | BPF_JEQ | BPF_K, cid, 0, 4), // 9
        stmt(BPF_LD | BPF_W | BPF_LEN, 0),          // 10
        jump(BPF_JMP | BPF_JGE | BPF_K, 6 + cid, 0, 2), // 11
        stmt(BPF_LD | BPF_H | BPF_ABS, 6),          // 12
        stmt(BPF_RET | BPF_A, 0),                   // 13
        stmt(BPF_RET | BPF_K, FALLBACK),            // 14
    ]
}

/// Attach the program to the reuseport group `sock` is in (one socket of it is enough:
/// the program is the group's).
pub fn attach(sock: SockRef<'_>) -> io::Result<()> {
    let mut filter = program();
    let prog = libc::sock_fprog {
        len: filter.len() as libc::c_ushort,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: the fd is the open socket `sock` borrows; `prog` points at `filter`'s
    // instructions, its length theirs, and both live across the call (the kernel copies
    // the program); the size passed is that of the sock_fprog.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Take the program off `sock`'s group (a reload turned `quic_bpf` off): the kernel
/// hashes again. Nothing attached is not an error, nor a kernel older than 5.3, which
/// cannot take one off (a program a previous config attached then stays; the IDs it
/// looks for are gone with the endpoints that made them, and quinn's own IDs mostly name
/// no socket, which hashes).
pub fn detach(sock: SockRef<'_>) -> io::Result<()> {
    let none: libc::c_int = 0;
    // SAFETY: the fd is the open socket `sock` borrows; the option reads a c_int (ignored)
    // that lives across the call, and its size is passed with it.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_DETACH_REUSEPORT_BPF,
            (&none as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOPROTOOPT)) {
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::{Domain, Protocol, Socket, Type};
    use std::net::{SocketAddr, UdpSocket};

    /// Sockets bound one after the other to one port with SO_REUSEPORT.
    fn group(n: usize) -> (Vec<UdpSocket>, SocketAddr) {
        let mut socks: Vec<UdpSocket> = Vec::new();
        let mut at: SocketAddr = "127.0.0.1:0".parse().unwrap();
        for _ in 0..n {
            let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
            s.set_reuse_port(true).unwrap();
            s.bind(&at.into()).unwrap();
            at = s.local_addr().unwrap().as_socket().unwrap();
            s.set_nonblocking(true).unwrap();
            socks.push(s.into());
        }
        (socks, at)
    }

    fn short_header(index: u16) -> Vec<u8> {
        let mut cid = Cids::new(index);
        let mut p = vec![0x40];
        p.extend_from_slice(&cid.generate_cid());
        p.extend_from_slice(&[0u8; 24]);
        p
    }

    fn long_header(kind: u8, cid: &[u8]) -> Vec<u8> {
        let mut p = vec![0xc0 | (kind << 4), 0, 0, 0, 1, cid.len() as u8];
        p.extend_from_slice(cid);
        p.extend_from_slice(&[0u8; 24]);
        p
    }

    /// The socket (its index in `socks`) `packet` is delivered to.
    fn lands(socks: &[UdpSocket], at: SocketAddr, from: &UdpSocket, packet: &[u8]) -> usize {
        from.send_to(packet, at).unwrap();
        let mut buf = [0u8; 128];
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            for (i, s) in socks.iter().enumerate() {
                if let Ok((n, _)) = s.recv_from(&mut buf) {
                    assert_eq!(&buf[..n], packet);
                    return i;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("packet {packet:02x?} was not delivered");
    }

    #[test]
    fn ids_carry_the_index_and_are_otherwise_random() {
        let mut g = Cids::new(0x0102);
        let (a, b) = (g.generate_cid(), g.generate_cid());
        assert_eq!((a.len(), g.cid_len()), (CID_LEN, CID_LEN));
        assert_eq!(&a[..2], &[1, 2]);
        assert_eq!(&b[..2], &[1, 2]);
        assert_ne!(&a[2..], &b[2..]);
    }

    /// The program's index is the order of binding, and what is not ours is hashed
    /// (delivered, not dropped), over real sockets.
    #[test]
    fn program_steers_by_the_id_in_bind_order() {
        let (socks, at) = group(3);
        attach(SockRef::from(&socks[1])).unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in [2u16, 0, 1, 2, 1, 0] {
            assert_eq!(lands(&socks, at, &client, &short_header(i)), usize::from(i));
            let cid = Cids::new(i).generate_cid();
            assert_eq!(
                lands(&socks, at, &client, &long_header(2, &cid)),
                usize::from(i)
            );
        }
        // One client port, one hash: what the program leaves to the kernel lands on one
        // socket, whatever the ID says.
        let hashed = lands(
            &socks,
            at,
            &client,
            &long_header(0, &[0, 1, 2, 3, 4, 5, 6, 7]),
        );
        let (other, third) = ((hashed as u16 + 1) % 3, (hashed as u16 + 2) % 3);
        for packet in [
            long_header(0, &Cids::new(other).generate_cid()),
            long_header(0, &Cids::new(third).generate_cid()),
            long_header(1, &Cids::new(other).generate_cid()),
            long_header(2, &[0, 1, 2, 3]),
            short_header(7),
            vec![0x40, 0, 1],
        ] {
            assert_eq!(lands(&socks, at, &client, &packet), hashed);
        }
        detach(SockRef::from(&socks[0])).unwrap();
        detach(SockRef::from(&socks[0])).unwrap();
        for i in [0u16, 1, 2] {
            assert_eq!(lands(&socks, at, &client, &short_header(i)), hashed);
        }
    }
}
