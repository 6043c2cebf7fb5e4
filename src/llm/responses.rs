//! The provider for OpenAI's Responses API (`POST /responses`).
