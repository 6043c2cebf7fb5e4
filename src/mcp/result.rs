//! An MCP `tools/call` result as a [`ToolResult`]: text content becomes the output,
//! `structuredContent` the structured metadata, images, audio and resources are described in
//! the output (typed in the metadata, never dropped), and `isError` an unsuccessful result.

use serde_json::{Value, json};

use crate::tools::ToolResult;

/// The result of one call, read from the MCP result object (`content`, `structuredContent`,
/// `isError`) as the protocol defines it.
pub fn from_mcp(result: &Value) -> ToolResult {
    let mut output = String::new();
    let mut parts = Vec::new();
    for block in result["content"].as_array().into_iter().flatten() {
        let kind = block["type"].as_str().unwrap_or("unknown");
        let line = match kind {
            "text" => block["text"].as_str().unwrap_or_default().to_string(),
            "image" | "audio" => {
                let bytes = block["data"].as_str().map_or(0, base64_len);
                parts.push(json!({
                    "type": kind,
                    "mime_type": block["mimeType"],
                    "bytes": bytes,
                }));
                format!(
                    "[{kind}: {}, {bytes} bytes]",
                    block["mimeType"].as_str().unwrap_or("unknown type")
                )
            }
            "resource" => {
                let resource = &block["resource"];
                parts.push(json!({
                    "type": "resource",
                    "uri": resource["uri"],
                    "mime_type": resource["mimeType"],
                }));
                match resource["text"].as_str() {
                    Some(text) => format!(
                        "[resource {}]\n{text}",
                        resource["uri"].as_str().unwrap_or_default()
                    ),
                    None => format!(
                        "[resource {}: {}, binary]",
                        resource["uri"].as_str().unwrap_or_default(),
                        resource["mimeType"].as_str().unwrap_or("unknown type")
                    ),
                }
            }
            "resource_link" => {
                parts.push(json!({
                    "type": "resource_link",
                    "uri": block["uri"],
                    "name": block["name"],
                }));
                format!(
                    "[resource link {}: {}]",
                    block["name"].as_str().unwrap_or_default(),
                    block["uri"].as_str().unwrap_or_default()
                )
            }
            other => {
                parts.push(json!({ "type": other }));
                format!("[{other} content]")
            }
        };
        if !output.is_empty() {
            output.push('\n');
        }
        output.push_str(&line);
    }
    let success = result["isError"] != true;
    let mut metadata = serde_json::Map::new();
    if let Some(structured) = result.get("structuredContent") {
        metadata.insert("structured_content".into(), structured.clone());
    }
    if !parts.is_empty() {
        metadata.insert("content".into(), Value::Array(parts));
    }
    if !success {
        metadata.insert("error".into(), json!({"kind": "mcp_tool_error"}));
    }
    let result = if success {
        ToolResult::ok(output)
    } else {
        ToolResult::failure(output)
    };
    if metadata.is_empty() {
        result
    } else {
        result.with_metadata(Value::Object(metadata))
    }
}

/// The decoded size of base64 text, without decoding it.
fn base64_len(text: &str) -> usize {
    let padding = text.bytes().rev().take_while(|&b| b == b'=').count();
    (text.len() / 4 * 3).saturating_sub(padding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_becomes_the_output_and_structured_content_the_metadata() {
        let result = from_mcp(&json!({
            "content": [{"type": "text", "text": "3"}, {"type": "text", "text": "done"}],
            "structuredContent": {"sum": 3},
        }));
        assert!(result.success);
        assert_eq!(result.output, "3\ndone");
        assert_eq!(
            result.structured_metadata,
            Some(json!({"structured_content": {"sum": 3}}))
        );
    }

    #[test]
    fn images_and_resources_are_described_not_dropped() {
        let result = from_mcp(&json!({
            "content": [
                {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "test://r/1", "mimeType": "text/plain", "text": "hi"}},
                {"type": "resource_link", "uri": "test://r/2", "name": "two"},
            ],
        }));
        assert_eq!(
            result.output,
            "[image: image/png, 5 bytes]\n[resource test://r/1]\nhi\n[resource link two: test://r/2]"
        );
        let parts = &result.structured_metadata.unwrap()["content"];
        assert_eq!(
            parts[0],
            json!({"type": "image", "mime_type": "image/png", "bytes": 5})
        );
        assert_eq!(parts[1]["uri"], "test://r/1");
        assert_eq!(parts[2]["type"], "resource_link");
    }

    #[test]
    fn is_error_is_an_unsuccessful_result() {
        let result =
            from_mcp(&json!({"content": [{"type": "text", "text": "no"}], "isError": true}));
        assert!(!result.success);
        assert_eq!(result.output, "no");
        assert_eq!(
            result.structured_metadata.unwrap()["error"]["kind"],
            "mcp_tool_error"
        );
    }
}
