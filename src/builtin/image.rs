//! view_image, which shows the model an image of the workspace, and image_generation: part of
//! the coding-tool contract, with no backend on this server, so every call answers the typed
//! `unsupported` error instead of pretending.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::parse_args;
use crate::llm::ImageData;
use crate::tools::workspace::Workspace;
use crate::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult};

/// Shows the model a PNG, JPEG, GIF or WebP file of the workspace.
pub struct ViewImage {
    workspace: Arc<Workspace>,
}

impl ViewImage {
    /// A view_image bound to `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ViewArgs {
    path: String,
}

#[async_trait]
impl Tool for ViewImage {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "view_image",
                "Look at an image file of the workspace (PNG, JPEG, GIF or WebP, at most 5 MiB): \
                 a screenshot, a rendered plot, a diagram. The image is shown to you right after \
                 the tool results, when the model in use takes images.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "Image path relative to the workspace root."}
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
Effects::NONE,
            )
            .groups(&["fs"])
            .tags(&["fs"])
        });
        &META
    }

    async fn call(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: ViewArgs = parse_args(&self.meta().name, args)?;
        let rel = self.workspace.resolve(&args.path)?;
        let bytes = self.workspace.read(&rel, ImageData::MAX_BYTES as u64)?;
        let image = ImageData::from_bytes(&bytes).map_err(|problem| {
            ToolError::model("invalid_input", format!("{}: {problem}", args.path))
        })?;
        let mut result = ToolResult::ok(format!(
            "{}: {}, {} bytes; the image follows the tool results",
            args.path,
            image.mime,
            bytes.len()
        ));
        result.images.push(image);
        Ok(result)
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }
}

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
Effects::NONE,
            )
            .contract()
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

    use crate::llm::PIXEL_PNG;

    #[tokio::test]
    async fn view_image_hands_the_model_the_image_and_refuses_other_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("shot.png"), PIXEL_PNG).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not an image").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("link.png")).unwrap();
        let tool = ViewImage::new(Workspace::new(dir.path()));
        let ctx = ToolContext::detached(dir.path());
        let result = tool.call(&ctx, &json!({"path": "shot.png"})).await.unwrap();
        assert!(result.output.contains("image/png"), "{}", result.output);
        assert_eq!(result.images.len(), 1);
        assert_eq!(result.images[0].mime, "image/png");
        let back = ImageData::from_base64("image/png", &result.images[0].data).unwrap();
        assert_eq!(back, result.images[0]);
        for path in ["notes.txt", "link.png", "../x.png", "missing.png"] {
            let err = tool.call(&ctx, &json!({"path": path})).await;
            assert!(err.is_err(), "{path} was shown");
        }
        // The image stays out of the serialised result, so it never lands in an event.
        let wire = serde_json::to_string(&result).unwrap();
        assert!(!wire.contains(&result.images[0].data));
    }

    #[test]
    fn inline_images_must_be_what_they_claim_and_small_enough() {
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD.encode(PIXEL_PNG);
        assert!(ImageData::from_base64("image/png", &data).is_ok());
        let err = ImageData::from_base64("image/jpeg", &data)
            .unwrap_err()
            .to_string();
        assert!(err.contains("image/png"), "{err}");
        let err = ImageData::from_base64("image/svg+xml", &data)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not one of image/png, image/jpeg, image/gif, image/webp"),
            "{err}"
        );
        assert!(ImageData::from_base64("image/png", "not base64!").is_err());
        let huge = "A".repeat(ImageData::MAX_BYTES / 3 * 4 + 64);
        let err = ImageData::from_base64("image/png", &huge)
            .unwrap_err()
            .to_string();
        assert!(err.contains("over the limit"), "{err}");
    }

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
