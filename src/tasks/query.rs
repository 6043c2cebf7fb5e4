//! What a `read_task_output` asks for: its parameters as every door receives them (the REST
//! query, the WebSocket method's params, the model tool's `mode` object), one type for all,
//! and their validation into the [`OutputQuery`] that [`super::output`] executes.
//!
//! The REST query and the WebSocket params are flat (`mode`, and unknown keys are ignored);
//! the tool's `mode` object names the mode `kind` and refuses unknown keys. Both read the same
//! defaults and limits.

use serde::{Deserialize, Deserializer};
use serde_json::{Value, json};

/// Lines returned by head and tail when `lines` is not given.
pub const DEFAULT_LINES: usize = 50;
/// Most lines head and tail return; larger `lines` are clamped to this.
pub const MAX_LINES: usize = 500;
/// Matches grep returns when `max_matches` is not given.
pub const DEFAULT_MAX_MATCHES: usize = 20;
/// Most matches grep returns; a larger `max_matches` is clamped to this.
pub const MAX_MATCHES: usize = 100;
/// Most lines line_range returns; a longer range is cut here and the answer says `truncated`.
pub const MAX_RANGE_LINES: usize = 500;
/// Bytes returned by mode bytes when `limit_bytes` is not given.
pub const DEFAULT_LIMIT_BYTES: usize = 65_536;
/// Most bytes mode bytes returns; a larger `limit_bytes` is clamped to this.
pub const MAX_LIMIT_BYTES: usize = 1_048_576;

/// One validated way of reading a task log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputQuery {
    /// The first `lines` lines.
    Head {
        /// How many lines (1 to [`MAX_LINES`]).
        lines: usize,
    },
    /// The last `lines` lines.
    Tail {
        /// How many lines (1 to [`MAX_LINES`]).
        lines: usize,
    },
    /// The lines containing `pattern` as a plain substring, at most `max_matches` of them.
    Grep {
        /// The substring to look for (not a regex; case-sensitive).
        pattern: String,
        /// How many matching lines to return at most (1 to [`MAX_MATCHES`]).
        max_matches: usize,
    },
    /// Lines `start` to `end`, 1-based and inclusive, at most [`MAX_RANGE_LINES`] of them.
    LineRange {
        /// First line returned, counting from 1.
        start: usize,
        /// Last line returned; at least `start`.
        end: usize,
    },
    /// Up to `limit` raw bytes from byte `offset`.
    Bytes {
        /// Where to start, in bytes from the beginning of the log.
        offset: u64,
        /// How many bytes at most (1 to [`MAX_LIMIT_BYTES`]).
        limit: usize,
    },
}

impl Default for OutputQuery {
    fn default() -> Self {
        Self::Head {
            lines: DEFAULT_LINES,
        }
    }
}

/// Why a `read_task_output` request cannot be turned into an [`OutputQuery`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// `mode` names no known mode.
    #[error("unknown mode {0:?}: use one of head, tail, grep, line_range, bytes")]
    UnknownMode(String),
    /// Mode grep without a non-empty `pattern`.
    #[error("mode grep needs a non-empty `pattern` (a plain substring, not a regex)")]
    MissingPattern,
    /// Mode line_range without `start`.
    #[error("mode line_range needs `start` (the first line to return, counting from 1)")]
    MissingStart,
    /// A count or position that must be positive was 0.
    #[error("`{0}` must be at least 1")]
    Zero(&'static str),
    /// A line range that ends before it starts.
    #[error("`end` ({end}) must not be before `start` ({start})")]
    EndBeforeStart {
        /// The requested first line.
        start: usize,
        /// The requested last line.
        end: usize,
    },
}

impl OutputQuery {
    /// This query checked and clamped to the contract's limits (what [`read_output`](super::output::read_output) executes).
    pub fn normalized(&self) -> Result<Self, QueryError> {
        let positive = |value: usize, name: &'static str| {
            if value == 0 {
                Err(QueryError::Zero(name))
            } else {
                Ok(value)
            }
        };
        Ok(match self {
            Self::Head { lines } => Self::Head {
                lines: positive(*lines, "lines")?.min(MAX_LINES),
            },
            Self::Tail { lines } => Self::Tail {
                lines: positive(*lines, "lines")?.min(MAX_LINES),
            },
            Self::Grep {
                pattern,
                max_matches,
            } => {
                if pattern.is_empty() {
                    return Err(QueryError::MissingPattern);
                }
                Self::Grep {
                    pattern: pattern.clone(),
                    max_matches: positive(*max_matches, "max_matches")?.min(MAX_MATCHES),
                }
            }
            Self::LineRange { start, end } => {
                positive(*start, "start")?;
                if end < start {
                    return Err(QueryError::EndBeforeStart {
                        start: *start,
                        end: *end,
                    });
                }
                Self::LineRange {
                    start: *start,
                    end: *end,
                }
            }
            Self::Bytes { offset, limit } => Self::Bytes {
                offset: *offset,
                limit: positive(*limit, "limit_bytes")?.min(MAX_LIMIT_BYTES),
            },
        })
    }
}

/// `read_task_output`'s parameters, the same at every door: the flat query of
/// `GET /api/tasks/{id}/output` and `task/output/read`, and the model tool's `mode` object
/// (read with [`OutputParams::deserialize_mode_object`]).
///
/// Use it directly as axum's `Query<OutputParams>`: inside `#[serde(flatten)]` a URL query's
/// numbers stay strings and fail to parse (flattening into a JSON-RPC params struct is fine).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct OutputParams {
    /// head (default), tail, grep, line_range or bytes (`kind` in the tool's `mode` object).
    pub mode: Option<String>,
    /// Lines for head and tail.
    pub lines: Option<usize>,
    /// Substring for grep.
    pub pattern: Option<String>,
    /// Most matches for grep.
    pub max_matches: Option<usize>,
    /// First line for line_range (1-based).
    pub start: Option<usize>,
    /// Last line for line_range (inclusive).
    pub end: Option<usize>,
    /// Start byte for bytes.
    pub offset: Option<u64>,
    /// Most bytes for bytes.
    pub limit_bytes: Option<usize>,
}

impl OutputParams {
    /// The validated query these parameters ask for, with the contract's defaults.
    ///
    /// `mode` defaults to head; `lines` to 50; grep needs `pattern`, `max_matches` defaults to 20;
    /// line_range needs `start`, and `end` defaults to the last line the 500-line cap allows;
    /// bytes defaults to `offset` 0 and `limit_bytes` 65536. Values above a maximum (`lines` 500,
    /// `max_matches` 100, `limit_bytes` 1 MiB) are clamped, not refused; a line range longer than
    /// 500 lines is kept as asked and cut when read, with `truncated` set. Missing required
    /// values, zeros and `end < start` are errors. Parameters of other modes are ignored, but a
    /// zero is refused wherever it is given: it is wrong on its own, whatever the mode.
    pub fn to_query(&self) -> Result<OutputQuery, QueryError> {
        let counts = [
            (self.lines, "lines"),
            (self.max_matches, "max_matches"),
            (self.start, "start"),
            (self.end, "end"),
            (self.limit_bytes, "limit_bytes"),
        ];
        if let Some((_, name)) = counts.iter().find(|(value, _)| *value == Some(0)) {
            return Err(QueryError::Zero(name));
        }
        let query = match self.mode.as_deref().unwrap_or("head") {
            "head" => OutputQuery::Head {
                lines: self.lines.unwrap_or(DEFAULT_LINES),
            },
            "tail" => OutputQuery::Tail {
                lines: self.lines.unwrap_or(DEFAULT_LINES),
            },
            "grep" => OutputQuery::Grep {
                pattern: self
                    .pattern
                    .as_deref()
                    .ok_or(QueryError::MissingPattern)?
                    .to_owned(),
                max_matches: self.max_matches.unwrap_or(DEFAULT_MAX_MATCHES),
            },
            "line_range" => {
                let start = self.start.ok_or(QueryError::MissingStart)?;
                OutputQuery::LineRange {
                    start,
                    end: self
                        .end
                        .unwrap_or_else(|| start.saturating_add(MAX_RANGE_LINES - 1)),
                }
            }
            "bytes" => OutputQuery::Bytes {
                offset: self.offset.unwrap_or(0),
                limit: self.limit_bytes.unwrap_or(DEFAULT_LIMIT_BYTES),
            },
            other => return Err(QueryError::UnknownMode(truncate_chars(other, 40))),
        };
        query.normalized()
    }

    /// Reads the model tool's `mode` object: `{kind, lines?, pattern?, max_matches?, start?,
    /// end?, offset?, limit_bytes?}`, unknown keys refused.
    pub fn deserialize_mode_object<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Self, D::Error> {
        ModeObject::deserialize(deserializer)
    }

    /// JSON Schema of the model tool's `mode` object (`kind` for `mode`), for its `input_schema`.
    ///
    /// Maxima are stated in descriptions rather than as `maximum`, because over-large values are
    /// clamped, not refused.
    pub fn mode_object_schema() -> Value {
        json!({
            "type": "object",
            "description": "How to read the output. Omit for the first 50 lines.",
            "properties": {
                "kind": {
                    "type": "string",
                    "enum": ["head", "tail", "grep", "line_range", "bytes"],
                    "description": "head: first lines; tail: last lines; grep: lines containing \
                        a substring; line_range: lines start..end; bytes: raw bytes from an \
                        offset (use next_offset from a previous answer to page). Default head."
                },
                "lines": {
                    "type": "integer", "minimum": 1,
                    "description": "head/tail: how many lines (default 50, at most 500)."
                },
                "pattern": {
                    "type": "string", "minLength": 1,
                    "description": "grep (required): plain case-sensitive substring, not a regex."
                },
                "max_matches": {
                    "type": "integer", "minimum": 1,
                    "description": "grep: most matching lines to return (default 20, at most 100)."
                },
                "start": {
                    "type": "integer", "minimum": 1,
                    "description": "line_range (required): first line, counting from 1."
                },
                "end": {
                    "type": "integer", "minimum": 1,
                    "description": "line_range: last line, inclusive (default and at most start+499)."
                },
                "offset": {
                    "type": "integer", "minimum": 0,
                    "description": "bytes: byte offset to start at (default 0)."
                },
                "limit_bytes": {
                    "type": "integer", "minimum": 1,
                    "description": "bytes: most bytes to return (default 65536, at most 1048576)."
                }
            },
            "additionalProperties": false
        })
    }
}

/// For `#[serde(deserialize_with)]` on an optional tool `mode` object: absent or null is `None`.
pub fn optional_mode_object<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<OutputParams>, D::Error> {
    #[derive(Deserialize)]
    #[serde(transparent)]
    struct Present(#[serde(with = "ModeObject")] OutputParams);
    Ok(Option::<Present>::deserialize(deserializer)?.map(|Present(params)| params))
}

/// The tool's wire form of [`OutputParams`]: serde needs the fields restated to rename one and
/// refuse unknown keys; the error messages name it as they always have.
#[derive(Deserialize)]
#[serde(
    remote = "OutputParams",
    rename = "OutputMode",
    expecting = "struct OutputMode",
    deny_unknown_fields
)]
struct ModeObject {
    #[serde(rename = "kind")]
    mode: Option<String>,
    lines: Option<usize>,
    pattern: Option<String>,
    max_matches: Option<usize>,
    start: Option<usize>,
    end: Option<usize>,
    offset: Option<u64>,
    limit_bytes: Option<usize>,
}

impl TryFrom<OutputParams> for OutputQuery {
    type Error = QueryError;

    fn try_from(params: OutputParams) -> Result<Self, Self::Error> {
        params.to_query()
    }
}

fn truncate_chars(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// Short constructors of each query, for the tests of reading and of parsing.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::OutputQuery;

    pub(crate) fn head(lines: usize) -> OutputQuery {
        OutputQuery::Head { lines }
    }
    pub(crate) fn tail_q(lines: usize) -> OutputQuery {
        OutputQuery::Tail { lines }
    }
    pub(crate) fn grep_q(pattern: &str, max_matches: usize) -> OutputQuery {
        OutputQuery::Grep {
            pattern: pattern.into(),
            max_matches,
        }
    }
    pub(crate) fn range(start: usize, end: usize) -> OutputQuery {
        OutputQuery::LineRange { start, end }
    }
    pub(crate) fn bytes_q(offset: u64, limit: usize) -> OutputQuery {
        OutputQuery::Bytes { offset, limit }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    /// Parameters naming `mode` and nothing else.
    fn mode(mode: &str) -> OutputParams {
        OutputParams {
            mode: Some(mode.into()),
            ..OutputParams::default()
        }
    }

    /// The tool's `mode` object as the tool reads it.
    fn mode_object(value: Value) -> Result<OutputParams, serde_json::Error> {
        OutputParams::deserialize_mode_object(value)
    }

    #[test]
    fn to_query_applies_defaults() {
        assert_eq!(OutputParams::default().to_query().unwrap(), head(50));
        assert_eq!(mode("head").to_query().unwrap(), head(50));
        assert_eq!(mode("tail").to_query().unwrap(), tail_q(50));
        assert_eq!(mode("bytes").to_query().unwrap(), bytes_q(0, 65_536));
        let grep = OutputParams {
            pattern: Some("x".into()),
            ..mode("grep")
        };
        assert_eq!(grep.to_query().unwrap(), grep_q("x", 20));
        let open = OutputParams {
            start: Some(7),
            ..mode("line_range")
        };
        assert_eq!(open.to_query().unwrap(), range(7, 506));
        // Parameters of other modes are ignored.
        let q = OutputParams {
            mode: Some("tail".into()),
            lines: Some(3),
            pattern: Some("x".into()),
            max_matches: Some(1),
            start: Some(1),
            end: Some(2),
            offset: Some(3),
            limit_bytes: Some(4),
        };
        assert_eq!(q.to_query().unwrap(), tail_q(3));
    }

    #[test]
    fn to_query_clamps_values_over_the_maximum() {
        let q = OutputParams {
            lines: Some(10_000),
            ..mode("head")
        };
        assert_eq!(q.to_query().unwrap(), head(500));
        let q = OutputParams {
            lines: Some(501),
            ..mode("tail")
        };
        assert_eq!(q.to_query().unwrap(), tail_q(500));
        let q = OutputParams {
            pattern: Some("p".into()),
            max_matches: Some(1000),
            ..mode("grep")
        };
        assert_eq!(q.to_query().unwrap(), grep_q("p", 100));
        let q = OutputParams {
            offset: Some(5),
            limit_bytes: Some(1 << 30),
            ..mode("bytes")
        };
        assert_eq!(q.to_query().unwrap(), bytes_q(5, 1_048_576));
        // A long range is kept as asked: reading cuts it and reports `truncated`.
        let q = OutputParams {
            start: Some(1),
            end: Some(10_000),
            ..mode("line_range")
        };
        assert_eq!(q.to_query().unwrap(), range(1, 10_000));
    }

    #[test]
    fn a_zero_is_refused_even_where_the_mode_ignores_the_parameter() {
        let err = |params: OutputParams| params.to_query().unwrap_err();
        assert_eq!(
            err(OutputParams {
                start: Some(0),
                ..mode("head")
            }),
            QueryError::Zero("start")
        );
        assert_eq!(
            err(OutputParams {
                limit_bytes: Some(0),
                ..OutputParams::default()
            }),
            QueryError::Zero("limit_bytes")
        );
        // Other values of other modes stay ignored.
        let q = OutputParams {
            start: Some(9),
            end: Some(2),
            ..mode("tail")
        };
        assert_eq!(q.to_query().unwrap(), tail_q(50));
    }

    #[test]
    fn to_query_refuses_missing_and_invalid_values() {
        let err = |params: OutputParams| params.to_query().unwrap_err();
        let unknown = err(mode("middle"));
        assert_eq!(unknown, QueryError::UnknownMode("middle".into()));
        assert!(
            unknown
                .to_string()
                .contains("head, tail, grep, line_range, bytes")
        );
        assert_eq!(err(mode("grep")), QueryError::MissingPattern);
        assert_eq!(
            err(OutputParams {
                pattern: Some(String::new()),
                ..mode("grep")
            }),
            QueryError::MissingPattern
        );
        assert_eq!(
            err(OutputParams {
                pattern: Some("x".into()),
                max_matches: Some(0),
                ..mode("grep")
            }),
            QueryError::Zero("max_matches")
        );
        assert_eq!(
            err(OutputParams {
                end: Some(3),
                ..mode("line_range")
            }),
            QueryError::MissingStart
        );
        assert_eq!(
            err(OutputParams {
                start: Some(0),
                end: Some(3),
                ..mode("line_range")
            }),
            QueryError::Zero("start")
        );
        assert_eq!(
            err(OutputParams {
                start: Some(5),
                end: Some(4),
                ..mode("line_range")
            }),
            QueryError::EndBeforeStart { start: 5, end: 4 }
        );
        assert_eq!(
            err(OutputParams {
                lines: Some(0),
                ..mode("head")
            }),
            QueryError::Zero("lines")
        );
        assert_eq!(
            err(OutputParams {
                lines: Some(0),
                ..mode("tail")
            }),
            QueryError::Zero("lines")
        );
        assert_eq!(
            err(OutputParams {
                limit_bytes: Some(0),
                ..mode("bytes")
            }),
            QueryError::Zero("limit_bytes")
        );
        assert_eq!(
            QueryError::Zero("lines").to_string(),
            "`lines` must be at least 1"
        );
        assert!(
            QueryError::MissingPattern
                .to_string()
                .contains("not a regex")
        );
    }

    #[test]
    fn the_mode_object_deserialises_into_the_same_queries() {
        let mode = |value: Value| mode_object(value).unwrap();
        assert_eq!(
            mode(json!({"kind": "tail", "lines": 5}))
                .to_query()
                .unwrap(),
            tail_q(5)
        );
        assert_eq!(mode(json!({})).to_query().unwrap(), head(50));
        assert_eq!(
            OutputQuery::try_from(mode(
                json!({"kind": "grep", "pattern": "E", "max_matches": 500})
            ))
            .unwrap(),
            grep_q("E", 100)
        );
        assert_eq!(
            mode(json!({"kind": "bytes", "offset": 10}))
                .to_query()
                .unwrap(),
            bytes_q(10, 65_536)
        );
        assert_eq!(
            mode(json!({"kind": "line_range", "start": 2, "end": 3}))
                .to_query()
                .unwrap(),
            range(2, 3)
        );
        assert_eq!(
            mode(json!({"kind": "grep"})).to_query().unwrap_err(),
            QueryError::MissingPattern
        );
        assert!(mode_object(json!({"kind": "head", "count": 3})).is_err());
        assert!(mode_object(json!({"lines": -1})).is_err());
    }

    #[test]
    fn the_mode_schema_accepts_what_the_mode_object_reads() {
        let validator = jsonschema::validator_for(&OutputParams::mode_object_schema()).unwrap();
        for ok in [
            json!({}),
            json!({"kind": "tail", "lines": 5000}),
            json!({"kind": "grep", "pattern": "x", "max_matches": 3}),
            json!({"kind": "line_range", "start": 1, "end": 9}),
            json!({"kind": "bytes", "offset": 0, "limit_bytes": 10}),
        ] {
            assert!(validator.is_valid(&ok), "{ok}");
            mode_object(ok).unwrap();
        }
        for bad in [
            json!({"kind": "middle"}),
            json!({"kind": "head", "count": 3}),
            json!({"lines": 0}),
        ] {
            assert!(!validator.is_valid(&bad), "{bad}");
        }
        let schema = OutputParams::mode_object_schema();
        for (name, prop) in schema["properties"].as_object().unwrap() {
            assert!(prop["description"].is_string(), "{name}");
        }
    }

    #[test]
    fn flat_params_read_like_the_rest_query() {
        let params: OutputParams =
            serde_json::from_value(json!({"mode": "line_range", "start": 4, "task_id": "t"}))
                .unwrap();
        assert_eq!(params.to_query().unwrap(), range(4, 503));
        assert_eq!(OutputParams::default().to_query().unwrap(), head(50));
    }

    #[test]
    fn each_door_keeps_its_own_key_for_the_mode() {
        // The flat form ignores `kind`; the mode object refuses `mode`.
        let flat: OutputParams = serde_json::from_value(json!({"kind": "tail"})).unwrap();
        assert_eq!(flat, OutputParams::default());
        let err = mode_object(json!({"mode": "tail"}))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("unknown field `mode`, expected one of `kind`"),
            "{err}"
        );
        let err = mode_object(json!("tail")).unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid type: string \"tail\", expected struct OutputMode"
        );
    }

    #[test]
    fn an_absent_or_null_mode_object_is_none() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Args {
            #[serde(default, deserialize_with = "optional_mode_object")]
            mode: Option<OutputParams>,
        }
        let read = |value: Value| Args::deserialize(&value).map(|args| args.mode);
        assert_eq!(read(json!({})).unwrap(), None);
        assert_eq!(read(json!({"mode": null})).unwrap(), None);
        assert_eq!(
            read(json!({"mode": {"kind": "tail", "lines": 2}})).unwrap(),
            Some(OutputParams {
                lines: Some(2),
                ..mode("tail")
            })
        );
        let err = read(json!({"mode": {"kind": "tail", "count": 2}})).unwrap_err();
        assert!(
            err.to_string().starts_with("unknown field `count`"),
            "{err}"
        );
    }
}
