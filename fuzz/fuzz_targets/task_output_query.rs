//! `read_task_output`'s parameters as the REST query and the WebSocket params arrive: any
//! input is read or refused, and what is accepted is within the limits and stable under
//! normalising again.
#![no_main]

use agentd::tasks::output::OutputParams;
use agentd::tasks::query::{MAX_LIMIT_BYTES, MAX_LINES, MAX_MATCHES, OutputQuery};
use axum::extract::Query;
use axum::http::Uri;
use libfuzzer_sys::fuzz_target;

fn check(params: &OutputParams) {
    let given = [
        params.lines,
        params.max_matches,
        params.start,
        params.end,
        params.limit_bytes,
    ];
    let Ok(query) = params.to_query() else {
        return;
    };
    assert!(!given.contains(&Some(0)), "a zero is refused in every mode");
    assert_eq!(query.normalized().as_ref(), Ok(&query), "normalising is idempotent");
    match &query {
        OutputQuery::Head { lines } | OutputQuery::Tail { lines } => {
            assert!((1..=MAX_LINES).contains(lines))
        }
        OutputQuery::Grep {
            pattern,
            max_matches,
        } => {
            assert!(!pattern.is_empty());
            assert!((1..=MAX_MATCHES).contains(max_matches));
        }
        OutputQuery::LineRange { start, end } => assert!(*start >= 1 && end >= start),
        OutputQuery::Bytes { limit, .. } => assert!((1..=MAX_LIMIT_BYTES).contains(limit)),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(uri) = format!("/api/tasks/t/output?{text}").parse::<Uri>()
        && let Ok(Query(params)) = Query::<OutputParams>::try_from_uri(&uri)
    {
        check(&params);
    }
    if let Ok(params) = serde_json::from_str::<OutputParams>(text) {
        check(&params);
    }
});
