//! Small network helpers shared by the controller and the worker library: `host:port`
//! formatting and the local address of the route to a peer.
//!
//! Owns no sockets beyond the unconnected UDP socket [`route_source`] uses to ask the kernel
//! for a route; must not depend on `controller` or `worker`.

use std::net::{IpAddr, UdpSocket};

/// `host:port`, with IPv6 hosts in brackets.
pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The local address of the route to `peer`: `peer` itself when it is a loopback address,
/// else the source address the kernel would pick (a UDP `connect` selects a route and sends
/// no packet). `None` when there is no route or the answer is a wildcard.
pub(crate) fn route_source(peer: IpAddr) -> Option<IpAddr> {
    if peer.is_loopback() {
        return Some(peer);
    }
    let bind = if peer.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = UdpSocket::bind(bind).ok()?;
    // Port 9 (discard): only the route matters, nothing is sent.
    socket.connect((peer, 9)).ok()?;
    let local = socket.local_addr().ok()?.ip();
    (!local.is_unspecified()).then_some(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_brackets_ipv6_only() {
        assert_eq!(host_port("10.0.0.1", 80), "10.0.0.1:80");
        assert_eq!(host_port("::1", 80), "[::1]:80");
        assert_eq!(host_port("[::1]", 80), "[::1]:80");
        assert_eq!(host_port("example", 1), "example:1");
    }

    #[test]
    fn route_to_loopback_is_the_peer() {
        let lo: IpAddr = "127.0.0.1".parse().expect("ip");
        assert_eq!(route_source(lo), Some(lo));
    }
}
