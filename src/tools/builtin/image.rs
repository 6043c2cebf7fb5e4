//! image_generation: part of the coding-tool contract, with no backend on this server, so every
//! call answers the typed `unsupported` error instead of pretending.

use std::sync::LazyLock;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::tools::{Tool, ToolContext, ToolError, ToolMeta, ToolResult};

/// Always answers `unsupported`: no image generation backend is configured here.
#[derive(Debug, Default)]
pub struct ImageGeneration;

#[async_trait]
impl Tool for ImageGeneration {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "image_generation",
                "Generate an image from a text prompt. This server has no image generation \
                 backend: the call always answers an `unsupported` error, so describe the image in \
                 text instead.",
                json!({
                    "type": "object",
                    "properties": {
                        "prompt": {"type": "string", "description": "What the image should show."},
                        "size": {"type": "string", "description": "Requested size such as 1024x1024."}
                    },
                    "required": ["prompt"],
                    "additionalProperties": false
                }),
            )
            .tags(&["meta"])
        });
        &META
    }

    async fn call(&self, _ctx: &ToolContext, _args: &Value) -> Result<ToolResult, ToolError> {
        Err(ToolError::unsupported(
            &self.meta().name,
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
            .call(&ToolContext::detached("."), &json!({"prompt": "a cat"}))
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
