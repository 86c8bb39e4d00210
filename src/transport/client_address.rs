//! The client's address behind load balancers (issue 52, decision 212): the TCP peer, unless
//! that peer is a trusted proxy that names the client, in a PROXY protocol header on the
//! connection or in a forwarding header on the request. Anyone else's claims are ignored.

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use async_trait::async_trait;
use pingora::protocols::l4::socket::SocketAddr;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::{GetSocketDigest, SocketDigest};
use pingora::proxy::Session;
use tokio::io::AsyncReadExt;

use crate::config::{ClientAddressing, RealIpHeader, canonical_ip};

/// Most `X-Forwarded-For` entries looked at (a list is walked from its right end).
const MAX_FORWARDED: usize = 64;
/// Longest PROXY header read: v1 is at most 107 bytes; v2 carries TLVs a balancer adds.
const MAX_PROXY_HEADER: usize = 4096;

/// The address this request comes from, as far as the operator's trusted proxies say.
pub fn of_request(s: &Session, settings: &ClientAddressing) -> Option<IpAddr> {
    let peer = s.client_addr().and_then(|a| a.as_inet()).map(|a| canonical_ip(a.ip()))?;
    let Some(header) = settings.real_ip_header else { return Some(peer) };
    if !settings.trusts(peer) {
        return Some(peer);
    }
    let values = s.req_header().headers.get_all(header.name());
    let named = match header {
        RealIpHeader::XRealIp => values.iter().next().and_then(|v| v.to_str().ok()).and_then(parse_entry),
        RealIpHeader::XForwardedFor => {
            forwarded_client(values.iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')), settings)
        }
    };
    Some(named.unwrap_or(peer))
}

/// The client of an `X-Forwarded-For` list: walking from the right (the entry the trusted
/// peer appended), the first address that is not a trusted proxy. An entry that is not an
/// address ends the walk at the trusted address to its right; a list of trusted proxies only
/// names its leftmost.
fn forwarded_client<'a>(entries: impl Iterator<Item = &'a str>, settings: &ClientAddressing) -> Option<IpAddr> {
    let entries: Vec<&str> = entries.collect();
    let mut last_trusted = None;
    for entry in entries.iter().rev().take(MAX_FORWARDED) {
        let Some(addr) = parse_entry(entry) else { return last_trusted };
        if !settings.trusts(addr) {
            return Some(addr);
        }
        last_trusted = Some(addr);
    }
    last_trusted
}

/// `192.0.2.7`, `2001:db8::1`, `[2001:db8::1]:443` or `192.0.2.7:80`.
fn parse_entry(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<std::net::SocketAddr>().ok().map(|a| a.ip()))
        .map(canonical_ip)
}

/// Reads the PROXY protocol header (v1 or v2) a trusted load balancer sends first on each
/// connection, and makes its source address the connection's peer address. A connection from
/// an untrusted address, or without a whole, valid header within the deadline, is closed.
pub struct ProxyProtocol {
    settings: ClientAddressing,
    deadline: Duration,
}

impl ProxyProtocol {
    pub fn new(settings: ClientAddressing, deadline: Duration) -> Self {
        ProxyProtocol { settings, deadline }
    }
}

fn refused(why: String) -> Box<pingora::Error> {
    pingora::Error::explain(pingora::ErrorType::AcceptError, why)
}

#[async_trait]
impl pingora::listeners::PreTlsProcess for ProxyProtocol {
    async fn process(&self, stream: &mut L4Stream) -> pingora::Result<()> {
        let peer = stream.get_socket_digest().and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
        match peer {
            Some(ip) if self.settings.trusts(ip) => {}
            other => return Err(refused(format!("PROXY protocol from {other:?}, not a trusted proxy"))),
        }
        let source = tokio::time::timeout(self.deadline, read_header(stream))
            .await
            .map_err(|_| refused("no whole PROXY protocol header in time".into()))??;
        // A LOCAL header (a balancer's own health check) or an unknown family keeps the peer.
        if let Some(source) = source {
            let digest = SocketDigest::from_raw_fd(stream.as_raw_fd());
            let _ = digest.peer_addr.set(Some(SocketAddr::Inet(source)));
            stream.set_socket_digest(digest);
        }
        Ok(())
    }
}

/// Read one PROXY header off `stream`, giving back what followed it; its source address.
async fn read_header(stream: &mut L4Stream) -> pingora::Result<Option<std::net::SocketAddr>> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|e| refused(format!("PROXY header read: {e}")))?;
        if n == 0 {
            return Err(refused("closed before its PROXY protocol header".into()));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some((len, source)) = parse_proxy_header(&buf)? {
            stream.rewind(&buf[len..]);
            return Ok(source);
        }
        if buf.len() > MAX_PROXY_HEADER {
            return Err(refused("PROXY protocol header too long".into()));
        }
    }
}

/// `None` while incomplete; else the header's length and its source address, if any.
fn parse_proxy_header(buf: &[u8]) -> pingora::Result<Option<(usize, Option<std::net::SocketAddr>)>> {
    use ppp::{HeaderResult, PartialResult};
    let parsed = HeaderResult::parse(buf);
    if parsed.is_incomplete() {
        return Ok(None);
    }
    match parsed {
        HeaderResult::V1(Ok(h)) => {
            let source = match h.addresses {
                ppp::v1::Addresses::Tcp4(a) => Some(std::net::SocketAddr::new(a.source_address.into(), a.source_port)),
                ppp::v1::Addresses::Tcp6(a) => Some(std::net::SocketAddr::new(a.source_address.into(), a.source_port)),
                ppp::v1::Addresses::Unknown => None,
            };
            Ok(Some((h.header.len(), source)))
        }
        HeaderResult::V2(Ok(h)) => {
            let source = match (h.command, h.addresses) {
                (ppp::v2::Command::Proxy, ppp::v2::Addresses::IPv4(a)) => {
                    Some(std::net::SocketAddr::new(a.source_address.into(), a.source_port))
                }
                (ppp::v2::Command::Proxy, ppp::v2::Addresses::IPv6(a)) => {
                    Some(std::net::SocketAddr::new(a.source_address.into(), a.source_port))
                }
                _ => None,
            };
            Ok(Some((h.len(), source)))
        }
        HeaderResult::V1(Err(e)) => Err(refused(format!("bad PROXY v1 header: {e}"))),
        HeaderResult::V2(Err(e)) => Err(refused(format!("bad PROXY v2 header: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusting(nets: &[&str]) -> ClientAddressing {
        ClientAddressing {
            trusted_proxies: nets.iter().map(|n| n.parse().unwrap_or_else(|_| panic!("{n}"))).collect(),
            real_ip_header: Some(RealIpHeader::XForwardedFor),
            proxy_protocol: false,
        }
    }

    fn client(list: &str, settings: &ClientAddressing) -> Option<IpAddr> {
        forwarded_client(list.split(','), settings)
    }

    #[test]
    fn the_client_is_the_first_untrusted_address_from_the_right() {
        let s = trusting(&["10.0.0.0/8"]);
        // The client may prepend anything; only what trusted proxies appended is believed.
        assert_eq!(client("1.2.3.4, 203.0.113.9, 10.0.0.2", &s), "203.0.113.9".parse().ok());
        assert_eq!(client("203.0.113.9", &s), "203.0.113.9".parse().ok());
        assert_eq!(client("10.0.0.7, 10.0.0.2", &s), "10.0.0.7".parse().ok());
        assert_eq!(client("[2001:db8::1]:443, 10.0.0.2", &s), "2001:db8::1".parse().ok());
        assert_eq!(client("::ffff:198.51.100.4", &s), "198.51.100.4".parse().ok());
    }

    #[test]
    fn an_entry_that_is_not_an_address_stops_at_the_trusted_one_to_its_right() {
        let s = trusting(&["10.0.0.0/8"]);
        assert_eq!(client("203.0.113.9, garbage, 10.0.0.2", &s), "10.0.0.2".parse().ok());
        assert_eq!(client("garbage", &s), None);
        assert_eq!(client("", &s), None);
    }

    #[test]
    fn proxy_headers_of_both_versions_give_their_source_and_length() {
        let v1 = b"PROXY TCP4 198.51.100.22 203.0.113.7 35646 80\r\nGET / HTTP/1.1\r\n";
        let (len, src) = parse_proxy_header(v1).ok().flatten().unwrap_or_default();
        assert_eq!(&v1[len..len + 3], b"GET");
        assert_eq!(src, "198.51.100.22:35646".parse().ok());
        assert!(parse_proxy_header(&v1[..20]).ok().flatten().is_none(), "incomplete waits for more");

        let header = ppp::v2::Builder::with_addresses(
            ppp::v2::Version::Two | ppp::v2::Command::Proxy,
            ppp::v2::Protocol::Stream,
            (
                "[2001:db8::7]:4711".parse::<std::net::SocketAddr>().unwrap_or_else(|_| unreachable!()),
                "[2001:db8::1]:443".parse::<std::net::SocketAddr>().unwrap_or_else(|_| unreachable!()),
            ),
        )
        .build()
        .unwrap_or_default();
        let mut v2 = header.clone();
        v2.extend_from_slice(b"GET /");
        let (len, src) = parse_proxy_header(&v2).ok().flatten().unwrap_or_default();
        assert_eq!(len, header.len());
        assert_eq!(src, "[2001:db8::7]:4711".parse().ok());
        assert!(parse_proxy_header(b"GET / HTTP/1.1\r\n\r\n").is_err(), "HTTP without a header is refused");
    }
}
