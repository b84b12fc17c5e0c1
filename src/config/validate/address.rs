//! Listen addresses (`server.listen`, `metrics.listen`): an IP address and
//! a port. The standard parser answers every mistake with "invalid socket
//! address syntax"; a newcomer's usual ones (a port alone, a host name, no
//! port, a port past 65535) are told what to write instead.

use std::net::{IpAddr, SocketAddr};

use super::Problem;

pub(super) fn parse_addr(key: &str, value: &str) -> Result<SocketAddr, Problem> {
    value.parse().map_err(|_| (key.to_owned(), format!("invalid socket address {value:?}: {}", why(value.trim()))))
}

/// What is wrong with `value`, which is not an address, and what to write.
fn why(value: &str) -> String {
    let example = "(use e.g. \"127.0.0.1:8080\")";
    let port = value.strip_prefix(':').unwrap_or(value);
    if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
        return format!(
            "a port alone is not an address: write \"127.0.0.1:{port}\" (this machine only) or \"0.0.0.0:{port}\" (every interface)"
        );
    }
    if let Ok(ip) = value.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        let with_port = SocketAddr::new(ip, 8080);
        let v6 = if ip.is_ipv6() { " (an IPv6 address goes in brackets before its port)" } else { "" };
        return format!("the port is missing: write e.g. \"{with_port}\"{v6}");
    }
    let Some((host, port)) = value.rsplit_once(':') else { return format!("not an IP address and port {example}") };
    let host_ip = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>();
    match (host_ip, port.parse::<u16>()) {
        (Ok(_), Err(_)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            format!("port {port} is out of range: a port is 0 to 65535")
        }
        (Err(_), Ok(_)) if host.contains(':') => {
            format!("an IPv6 address goes in brackets before its port: \"[{host}]:{port}\"")
        }
        (Err(_), Ok(_)) if host == "localhost" => {
            format!("a host name is not taken, only an IP address: write \"127.0.0.1:{port}\" (or \"[::1]:{port}\")")
        }
        (Err(_), Ok(_)) => format!(
            "a host name is not taken, only an IP address: write \"0.0.0.0:{port}\" to listen on every interface, \
             or the IP address of one"
        ),
        _ => format!("not an IP address and port {example}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usual_mistakes_say_what_to_write() {
        for (value, want) in [
            (
                "8080",
                "a port alone is not an address: write \"127.0.0.1:8080\" (this machine only) or \"0.0.0.0:8080\"",
            ),
            (":9090", "write \"127.0.0.1:9090\""),
            ("127.0.0.1", "the port is missing: write e.g. \"127.0.0.1:8080\""),
            ("::1", "the port is missing: write e.g. \"[::1]:8080\""),
            ("localhost:8080", "a host name is not taken, only an IP address: write \"127.0.0.1:8080\""),
            ("gateway.internal:80", "write \"0.0.0.0:80\" to listen on every interface"),
            ("127.0.0.1:99999", "port 99999 is out of range: a port is 0 to 65535"),
            ("::1:8080", "\"[::1:8080]:8080\" (an IPv6 address goes in brackets before its port)"),
            ("fe80::1:70000", "port 70000 is out of range"),
            ("nowhere", "not an IP address and port (use e.g. \"127.0.0.1:8080\")"),
            ("", "not an IP address and port"),
        ] {
            let (key, message) = parse_addr("server.listen", value).unwrap_err();
            assert_eq!(key, "server.listen");
            assert!(message.starts_with(&format!("invalid socket address {value:?}: ")), "{message}");
            assert!(message.contains(want), "{value}: wanted {want:?} in {message}");
        }
        assert_eq!(parse_addr("k", "[::1]:80").unwrap(), "[::1]:80".parse().unwrap());
    }
}
