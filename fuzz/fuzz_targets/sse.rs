//! The model stream's SSE parser: the events of a stream never depend on how it was cut into
//! chunks, and no input makes it panic.
#![no_main]

use agentd::llm::openai::sse::SseParser;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the chunk sizes; the rest is the stream.
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let whole = SseParser::default().push(stream);
    let mut parser = SseParser::default();
    let mut chunked = Vec::new();
    let mut failed = false;
    let step = usize::from(cut % 17) + 1;
    let mut at = 0;
    let mut round = 0;
    while at < stream.len() {
        // Sizes vary from chunk to chunk: 1..=step, then 1 again.
        let size = (round % step) + 1;
        let end = (at + size).min(stream.len());
        match parser.push(&stream[at..end]) {
            Ok(events) => chunked.extend(events),
            Err(_) => {
                failed = true;
                break;
            }
        }
        at = end;
        round += 1;
    }
    match whole {
        Ok(events) => {
            assert!(!failed, "chunked parsing failed where whole parsing did not");
            assert_eq!(events, chunked);
        }
        Err(_) => assert!(failed, "whole parsing failed where chunked parsing did not"),
    }
});
