//! The Responses API adapter against a scripted server speaking its documented stream.
