//! A loopback port held by the test for a process it starts, and may start again, there.
//!
//! Picking a free port by binding `:0` and closing it before the process binds it is a race:
//! anything on the machine may take the port in between. A [`ReservedPort`] instead stays
//! bound (with `SO_REUSEADDR`) and never listens, for as long as the test holds it:
//! - the kernel gives the port to no one else: `bind(:0)` and the ephemeral port of an
//!   outgoing connection both skip a port that a bound socket holds;
//! - a connection to it is refused while no process listens there, as on a free port;
//! - a server that also sets `SO_REUSEADDR` binds and listens on it (Linux allows any number
//!   of such sockets on one address as long as at most one listens). Tokio's and std's
//!   `TcpListener::bind`, Go's `net.Listen` (etcd) and Python's `http.server` all set it.
//!
//! So a process can be killed and started again on the same address with no window in which
//! the port is free for someone else.
use std::net::{Ipv4Addr, SocketAddr};

pub struct ReservedPort {
    /// Bound, never listening: holding it is what reserves the port.
    _socket: tokio::net::TcpSocket,
    addr: SocketAddr,
}

impl ReservedPort {
    /// Reserves a free port on 127.0.0.1.
    pub fn new() -> Self {
        Self::try_new().expect("reserving a loopback port")
    }

    pub fn try_new() -> std::io::Result<Self> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let addr = socket.local_addr()?;
        Ok(Self { _socket: socket, addr })
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Default for ReservedPort {
    fn default() -> Self {
        Self::new()
    }
}
