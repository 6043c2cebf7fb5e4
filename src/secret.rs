//! A secret string that never shows itself in `Debug`, logs or anything serialised.

use serde::{Deserialize, Serialize, Serializer};

/// A secret string (API key, token) that never shows itself in `Debug`, logs or serialised output.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// Serialised, a secret is `"[redacted]"` (an empty one stays empty, since there is nothing to
/// hide and `""` says "not set"), so printing a configuration cannot leak one either.
impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(if self.0.is_empty() { "" } else { REDACTED })
    }
}

/// What a secret shows instead of itself.
pub const REDACTED: &str = "[redacted]";

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(\"{REDACTED}\")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_shows_itself() {
        let secret = Secret::new("sk-live-123");
        assert_eq!(format!("{secret:?}"), "Secret(\"[redacted]\")");
        assert_eq!(serde_json::to_string(&secret).unwrap(), "\"[redacted]\"");
        // Read in, it is the value itself; an empty one serialises as empty, i.e. unset.
        let read: Secret = serde_json::from_str("\"sk-live-123\"").unwrap();
        assert_eq!(read.expose(), "sk-live-123");
        assert_eq!(serde_json::to_string(&Secret::new("")).unwrap(), "\"\"");
    }
}
