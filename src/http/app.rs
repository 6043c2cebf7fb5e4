//! The AppUI: the browser app's page and ES modules, embedded in the binary and served at `/`
//! and `/app/{file}`. Both are public; the page asks for the token itself when auth is on.

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
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
    Asset {
        name: "diff.js",
        content_type: JS,
        body: include_str!("../../ui/diff.js"),
    },
    Asset {
        name: "revert.js",
        content_type: JS,
        body: include_str!("../../ui/revert.js"),
    },
];

/// The page may load only its own files and talk only to its own server; no inline script,
/// so text that slips into the DOM as markup still cannot run.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// A validator for `body`: it changes whenever the file does (the files change only with the
/// binary, so a hash of the text is enough).
fn etag(body: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    body.hash(&mut hasher);
    format!("\"{:016x}-{:x}\"", hasher.finish(), body.len())
}

/// Whether an `If-None-Match` list names `tag` (or is `*`); weak tags match too (RFC 9110
/// §13.1.2 compares weakly).
fn none_match(headers: &HeaderMap, tag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|list| list.split(','))
        .map(|item| item.trim().trim_start_matches("W/"))
        .any(|item| item == "*" || item == tag)
}

/// The page's tag and each of [`ASSETS`]' (in its order), worked out once: the files are part
/// of the binary.
static TAGS: LazyLock<(HeaderValue, Vec<HeaderValue>)> = LazyLock::new(|| {
    let tag = |body| HeaderValue::from_str(&etag(body)).expect("a tag is hex in quotes");
    (
        tag(INDEX),
        ASSETS.iter().map(|asset| tag(asset.body)).collect(),
    )
});

fn respond(
    headers: &HeaderMap,
    tag: &HeaderValue,
    content_type: &'static str,
    body: &'static str,
) -> Response {
    let mut response = if none_match(headers, tag.to_str().unwrap_or_default()) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut response = body.into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
    };
    let headers = response.headers_mut();
    headers.insert(header::ETAG, tag.clone());
    // The files change with the binary; revalidating costs a 304 and never serves a stale app.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    response
}

/// `GET /`: the AppUI's page.
pub async fn index(headers: HeaderMap) -> Response {
    respond(&headers, &TAGS.0, "text/html; charset=utf-8", INDEX)
}

/// `GET /app/{file}`: one of the app's modules or its stylesheet.
pub async fn asset(headers: HeaderMap, Path(file): Path<String>) -> Result<Response, ApiError> {
    ASSETS
        .iter()
        .zip(&TAGS.1)
        .find(|(asset, _)| asset.name == file)
        .map(|(asset, tag)| respond(&headers, tag, asset.content_type, asset.body))
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

    #[tokio::test]
    async fn an_unchanged_file_answers_304_with_its_tag() {
        let tag = etag(INDEX);
        assert_ne!(tag, etag(ASSETS[0].body), "two files share a tag");
        for file in ASSETS {
            let served = asset(HeaderMap::new(), Path(file.name.to_string()))
                .await
                .unwrap();
            assert_eq!(served.headers()[header::ETAG], etag(file.body).as_str());
        }
        let fresh = index(HeaderMap::new()).await;
        assert_eq!(fresh.status(), StatusCode::OK);
        assert_eq!(fresh.headers()[header::ETAG], tag.as_str());
        for asked in [
            tag.clone(),
            format!("W/{tag}"),
            format!("\"other\", {tag}"),
            "*".into(),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(header::IF_NONE_MATCH, asked.parse().unwrap());
            let cached = index(headers).await;
            assert_eq!(cached.status(), StatusCode::NOT_MODIFIED, "{asked}");
            assert_eq!(cached.headers()[header::ETAG], tag.as_str());
        }
        let mut headers = HeaderMap::new();
        headers.insert(header::IF_NONE_MATCH, "\"stale\"".parse().unwrap());
        assert_eq!(index(headers).await.status(), StatusCode::OK);
    }

    #[test]
    fn types_follow_the_extension() {
        for asset in ASSETS {
            let expected = if asset.name.ends_with(".js") { JS } else { CSS };
            assert_eq!(asset.content_type, expected, "{}", asset.name);
        }
    }
}
