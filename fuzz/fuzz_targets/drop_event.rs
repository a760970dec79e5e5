//! The `drop_event` target: [`fuzz::drop_event`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::drop_event(data));
