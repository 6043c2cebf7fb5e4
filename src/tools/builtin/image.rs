//! image_generation: part of the coding-tool contract, with no backend on this server, so every
//! call answers the typed `unsupported` error instead of pretending.

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::tools::{Tool, ToolError, ToolResult};

/// Always answers `unsupported`: no image generation backend is configured here.
#[derive(Debug, Default)]
pub struct ImageGeneration;

#[async_trait]
impl Tool for ImageGeneration {
    fn name(&self) -> &str {
        "image_generation"
    }

    fn description(&self) -> &str {
        "Generate an image from a text prompt. This server has no image generation backend: \
         the call always answers an `unsupported` error, so describe the image in text instead."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "description": "What the image should show."},
                "size": {"type": "string", "description": "Requested size such as 1024x1024."}
            },
            "required": ["prompt"],
            "additionalProperties": false
        })
    }

    fn tags(&self) -> &[&str] {
        &["meta"]
    }

    async fn execute(&self, _args: &Value) -> Result<ToolResult, ToolError> {
        Err(ToolError::unsupported(
            self.name(),
            "no image generation backend is configured on this server",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_call_is_unsupported() {
        let err = ImageGeneration
            .execute(&json!({"prompt": "a cat"}))
            .await
            .unwrap_err();
        match err {
            ToolError::Model { kind, message } => {
                assert_eq!(kind, "unsupported");
                assert!(message.contains("image_generation"), "{message}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
