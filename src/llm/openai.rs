//! The provider for OpenAI-compatible chat completions endpoints.
