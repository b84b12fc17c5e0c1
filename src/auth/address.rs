//! Whether a route's `allow`/`deny` (or the admin listener's
//! `metrics.allow`) admit a client. Who the client is, by address, is
//! decided by [`crate::request::Peer::client`] alone; a broken
//! `X-Forwarded-For` chain gives no address, and no address passes.

use std::net::IpAddr;

use ipnet::IpNet;

/// A route's (or the admin listener's) address lists.
#[derive(Debug, Clone)]
pub struct AddressList {
    allow: Vec<IpNet>,
    deny: Vec<IpNet>,
}

impl AddressList {
    /// `None` when both lists are empty.
    pub fn new(allow: &[IpNet], deny: &[IpNet]) -> Option<AddressList> {
        (!allow.is_empty() || !deny.is_empty()).then(|| AddressList { allow: allow.to_vec(), deny: deny.to_vec() })
    }

    /// `deny` wins; with `allow` set, only addresses inside it pass. An
    /// address that could not be told (`None`) never passes.
    pub fn admits(&self, client: Option<IpAddr>) -> bool {
        let Some(ip) = client else { return false };
        let inside = |nets: &[IpNet]| nets.iter().any(|n| n.contains(&ip));
        !inside(&self.deny) && (self.allow.is_empty() || inside(&self.allow))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Peer;
    use http::HeaderMap;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn right_most_untrusted_forwarded_address() {
        let trusted = nets(&["127.0.0.1/32", "10.0.0.0/8"]);
        let peer: IpAddr = [127, 0, 0, 1].into();
        // (peer trusted, X-Forwarded-For values, client)
        let cases: Vec<(bool, Vec<&str>, Option<&str>)> = vec![
            (false, vec!["192.0.2.1"], Some("127.0.0.1")),
            (true, vec![], Some("127.0.0.1")),
            (true, vec!["192.0.2.1"], Some("192.0.2.1")),
            (true, vec!["198.51.100.9, 192.0.2.1"], Some("192.0.2.1")),
            (true, vec!["198.51.100.9, 192.0.2.1, 10.1.1.1"], Some("192.0.2.1")),
            (true, vec!["198.51.100.9", "192.0.2.1, 10.1.1.1"], Some("192.0.2.1")),
            (true, vec!["10.2.2.2, 10.1.1.1"], Some("10.2.2.2")),
            (true, vec!["192.0.2.1:4711"], Some("192.0.2.1")),
            (true, vec!["[2001:db8::1]:80"], Some("2001:db8::1")),
            (true, vec!["::ffff:192.0.2.1"], Some("192.0.2.1")),
            (true, vec!["garbage, 10.1.1.1"], None),
            (true, vec!["192.0.2.1, garbage"], None),
        ];
        for (peer_trusted, values, want) in cases {
            let mut headers = HeaderMap::new();
            for v in &values {
                headers.append(crate::headers::X_FORWARDED_FOR, v.parse().unwrap());
            }
            let got = Peer::new(peer, peer_trusted, false).client(&headers, &trusted).addr();
            assert_eq!(got, want.map(|w| w.parse().unwrap()), "{peer_trusted} {values:?}");
        }
    }

    #[test]
    fn deny_wins_and_allow_is_exclusive() {
        let list = AddressList::new(&nets(&["10.0.0.0/8"]), &nets(&["10.9.0.0/16"])).unwrap();
        let deny_only = AddressList::new(&[], &nets(&["192.0.2.0/24"])).unwrap();
        let cases: Vec<(&AddressList, Option<&str>, bool)> = vec![
            (&list, Some("10.1.2.3"), true),
            (&list, Some("10.9.2.3"), false),
            (&list, Some("192.0.2.1"), false),
            (&list, None, false),
            (&deny_only, Some("10.1.2.3"), true),
            (&deny_only, Some("192.0.2.1"), false),
            (&deny_only, None, false),
        ];
        for (l, client, want) in cases {
            assert_eq!(l.admits(client.map(|c| c.parse().unwrap())), want, "{client:?}");
        }
        assert!(AddressList::new(&[], &[]).is_none());
    }
}
