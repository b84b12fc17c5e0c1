//! The field names a request's `Connection` nominates, split once for
//! questions about many names (a stored answer's `Vary` may name
//! hundreds, and a `Connection` may list thousands).

use std::collections::HashSet;

use http::{HeaderMap, HeaderName, header};

/// The names a request's `Connection` lists, lowercased.
pub struct Nominated(HashSet<String>);

impl Nominated {
    pub fn of(request: &HeaderMap) -> Nominated {
        let tokens = request.get_all(header::CONNECTION).iter().filter_map(|v| v.to_str().ok());
        Nominated(tokens.flat_map(|v| v.split(',')).map(|t| t.trim().to_ascii_lowercase()).collect())
    }

    /// Whether `name` is one of them (a `HeaderName` is lowercase).
    pub fn contains(&self, name: &HeaderName) -> bool {
        self.0.contains(name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn every_line_and_token_in_any_case() {
        let mut request = HeaderMap::new();
        request.append(header::CONNECTION, HeaderValue::from_static("keep-alive, X-One"));
        request.append(header::CONNECTION, HeaderValue::from_static(" x-two ,"));
        let nominated = Nominated::of(&request);
        for (name, listed) in [("x-one", true), ("x-two", true), ("keep-alive", true), ("x-three", false), ("", false)]
        {
            let name = HeaderName::from_bytes(name.as_bytes()).ok();
            assert_eq!(name.as_ref().is_some_and(|n| nominated.contains(n)), listed, "{name:?}");
        }
        assert!(!Nominated::of(&HeaderMap::new()).contains(&header::COOKIE));
    }
}
