//! The client's address as the forwarding fields carry it.

use std::net::{IpAddr, Ipv4Addr};

use http::HeaderValue;

/// The client's address as an `X-Forwarded-For` item. Made once per
/// connection: formatting an address costs more than the rest of the
/// forwarding rules together.
pub fn forwarded_for(ip: IpAddr) -> HeaderValue {
    let text = match ip {
        IpAddr::V4(v4) => ipv4_text(v4),
        IpAddr::V6(_) => ip.to_string(),
    };
    HeaderValue::from_maybe_shared(bytes::Bytes::from(text)).expect("an IP address is a valid header")
}

/// An IPv4 address as `Display` writes it, digit by digit. Hand-written:
/// every new connection pays this, and `Display`'s formatting machinery
/// is several times dearer; a crate for it (`itoa`) would be a new
/// dependency, which renames every symbol of the crate and so drops the
/// whole build profile (see benches/README.md, "A new connection's cost").
fn ipv4_text(ip: Ipv4Addr) -> String {
    let mut text = String::with_capacity(15);
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            text.push('.');
        }
        if octet >= 100 {
            text.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            text.push(char::from(b'0' + octet / 10 % 10));
        }
        text.push(char::from(b'0' + octet % 10));
    }
    text
}
