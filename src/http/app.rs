//! The AppUI: the browser app's page and ES modules, embedded in the binary and served at `/`
//! and `/app/{file}`. Both are public; the page asks for the token itself when auth is on.

use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// One embedded file of the app.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// The page; everything else it loads is under `/app/`.
const INDEX: &str = include_str!("../../ui/index.html");

/// Every file under `/app/`, by name.
const ASSETS: &[Asset] = &[
    Asset {
        name: "app.css",
        content_type: CSS,
        body: include_str!("../../ui/app.css"),
    },
    Asset {
        name: "main.js",
        content_type: JS,
        body: include_str!("../../ui/main.js"),
    },
    Asset {
        name: "auth.js",
        content_type: JS,
        body: include_str!("../../ui/auth.js"),
    },
    Asset {
        name: "connection.js",
        content_type: JS,
        body: include_str!("../../ui/connection.js"),
    },
    Asset {
        name: "rest.js",
        content_type: JS,
        body: include_str!("../../ui/rest.js"),
    },
    Asset {
        name: "state.js",
        content_type: JS,
        body: include_str!("../../ui/state.js"),
    },
    Asset {
        name: "dom.js",
        content_type: JS,
        body: include_str!("../../ui/dom.js"),
    },
    Asset {
        name: "markdown.js",
        content_type: JS,
        body: include_str!("../../ui/markdown.js"),
    },
    Asset {
        name: "conversation.js",
        content_type: JS,
        body: include_str!("../../ui/conversation.js"),
    },
    Asset {
        name: "tasks.js",
        content_type: JS,
        body: include_str!("../../ui/tasks.js"),
    },
    Asset {
        name: "cost.js",
        content_type: JS,
        body: include_str!("../../ui/cost.js"),
    },
    Asset {
        name: "plan.js",
        content_type: JS,
        body: include_str!("../../ui/plan.js"),
    },
    Asset {
        name: "approvals.js",
        content_type: JS,
        body: include_str!("../../ui/approvals.js"),
    },
    Asset {
        name: "questions.js",
        content_type: JS,
        body: include_str!("../../ui/questions.js"),
    },
    Asset {
        name: "tools.js",
        content_type: JS,
        body: include_str!("../../ui/tools.js"),
    },
    Asset {
        name: "console.js",
        content_type: JS,
        body: include_str!("../../ui/console.js"),
    },
    Asset {
        name: "sessions.js",
        content_type: JS,
        body: include_str!("../../ui/sessions.js"),
    },
];

/// The page may load only its own files and talk only to its own server; no inline script,
/// so text that slips into the DOM as markup still cannot run.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

fn respond(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The files change with the binary; revalidating costs little and never serves a stale app.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// `GET /`: the AppUI's page.
pub async fn index() -> Response {
    respond("text/html; charset=utf-8", INDEX)
}

/// `GET /app/{file}`: one of the app's modules or its stylesheet.
pub async fn asset(Path(file): Path<String>) -> Result<Response, ApiError> {
    ASSETS
        .iter()
        .find(|asset| asset.name == file)
        .map(|asset| respond(asset.content_type, asset.body))
        .ok_or_else(|| ApiError::NotFound(format!("no app file {file:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The files a text loads: quoted `app/…` (the page) and `./…` (module imports) names.
    fn references(text: &str) -> Vec<String> {
        let mut found = Vec::new();
        for quote in ['"', '\'', '`'] {
            for prefix in ["app/", "./"] {
                let opening = format!("{quote}{prefix}");
                for (at, _) in text.match_indices(&opening) {
                    let rest = &text[at + opening.len()..];
                    if let Some(end) = rest.find(quote) {
                        found.push(rest[..end].to_string());
                    }
                }
            }
        }
        found
    }

    #[test]
    fn every_file_the_app_loads_is_embedded() {
        let mut texts = vec![INDEX];
        texts.extend(ASSETS.iter().map(|asset| asset.body));
        for text in texts {
            for name in references(text) {
                assert!(
                    ASSETS.iter().any(|asset| asset.name == name),
                    "{name} is loaded but not embedded"
                );
            }
        }
    }

    #[test]
    fn every_embedded_module_is_loaded_by_something() {
        let mut loaded = references(INDEX);
        for asset in ASSETS {
            loaded.extend(references(asset.body));
        }
        for asset in ASSETS {
            assert!(
                loaded.iter().any(|name| name == asset.name),
                "{} is embedded but nothing loads it",
                asset.name
            );
        }
    }

    #[test]
    fn types_follow_the_extension() {
        for asset in ASSETS {
            let expected = if asset.name.ends_with(".js") { JS } else { CSS };
            assert_eq!(asset.content_type, expected, "{}", asset.name);
        }
    }
}
