//! The two listening addresses, checked before Pingora binds them, and port 0: a free port
//! the system picks, reported on standard output.
//!
//! Pingora binds in its service threads and panics there when it cannot (after half a minute
//! of retries on a taken port), which left a process serving only its admin listener
//! (decision 174), so each address is bound here first. Pingora also takes only an address
//! and reports no bound port, so for port 0 this process asks the system for a port and holds
//! it with a bound socket that never listens: it joins Pingora's listener through
//! `SO_REUSEPORT` (same user), while any other process's bind of that port fails until this
//! one exits (decision 222).

use std::net::SocketAddr;

use pingora::listeners::TcpSocketOptions;
use socket2::{Domain, Protocol, Socket, Type};

/// The addresses Pingora binds, with every port 0 replaced by the one picked.
pub struct Listeners {
    pub public: SocketAddr,
    pub admin: SocketAddr,
    /// The sockets holding picked ports; the ports are free again once these drop.
    holders: Vec<Socket>,
}

impl Listeners {
    /// Check that `public` and `admin` can be bound now and pick a port for each port 0.
    /// An upgrade binds nothing (the running process hands its sockets over), so it needs
    /// the ports named.
    pub fn reserve(public: SocketAddr, admin: SocketAddr, upgrade: bool) -> Result<Listeners, String> {
        let named = [("listen", public), ("admin_listen", admin)];
        if upgrade {
            return match named.iter().find(|(_, addr)| addr.port() == 0) {
                Some((field, addr)) => Err(format!(
                    "{field}: {addr} has port 0: an upgrade takes over the running process's ports, so name them"
                )),
                None => Ok(Listeners { public, admin, holders: Vec::new() }),
            };
        }
        let mut holders = Vec::new();
        let mut picked = Vec::new();
        for (field, addr) in named {
            if addr.port() == 0 {
                let holder =
                    hold_free_port(addr).map_err(|e| format!("{field}: no free port on {}: {e}", addr.ip()))?;
                let port = holder.local_addr().ok().and_then(|a| a.as_socket()).map_or(0, |a| a.port());
                picked.push(SocketAddr::new(addr.ip(), port));
                holders.push(holder);
            } else {
                // `std` binds with `SO_REUSEADDR`, as Pingora does, so a port in `TIME_WAIT`
                // still passes.
                std::net::TcpListener::bind(addr).map_err(|e| format!("{field}: {addr} cannot be bound: {e}"))?;
                picked.push(addr);
            }
        }
        Ok(Listeners { public: picked[0], admin: picked[1], holders })
    }

    /// How Pingora binds `addr`: sharing a held port when this process picked it.
    pub fn socket_options(&self, addr: SocketAddr) -> Option<TcpSocketOptions> {
        let held = self.holders.iter().any(|h| h.local_addr().ok().and_then(|a| a.as_socket()) == Some(addr));
        held.then(|| {
            let mut options = TcpSocketOptions::default();
            options.so_reuseport = Some(true);
            options
        })
    }

    /// The line `serve` prints on standard output once the addresses are known, so a script
    /// or test that asked for port 0 reads where to connect.
    pub fn report(&self) -> String {
        format!("tollgate: listen {} admin_listen {}", self.public, self.admin)
    }
}

/// A socket bound to `addr`'s address on a port the system picks, never listening:
/// `SO_REUSEPORT` without `SO_REUSEADDR`, so only a bind with `SO_REUSEPORT` by the same user
/// (Pingora's, in this process) shares the port.
fn hold_free_port(addr: SocketAddr) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn a_port_0_is_picked_held_against_other_binds_and_shared_with_a_reuseport_listener() {
        let l = Listeners::reserve(loopback(0), loopback(0), false).unwrap();
        assert_ne!(l.public.port(), 0);
        assert_ne!(l.admin.port(), 0);
        assert_ne!(l.public, l.admin);
        assert_eq!(l.report(), format!("tollgate: listen {} admin_listen {}", l.public, l.admin));
        // Another process's plain bind (with SO_REUSEADDR, as std and Pingora do) fails...
        assert!(std::net::TcpListener::bind(l.public).is_err(), "the picked port is held");
        // ...while the listener Pingora opens with the options given binds and accepts.
        let options = l.socket_options(l.public).expect("a held port is bound with SO_REUSEPORT");
        assert_eq!(options.so_reuseport, Some(true));
        let listener = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        listener.set_reuse_address(true).unwrap();
        listener.set_reuse_port(true).unwrap();
        listener.bind(&l.public.into()).unwrap();
        listener.listen(8).unwrap();
        let listener: std::net::TcpListener = listener.into();
        let _client = std::net::TcpStream::connect(l.public).unwrap();
        assert!(listener.accept().is_ok(), "connections reach the listener, not the holder");
        // Dropped, the port is anyone's again.
        drop((l, listener));
    }

    #[test]
    fn a_named_port_is_only_checked_and_a_taken_one_names_its_field() {
        let taken = std::net::TcpListener::bind(loopback(0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let err = Listeners::reserve(loopback(0), loopback(port), false).err().unwrap();
        assert!(err.starts_with(&format!("admin_listen: 127.0.0.1:{port} cannot be bound")), "{err}");
        drop(taken);
        let l = Listeners::reserve(loopback(port), loopback(0), false).unwrap();
        assert_eq!(l.public, loopback(port));
        assert!(l.socket_options(l.public).is_none(), "a named port is bound as before");
    }

    #[test]
    fn an_upgrade_refuses_port_0_and_binds_nothing() {
        let err = Listeners::reserve(loopback(0), loopback(9), true).err().unwrap();
        assert!(err.starts_with("listen: 127.0.0.1:0 has port 0: an upgrade"), "{err}");
        let l = Listeners::reserve(loopback(8), loopback(9), true).unwrap();
        assert_eq!((l.public.port(), l.admin.port()), (8, 9));
    }
}
