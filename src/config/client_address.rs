//! Where a client's address comes from behind a load balancer (issue 52): the TCP peer, a
//! PROXY protocol header, or a forwarding header, the last two believed only from the
//! operator's trusted proxies. The address feeds the connection gate's per-address budget and
//! the access line.

use std::net::IpAddr;

use ipnet::IpNet;

use super::Problems;

/// The request header a trusted proxy names the client in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RealIpHeader {
    /// `X-Forwarded-For`: a list, each proxy appending the address it received from.
    XForwardedFor,
    /// `X-Real-IP`: one address, set by the proxy in front.
    XRealIp,
}

impl RealIpHeader {
    pub fn name(self) -> &'static str {
        match self {
            RealIpHeader::XForwardedFor => "x-forwarded-for",
            RealIpHeader::XRealIp => "x-real-ip",
        }
    }
}

/// Checked `client.trusted_proxies`, `client.real_ip_header` and `client.proxy_protocol`.
#[derive(Debug, Clone, Default)]
pub struct ClientAddressing {
    /// Senders whose PROXY header or forwarding header is believed. Empty: none is.
    pub trusted_proxies: Vec<IpNet>,
    pub real_ip_header: Option<RealIpHeader>,
    /// Every connection to the public listener starts with a PROXY protocol header (v1 or
    /// v2), and comes from a trusted proxy.
    pub proxy_protocol: bool,
}

impl ClientAddressing {
    pub fn trusts(&self, addr: IpAddr) -> bool {
        let addr = canonical(addr);
        self.trusted_proxies.iter().any(|net| net.contains(&addr))
    }
}

/// An IPv4 address an IPv6 socket reports as `::ffff:a.b.c.d` is that IPv4 address.
pub fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

pub(super) fn check(
    p: &mut Problems,
    trusted: &[String],
    header: Option<&str>,
    proxy_protocol: bool,
) -> ClientAddressing {
    let mut nets = Vec::new();
    for (i, entry) in trusted.iter().enumerate() {
        let parsed = entry.parse::<IpNet>().or_else(|_| entry.parse::<IpAddr>().map(IpNet::from));
        match parsed {
            Ok(net) => nets.push(net.trunc()),
            Err(_) => p.add(
                format!("client.trusted_proxies[{i}]"),
                format!("`{entry}` is not an address or a CIDR range (e.g. 10.0.0.0/8, 192.0.2.7, fd00::/8)"),
            ),
        }
    }
    let real_ip_header = match header.map(str::to_ascii_lowercase).as_deref() {
        None => (!trusted.is_empty()).then_some(RealIpHeader::XForwardedFor),
        Some("x-forwarded-for") => Some(RealIpHeader::XForwardedFor),
        Some("x-real-ip") => Some(RealIpHeader::XRealIp),
        Some("none") => None,
        Some(other) => {
            p.add("client.real_ip_header", format!("`{other}` is not one of x-forwarded-for, x-real-ip, none"));
            None
        }
    };
    if header.is_some_and(|h| !h.eq_ignore_ascii_case("none")) && trusted.is_empty() {
        p.add("client.real_ip_header", "is read only from client.trusted_proxies, which is empty");
    }
    if proxy_protocol && trusted.is_empty() {
        p.add(
            "client.proxy_protocol",
            "is accepted only from client.trusted_proxies, which is empty: list the load balancers' addresses",
        );
    }
    ClientAddressing { trusted_proxies: nets, real_ip_header, proxy_protocol }
}
