//! The Anthropic Messages adapter against a scripted server speaking its documented stream.
