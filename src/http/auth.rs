//! Who is calling: bearer tokens (header or `?token=`) mapped to a [`Caller`], and the
//! WebSocket `Origin` rule.

use axum::extract::FromRequestParts;
use axum::http::header::{AUTHORIZATION, HOST, ORIGIN};
use axum::http::request::Parts;

use super::AppState;
use super::error::ApiError;
use crate::config::{Config, Secret};
use crate::session::Caller;

/// How requests prove who they are.
#[derive(Debug, Clone)]
pub enum Auth {
    /// No token configured: everyone is the anonymous caller.
    Open,
    /// One shared token; callers are anonymous.
    Token(Secret),
    /// Named users, each with a token.
    Users(Vec<(String, Secret)>),
}

impl Auth {
    /// The rule the configuration asks for; users win over a shared token.
    pub fn from_config(config: &Config) -> Self {
        if !config.server.users.is_empty() {
            Self::Users(
                config
                    .server
                    .users
                    .iter()
                    .map(|u| (u.name.clone(), u.token.clone()))
                    .collect(),
            )
        } else if let Some(token) = &config.server.auth_token {
            Self::Token(token.clone())
        } else {
            Self::Open
        }
    }

    /// The caller a presented token identifies.
    pub fn caller(&self, presented: Option<&str>) -> Result<Caller, ApiError> {
        match self {
            Self::Open => Ok(Caller::anonymous()),
            Self::Token(token) => match presented {
                Some(p) if same_secret(p, token.expose()) => Ok(Caller::anonymous()),
                _ => Err(ApiError::Unauthorized),
            },
            Self::Users(users) => {
                let presented = presented.ok_or(ApiError::Unauthorized)?;
                // Compare against every user so timing does not reveal which name matched.
                let mut found = None;
                for (name, token) in users {
                    if same_secret(presented, token.expose()) {
                        found = Some(name.clone());
                    }
                }
                found
                    .map(|user| Caller { user: Some(user) })
                    .ok_or(ApiError::Unauthorized)
            }
        }
    }
}

/// Constant-time comparison, so a wrong token's timing says nothing about the right one.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = a.len() ^ b.len();
    for (i, byte) in a.iter().enumerate() {
        diff |= usize::from(byte ^ b.get(i % b.len().max(1)).copied().unwrap_or(0));
    }
    diff == 0
}

/// The token a request presents: `Authorization: Bearer …`, else `?token=…`.
fn presented_token(parts: &Parts) -> Option<String> {
    if let Some(value) = parts
        .headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        return value.strip_prefix("Bearer ").map(|t| t.trim().to_string());
    }
    let query = parts.uri.query()?;
    url_query_value(query, "token")
}

/// One value of a URL query string, percent-decoded (`+` is a space).
fn url_query_value(query: &str, key: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(name, _)| name == key)
        .map(|(_, value)| value.into_owned())
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // Without a token, a server on loopback trusts only requests addressed to loopback: a
        // web page whose name was rebound to 127.0.0.1 (DNS rebinding) is refused.
        if matches!(state.auth(), Auth::Open)
            && state.config().server.bind.ip().is_loopback()
            && let Some(host) = parts.headers.get(HOST).and_then(|v| v.to_str().ok())
            && !host_is_local(host)
        {
            return Err(ApiError::ForbiddenHost);
        }
        state.auth().caller(presented_token(parts).as_deref())
    }
}

/// Whether a `Host` header names this machine by a loopback address or `localhost`.
pub fn host_is_local(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
            _ => host,
        },
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether a WebSocket upgrade's `Origin` is acceptable: absent (not a browser), the server's
/// own host, or listed in `allowed_origins`.
pub fn origin_allowed(parts_origin: Option<&str>, host: Option<&str>, allowed: &[String]) -> bool {
    let Some(origin) = parts_origin else {
        return true;
    };
    if allowed.iter().any(|a| a == origin || a == "*") {
        return true;
    }
    let origin_host = origin
        .split_once("://")
        .map_or(origin, |(_, rest)| rest)
        .trim_end_matches('/');
    host.is_some_and(|host| host.eq_ignore_ascii_case(origin_host))
}

/// Refuses a request that changes something when its `Origin` is one the WebSocket would
/// refuse: another site's page must not create sessions or run turns through the browser.
pub fn check_origin(
    headers: &axum::http::HeaderMap,
    allowed: &[String],
) -> Result<(), super::error::ApiError> {
    let (origin, host) = origin_and_host(headers);
    if origin_allowed(origin, host, allowed) {
        Ok(())
    } else {
        Err(super::error::ApiError::ForbiddenOrigin)
    }
}

/// The `Origin` and `Host` headers of a request.
pub fn origin_and_host(parts: &axum::http::HeaderMap) -> (Option<&str>, Option<&str>) {
    (
        parts.get(ORIGIN).and_then(|v| v.to_str().ok()),
        parts.get(HOST).and_then(|v| v.to_str().ok()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_identify_callers() {
        let auth = Auth::Users(vec![
            ("alice".into(), Secret::new("a-token")),
            ("bob".into(), Secret::new("b-token")),
        ]);
        assert_eq!(
            auth.caller(Some("b-token")).unwrap().user.as_deref(),
            Some("bob")
        );
        assert!(auth.caller(Some("b-toke")).is_err());
        assert!(auth.caller(None).is_err());
        let shared = Auth::Token(Secret::new("s3cret"));
        assert_eq!(shared.caller(Some("s3cret")).unwrap(), Caller::anonymous());
        assert!(shared.caller(Some("s3cret!")).is_err());
        assert!(shared.caller(Some("")).is_err());
        assert_eq!(Auth::Open.caller(None).unwrap(), Caller::anonymous());
    }

    #[test]
    fn secrets_compare_by_content_and_length() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("ab", "abc"));
        assert!(!same_secret("abcd", "abc"));
        assert!(!same_secret("", "abc"));
    }

    #[test]
    fn query_tokens_are_percent_decoded() {
        assert_eq!(
            url_query_value("a=1&token=x%2Fy", "token").as_deref(),
            Some("x/y")
        );
        assert_eq!(url_query_value("token=", "token").as_deref(), Some(""));
        assert_eq!(url_query_value("a=1", "token"), None);
        assert_eq!(
            url_query_value("token=100%", "token").as_deref(),
            Some("100%")
        );
        assert_eq!(
            url_query_value("token=a+b%2B", "token").as_deref(),
            Some("a b+")
        );
    }

    #[test]
    fn only_loopback_hosts_are_local() {
        for host in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "[::1]:8080",
            "127.1.2.3",
        ] {
            assert!(host_is_local(host), "{host}");
        }
        for host in [
            "evil.example:8080",
            "10.0.0.1",
            "[fe80::1]:80",
            "localhost.evil.example",
        ] {
            assert!(!host_is_local(host), "{host}");
        }
    }

    #[test]
    fn origins_default_to_same_host() {
        assert!(origin_allowed(None, Some("x"), &[]));
        assert!(origin_allowed(
            Some("http://127.0.0.1:8080"),
            Some("127.0.0.1:8080"),
            &[]
        ));
        assert!(!origin_allowed(
            Some("http://evil.example"),
            Some("127.0.0.1:8080"),
            &[]
        ));
        let allowed = vec!["http://app.example".to_string()];
        assert!(origin_allowed(
            Some("http://app.example"),
            Some("127.0.0.1:8080"),
            &allowed
        ));
    }
}
