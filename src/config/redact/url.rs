//! URLs as logs and errors show them: a user-info password and the values
//! of secret-named parameters (query, fragment, `;` path parameters)
//! redacted.

use std::borrow::Cow;

use super::{REDACTED, names_secret};

/// A URL's user-info password and secret-named query and fragment values
/// redacted; any other string as it is, but for its query and fragment
/// and, outside a path, a password before an `@` (a malformed URL's
/// user-info: `http:/u:pw@h`, `u:pw@h`). Logs show URLs of the configuration this way
/// too, so that they say no more than `/-/config` does.
pub fn redact_url(s: &str) -> String {
    let Some(scheme_end) = s.find("://").filter(|_| !s.starts_with('/')) else {
        return redact_relative(s);
    };
    let rest_start = scheme_end + 3;
    let mut authority_end = s[rest_start..].find(['/', '?', '#']).map_or(s.len(), |i| rest_start + i);
    // A URL refused because it does not parse, or whose port is not a
    // number, may hold a password with a raw `/`, `?` or `#`: its
    // user-info is taken to run to the last `@`.
    if let Some(at) = s[authority_end..].rfind('@').map(|i| authority_end + i)
        && (s.parse::<http::Uri>().is_err() || !numeric_port(&s[rest_start..authority_end]))
    {
        authority_end = s[at..].find(['/', '?', '#']).map_or(s.len(), |i| at + i);
    }
    let mut out = String::with_capacity(s.len());
    out.push_str(&s[..rest_start]);
    let authority = &s[rest_start..authority_end];
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&userinfo[..=colon]);
                    out.push_str(REDACTED);
                }
                // A lone user-info part is often a token (`https://TOKEN@host`).
                None => out.push_str(REDACTED),
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    out.push_str(&redact_tail(&s[authority_end..]));
    out
}

/// A path with the values of secret-named `;` parameters redacted
/// (`/app;jsessionid=…/x`: a session's ID, which servlet containers put
/// into URLs, is as good as its cookie).
fn redact_path_params(path: &str) -> Cow<'_, str> {
    if !path.contains(';') {
        return Cow::Borrowed(path);
    }
    // A segment's parameters are pairs as a query's are: the query's rule.
    let segments: Vec<String> = path
        .split('/')
        .map(|segment| match segment.split_once(';') {
            Some((name, params)) => format!("{name};{}", redact_query(params)),
            None => segment.to_owned(),
        })
        .collect();
    Cow::Owned(segments.join("/"))
}

/// [`redact_url`] of a string without `://`.
fn redact_relative(s: &str) -> String {
    let head_end = s.find(['?', '#']).unwrap_or(s.len());
    let (head, tail) = s.split_at(head_end);
    let mut out = String::with_capacity(s.len());
    // `user:password@`, after the last `/` before the `@`.
    let userinfo = head.rfind('@').filter(|_| !head.starts_with('/')).and_then(|at| {
        let start = head[..at].rfind('/').map_or(0, |i| i + 1);
        let colon = start + head[start..at].find(':')?;
        (!head[start..at].contains(char::is_whitespace)).then_some((colon, at))
    });
    match userinfo {
        Some((colon, at)) => {
            out.push_str(&head[..=colon]);
            out.push_str(REDACTED);
            out.push_str(&head[at..]);
        }
        None => out.push_str(&redact_path_params(head)),
    }
    out.push_str(&redact_tail(tail));
    out
}

/// A URL's path, query and fragment, the values of secret-named parameters
/// of the last two redacted (a fragment's too: OAuth's implicit flow puts
/// `access_token` there).
fn redact_tail(tail: &str) -> String {
    let Some(at) = tail.find(['?', '#']) else { return redact_path_params(tail).into_owned() };
    let (path, rest) = tail.split_at(at);
    let (query, fragment) = match rest.strip_prefix('?') {
        Some(q) => q.split_once('#').map_or((Some(q), None), |(q, f)| (Some(q), Some(f))),
        None => (None, rest.strip_prefix('#')),
    };
    let mut out = redact_path_params(path).into_owned();
    if let Some(q) = query {
        out.push('?');
        out.push_str(&redact_query(q));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(&redact_query(f));
    }
    out
}

/// Whether an authority's port, if it has one, is a number.
fn numeric_port(authority: &str) -> bool {
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    match host_port.rsplit_once(':') {
        Some((host, port)) if !host.starts_with('[') || host.ends_with(']') => port.bytes().all(|b| b.is_ascii_digit()),
        _ => true,
    }
}

/// A query string with the values of secret-named parameters redacted:
/// pairs split at `&` and `;` (which some frameworks take too), a name
/// judged percent-decoded, as the upstream reads it (`tok%65n`).
fn redact_query(query: &str) -> String {
    let mut out = String::with_capacity(query.len());
    let mut rest = query;
    loop {
        let end = rest.find(['&', ';']).unwrap_or(rest.len());
        let pair = &rest[..end];
        match pair.split_once('=') {
            Some((k, _)) if names_secret(&percent_encoding::percent_decode_str(k).decode_utf8_lossy()) => {
                out.push_str(k);
                out.push('=');
                out.push_str(REDACTED);
            }
            _ => out.push_str(pair),
        }
        let Some(separator) = rest[end..].chars().next() else { break };
        out.push(separator);
        rest = &rest[end + 1..];
    }
    out
}
