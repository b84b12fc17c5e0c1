//! The client address a `key = "client"` limit counts: the connection's
//! peer, unless that peer is a trusted proxy, in which case the right-most
//! `X-Forwarded-For` address that is not itself a trusted proxy.

use std::net::IpAddr;

use http::HeaderValue;
use ipnet::IpNet;

/// The client of a request from `peer`, whose `X-Forwarded-For` values are
/// `forwarded_for` in the order received. Only trusted proxies append to the
/// list, so it is read from the right: the first address that is not a
/// trusted proxy is the client; an entry that is not an address ends the
/// walk (what lies left of it cannot be trusted either), as does the end of
/// the list (everything in it was a proxy: the left-most is the client).
pub fn client_addr<'a>(
    peer: IpAddr,
    forwarded_for: impl DoubleEndedIterator<Item = &'a HeaderValue>,
    trusted: &[IpNet],
) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let mut client = peer;
    for value in forwarded_for.rev() {
        let Ok(text) = value.to_str() else { return client };
        for item in text.rsplit(',') {
            let Some(ip) = parse_item(item) else { return client };
            client = ip;
            if !is_trusted(&ip) {
                return ip;
            }
        }
    }
    client
}

/// One `X-Forwarded-For` item: an address, with or without a port (`[::1]:80`
/// or `1.2.3.4:80`, as some proxies write them).
fn parse_item(item: &str) -> Option<IpAddr> {
    let item = item.trim();
    item.parse()
        .ok()
        .or_else(|| item.parse::<std::net::SocketAddr>().ok().map(|s| s.ip()))
        .map(|ip: IpAddr| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_right_most_untrusted_address_is_the_client() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        let outsider: IpAddr = "203.0.113.9".parse().unwrap();
        let cases: &[(IpAddr, &[&str], &str)] = &[
            // An untrusted peer: its own address, whatever it claims.
            (outsider, &["198.51.100.1"], "203.0.113.9"),
            (outsider, &[], "203.0.113.9"),
            // A trusted peer without the header: the peer.
            (proxy, &[], "10.0.0.1"),
            // A trusted peer: the right-most address that is not a proxy.
            (proxy, &["198.51.100.1"], "198.51.100.1"),
            (proxy, &["1.1.1.1, 198.51.100.1, 10.0.0.7"], "198.51.100.1"),
            (proxy, &["1.1.1.1, 198.51.100.1", "10.0.0.7"], "198.51.100.1"),
            // Every entry a proxy: the left-most one.
            (proxy, &["10.0.0.3, 10.0.0.7"], "10.0.0.3"),
            // Garbage ends the walk at the last address believed.
            (proxy, &["1.1.1.1, bogus, 10.0.0.7"], "10.0.0.7"),
            (proxy, &["bogus"], "10.0.0.1"),
            // Ports and IPv6 brackets, as some proxies write them.
            (proxy, &["198.51.100.1:4711"], "198.51.100.1"),
            (proxy, &["[2001:db8::1]:443"], "2001:db8::1"),
            (proxy, &["::ffff:198.51.100.1"], "198.51.100.1"),
            ("::1".parse().unwrap(), &["2001:db8::2"], "2001:db8::2"),
        ];
        for (peer, values, want) in cases {
            let values: Vec<HeaderValue> = values.iter().map(|v| HeaderValue::from_str(v).unwrap()).collect();
            let got = client_addr(*peer, values.iter(), &trusted);
            assert_eq!(got, want.parse::<IpAddr>().unwrap(), "{peer} {values:?}");
        }
    }
}
