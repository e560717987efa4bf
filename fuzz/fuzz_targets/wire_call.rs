#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crane_fuzz::wire_call(data));
