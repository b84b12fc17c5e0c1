//! What a route does: the parts of [`Target`] and [`ProxyTarget`] beside
//! their definitions (a mirror's settings, the split's choice, the
//! description `gateway check` prints).

use super::*;
use crate::router::split::NewCookie;

/// A proxy route's `mirror`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MirrorConfig {
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
    /// The share of requests copied, above 0 and at most 100.
    pub percent: f64,
}

impl ProxyTarget {
    /// The upstream a request goes to: the route's one, or its split's
    /// choice; a sticky cookie the split sets for it goes in its extensions
    /// ([`NewCookie`], for the answer).
    pub fn upstream_for<B>(&self, req: &mut http::Request<B>, tls: bool) -> usize {
        match &self.split {
            None => self.upstream,
            Some(split) => {
                let (chosen, cookie) = split.choose_or_set(req.headers_mut(), tls, |n| fastrand::u64(..n));
                if let Some(cookie) = cookie {
                    req.extensions_mut().insert(NewCookie(cookie));
                }
                chosen
            }
        }
    }

    /// Whether requests may go to upstream `i`.
    pub fn goes_to(&self, i: usize) -> bool {
        self.upstream == i || self.split.as_ref().is_some_and(|s| s.members.iter().any(|m| m.upstream == i))
    }
}

impl Target {
    /// Short name of the target kind, for `gateway check`.
    pub fn describe(&self, upstreams: &[UpstreamConfig]) -> String {
        match self {
            Target::Proxy(p) => {
                // Redacted as `/-/config` shows it (a `;jsessionid=` path parameter).
                let rewrite =
                    p.rewrite.as_deref().map(|r| format!(" rewrite {}", super::redact_url(r))).unwrap_or_default();
                let timeout = humantime::format_duration(p.timeout);
                // A split is named by all its members: `p.upstream` is only
                // its first, and naming it alone says all traffic goes there.
                let to = match &p.split {
                    Some(s) => {
                        let members: Vec<String> =
                            s.members.iter().map(|m| format!("{} {}", m.name, m.weight)).collect();
                        let sets = if s.set_cookie.is_some() { " (set)" } else { "" };
                        let sticky =
                            s.sticky.as_ref().map(|k| format!(" sticky {}{sets}", k.describe())).unwrap_or_default();
                        format!("split [{}]{sticky}", members.join(", "))
                    }
                    None => describe_upstream(&upstreams[p.upstream]),
                };
                format!("proxy -> {to}{rewrite} timeout {timeout}")
            }
            // Absolute as a `dir` (canonical at load) is, but with no link
            // followed: the file is opened by this path at each request.
            Target::File(p) => format!("file {}", std::path::absolute(p).unwrap_or_else(|_| p.clone()).display()),
            Target::Dir { root, dotfiles } => {
                format!("dir {}{}", root.display(), if *dotfiles { " (dotfiles served)" } else { "" })
            }
            Target::Respond { status, body } => {
                format!("respond {} ({} bytes)", status.as_u16(), body.len())
            }
            // Shown as `/-/config` shows it: this goes to `/-/routes`, the
            // status page and `gateway check`'s output.
            Target::Redirect(r) => format!("redirect {} {}", r.status.as_u16(), super::redact_url(r.template())),
        }
    }
}

/// `NAME (URL, URL weight 3)` or `NAME (discover ...)`.
fn describe_upstream(up: &UpstreamConfig) -> String {
    let urls = match &up.discover {
        Some(d) => format!("discover {} {}", d.source(), d.describe()),
        None => {
            let urls: Vec<String> = up
                .endpoints
                .iter()
                .map(|e| match e.weight {
                    1 => e.url.clone(),
                    w => format!("{} weight {w}", e.url),
                })
                .collect();
            urls.join(", ")
        }
    };
    format!("{} ({urls})", up.name)
}
